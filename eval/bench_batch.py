"""Past one sequence: batched speculative decoding and speculative best-of-N, measured side by side.

    python eval/bench_batch.py                                  # default models, about 4 minutes on 2 cores
    python eval/bench_batch.py --drafters lookahead,eagle --batch-sizes 1,4,16 --best-of 1,4,16

Batches: for each batch size B, B held-out code prompts of unequal lengths decoded together
(verify/packed.py: one target forward per step for all rows, ragged acceptance), every drafter
against plain batched decoding of the same B, interleaved in one run; tokens/s, speedup and the
bytes each method holds (target KV, draft KV, tree buffers). Best-of-N: N sampled continuations of
one prompt sharing its KV, speculative against plain sampling; the KV saving measured against the
p / (p + l) the shared prefix predicts. Writes a JSON and a plot of speedup against batch size.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import draftkit as dk  # noqa: E402
from draftkit.eval.tasks import build_tasks  # noqa: E402
from draftkit.verify.packed import generate_packed  # noqa: E402


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"bench_batch.py: error: {flag} takes a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        raise SystemExit(f"bench_batch.py: error: {flag} needs integers >= 1, got {text!r}")
    return values


def run_batches(target, prompts, names, batch_sizes, n_new, repeats, budget, compile=False,
                make_lanes=None) -> list[dict]:
    """One row per (method, batch size), speedups against plain batched decoding of the same size. compile: every
    method's verify forward compiled (generate_packed). make_lanes(name, n): n lane drafters of a method (default:
    its shipped draft and default settings)."""
    from tqdm import tqdm

    make_lanes = make_lanes or (lambda name, n: dk.lane_drafters(name, target, n))
    pools = {name: make_lanes(name, max(batch_sizes)) for name in names}
    rows = []
    bar = tqdm(total=len(batch_sizes) * (repeats + 1) * (len(names) + 1), desc="batches", unit="run", delay=2)
    for b in batch_sizes:
        batch = prompts[:b]
        times = {name: [] for name in ("plain", *names)}
        outs = {}
        for rep in range(repeats + 1):  # the first round warms up (and lets each budget controller learn)
            for name in ("plain", *names):  # interleaved
                drafters = [dk.NoDrafter() for _ in batch] if name == "plain" else pools[name][:b]
                t0 = time.perf_counter()
                out = generate_packed(target, batch, drafters, n_new, eos_token_id=[], budget=budget, compile=compile)
                if rep:
                    times[name].append(time.perf_counter() - t0)
                outs[name] = out
                bar.update()
        base = statistics.median(times["plain"])
        for name in ("plain", *names):
            out = outs[name]
            tokens = sum(o.tokens.numel() for o in out.outputs)
            steps = [s for o in out.outputs for s in o.stats.decode_steps]
            rows.append({
                "drafter": name, "batch_size": b, "tokens_per_s": tokens / statistics.median(times[name]),
                "speedup": base / statistics.median(times[name]),
                "speedup_min": base / max(times[name]), "speedup_max": base / min(times[name]),
                "tau": sum(s.accepted + 1 for s in steps) / len(steps) if steps else 1.0,
                "identical_to_plain": sum(a.tokens.tolist() == p.tokens.tolist()
                                          for a, p in zip(out.outputs, outs["plain"].outputs)),
                "kv_bytes": {"target": out.kv_bytes_used, "target_allocated": out.kv_bytes,
                             "draft": out.draft_kv_bytes, "buffers": out.buffer_bytes}})
    bar.close()
    return rows


def run_best_of(target, prompt, names, ns, n_new, repeats, temperature) -> list[dict]:
    rows = []
    sampling = dk.Sampling(temperature=temperature)
    for n in ns:
        times = {name: [] for name in ("plain", *names)}
        res = {}
        lanes = {name: dk.lane_drafters(name, target, n) for name in names}
        for r in range(repeats + 1):  # the first round warms up
            for name in ("plain", *names):
                pool = iter(lanes.get(name, []))
                t0 = time.perf_counter()
                res[name] = dk.best_of_n(target, prompt, n, drafter=None if name == "plain" else (lambda: next(pool)),
                                         sampling=sampling, max_new_tokens=n_new, eos_token_id=[], seed=r)
                if r:
                    times[name].append(time.perf_counter() - t0)
        base = statistics.median(times["plain"])
        for name in ("plain", *names):
            out = res[name]
            p = len(prompt)
            lengths = [s.tokens.numel() for s in out.samples]
            mean_l = statistics.mean(lengths)
            rows.append({"drafter": name, "n": n, "speedup": base / statistics.median(times[name]),
                         "tokens_per_s": sum(lengths) / statistics.median(times[name]),
                         "kv_entries": out.kv_entries, "kv_entries_independent": out.kv_entries_independent,
                         "kv_saving": 1 - out.kv_entries / out.kv_entries_independent,
                         "kv_saving_predicted": (1 - 1 / n) * p / (p + mean_l - 1),
                         "best_reward": out.rewards[out.best]})
    return rows


def format_batches(rows) -> str:
    lines = [f"{'method':12} {'batch':>5} {'tok/s':>8} {'speedup':>8} {'tau':>5} {'same':>5} "
             f"{'target KV':>10} {'draft KV':>9} {'buffers':>8}"]
    for r in rows:
        kv = r["kv_bytes"]
        lines.append(f"{r['drafter']:12} {r['batch_size']:>5} {r['tokens_per_s']:8.1f} {r['speedup']:7.2f}x "
                     f"{r['tau']:5.2f} {r['identical_to_plain']:>2}/{r['batch_size']:<2} {kv['target'] / 2**20:9.2f}M "
                     f"{kv['draft'] / 2**20:8.2f}M {kv['buffers'] / 2**20:7.2f}M")
    return "\n".join(lines)


def plot(rows, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4))
    for name in dict.fromkeys(r["drafter"] for r in rows):
        rs = [r for r in rows if r["drafter"] == name]
        xs = [r["batch_size"] for r in rs]
        ys = [r["speedup"] for r in rs]
        err = [[y - r["speedup_min"] for y, r in zip(ys, rs)], [r["speedup_max"] - y for y, r in zip(ys, rs)]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("speedup over plain batched decoding")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafters", default="lookahead,eagle,standalone,medusa",
                    help="comma list of drafters (default: lookahead,eagle,standalone,medusa)")
    ap.add_argument("--batch-sizes", default="1,4,16", help="batch sizes (default: 1,4,16)")
    ap.add_argument("--best-of", default="1,4,16", help="N for best-of-N (default: 1,4,16)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="tokens per sequence (default: 48)")
    ap.add_argument("--prompt-len", type=int, default=128, help="prompt length in tokens (default: 128)")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats, median reported (default: 2)")
    ap.add_argument("--budget", choices=("auto", "fixed"), default="auto", help="draft budget policy (default: auto)")
    ap.add_argument("--temperature", type=float, default=0.8, help="best-of-N sampling temperature (default: 0.8)")
    ap.add_argument("--out", default="runs/bench_batch",
                    help="folder for the JSON and plot (default: runs/bench_batch)")
    args = ap.parse_args(argv)
    batch_sizes, ns = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.best_of, "--best-of")
    names = [d.strip() for d in args.drafters.split(",") if d.strip()]
    unknown = [d for d in names if d not in dk.DRAFTERS]
    if not names or unknown:
        raise SystemExit(f"bench_batch.py: error: --drafters: unknown {unknown or 'empty list'}; "
                         f"choose from {', '.join(dk.DRAFTERS)}")
    low = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
           if k in ("max_new_tokens", "prompt_len", "repeats", "temperature") and not v > 0]
    if low:
        raise SystemExit(f"bench_batch.py: error: {', '.join(low)}: must be positive")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise SystemExit(f"bench_batch.py: error: --out {args.out} is a file, not a folder")

    target, tok = dk.load_target()
    tasks = build_tasks(tok, ["code"], n=max(batch_sizes), length=args.prompt_len)["code"]
    # unequal lengths: every other prompt loses a quarter of its start
    prompts = [p.ids[(len(p.ids) // 4) * (i % 2):] for i, p in enumerate(tasks)]
    batch_rows = run_batches(target, prompts, names, batch_sizes, args.max_new_tokens, args.repeats, args.budget)
    print(f"\nbatched decoding, {args.max_new_tokens} new tokens per row, budget {args.budget}")
    print(format_batches(batch_rows))
    best_rows = run_best_of(target, prompts[0], names, ns, args.max_new_tokens, args.repeats, args.temperature)
    print(f"\nbest-of-N, one prompt of {len(prompts[0])} tokens, {args.max_new_tokens} tokens per sample, "
          f"temperature {args.temperature}")
    print(f"{'method':12} {'N':>3} {'tok/s':>8} {'speedup':>8} {'KV entries':>11} {'independent':>12} "
          f"{'saving':>7} {'p/(p+l) predicts':>17}")
    for r in best_rows:
        print(f"{r['drafter']:12} {r['n']:>3} {r['tokens_per_s']:8.1f} {r['speedup']:7.2f}x {r['kv_entries']:>11} "
              f"{r['kv_entries_independent']:>12} {100 * r['kv_saving']:6.1f}% {100 * r['kv_saving_predicted']:16.1f}%")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_batch.json"), "w") as fh:
        json.dump({"batches": batch_rows, "best_of_n": best_rows, "settings": vars(args),
                   "threads": torch.get_num_threads()}, fh, indent=2)
    plot([r for r in batch_rows if r["drafter"] != "plain"], os.path.join(args.out, "speedup_by_batch.png"))
    print(f"\nwrote {args.out}/bench_batch.json and speedup_by_batch.png")


if __name__ == "__main__":
    main()
