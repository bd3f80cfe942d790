"""Drafting cost by draft depth: one draft forward per step (P-EAGLE, DFlash) against one per depth (EAGLE-3).

    python eval/bench_depth.py                                    # shipped eagle3, peagle, dflash (about 6 min)
    python eval/bench_depth.py --depths 1,2,4,8 --prompts 4 --peagle runs/peagle/final --dflash runs/dflash/final

Every drafter drafts a chain of exactly D tokens every step (budget "fixed", top_k 1), so the rows differ
only in how the chain is drafted. Prompts are held-out code (or --jsonl FILE: one {"prompt": ...} a line);
for each prompt, every (drafter, depth) pair and plain decoding run one after another, greedy, so every
row is measured under the same machine load. Prints, per drafter and depth: drafting ms per step, the
share of the step spent drafting, tau (committed tokens per target forward) and the speedup over plain
decoding (tokens/s over plain's, median [min-max] over the prompts). Writes depth.json and depth.png (drafting
ms per step against depth) to --out. Timings assume an idle machine: the cores other work kept busy are printed
with them.
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
from draftkit.eval.noise import busy_elsewhere  # noqa: E402
from draftkit.eval.report import machine_line  # noqa: E402

DRAFTERS = ("eagle3", "peagle", "dflash")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--drafters", default=",".join(DRAFTERS),
                   help="comma list of drafters to compare (default: %(default)s); any drafter of draftkit's "
                        "registry that drafts chains works")
    p.add_argument("--depths", default="1,2,4,8", help="chain lengths to draft every step (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=4, help="held-out code prompts (default: %(default)s)")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt (default: %(default)s)")
    p.add_argument("--jsonl", default="", help="prompts from this file instead of held-out code, one "
                                              "{\"prompt\": ...} object a line (default: held-out code)")
    for name in DRAFTERS:
        p.add_argument(f"--{name}", default=None, metavar="DIR",
                       help=f"the {name} draft to load (default: the shipped one)")
    p.add_argument("--out", default="docs/results/depth", help="folder for depth.json and depth.png "
                                                               "(default: %(default)s)")
    args = p.parse_args(argv)
    try:
        args.depths = [int(d) for d in args.depths.split(",")]
    except ValueError:
        p.error(f"--depths: {args.depths!r} is not a comma list of integers")
    if not args.depths or min(args.depths) < 1:
        p.error(f"--depths: every depth must be >= 1, got {args.depths}")
    args.drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    bad = [d for d in args.drafters if d not in dk.DRAFTERS]
    if bad:
        p.error(f"--drafters: unknown {', '.join(bad)} (known: {', '.join(dk.DRAFTERS)})")
    if args.prompts < 1 or args.new_tokens < 1:
        p.error("--prompts and --new-tokens must be >= 1")
    if args.jsonl and not os.path.exists(args.jsonl):
        p.error(f"--jsonl: {args.jsonl} does not exist")
    return args


def load_prompts(args, tokenizer) -> list[list[int]]:
    if args.jsonl:
        from draftkit.eval.tasks import from_texts

        with open(args.jsonl) as fh:
            texts = [json.loads(line) for line in fh if line.strip()]
        tasks = from_texts(texts, tokenizer, args.prompts)
        return [p.ids for ps in tasks.values() for p in ps][:args.prompts]
    from draftkit.eval.tasks import build_tasks

    return [p.ids for p in build_tasks(tokenizer, ("code",), n=args.prompts)["code"]]


def run_once(target, ids, drafter, n: int) -> tuple[float, int, list]:
    t0 = time.perf_counter()
    out = dk.generate(target, torch.tensor(ids), drafter, max_new_tokens=n, budget="fixed", eos_token_id=[])
    return time.perf_counter() - t0, len(out.tokens), out.stats.decode_steps


def summarize(runs: list[tuple[float, int, list]], plain: list[tuple[float, int, list]]) -> dict:
    steps = [s for _, _, st in runs for s in st]
    draft = sum(s.draft_s for s in steps)
    total = draft + sum(s.verify_s for s in steps)
    ratios = [(tok / sec) / (ptok / psec) for (sec, tok, _), (psec, ptok, _) in zip(runs, plain)]
    return {"draft_ms": 1e3 * draft / len(steps), "draft_share": draft / total if total else 0.0,
            "tau": sum(s.committed for s in steps) / len(steps), "speedup": statistics.median(ratios),
            "speedup_min": min(ratios), "speedup_max": max(ratios)}


def _load(x: float | None) -> str:
    return "unknown" if x is None else f"{x:.2f}"


def plot(table: dict, depths: list[int], path: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, rows in table.items():
        ax.plot(depths, [rows[str(d)]["draft_ms"] for d in depths], marker="o", label=name)
        bx.plot(depths, [rows[str(d)]["speedup"] for d in depths], marker="o", label=name)
    ax.set(xlabel="draft depth (chain length)", ylabel="drafting ms per step", xticks=depths)
    bx.set(xlabel="draft depth (chain length)", ylabel="speedup over plain decoding", xticks=depths)
    bx.axhline(1.0, color="grey", lw=0.8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv=None) -> int:
    args = parse(argv)
    from draftkit.models import load_target

    target, tok = load_target()
    prompts = load_prompts(args, tok)
    drafters = {(name, d): dk.make_drafter(name, target, getattr(args, name, None), max_depth=d, max_nodes=d,
                                           top_k=1) for name in args.drafters for d in args.depths}
    load_before = busy_elsewhere()
    run_once(target, prompts[0][:32], None, 8)  # warm-up (allocations), untimed
    for dr in drafters.values():
        run_once(target, prompts[0][:32], dr, 8)
    plain, runs = [], {k: [] for k in drafters}
    from tqdm import tqdm

    with tqdm(total=len(prompts) * (len(drafters) + 1), desc="depth benchmark") as bar:
        for ids in prompts:  # interleaved: every row of a prompt under the same load
            plain.append(run_once(target, ids, None, args.new_tokens))
            bar.update(1)
            for key, dr in drafters.items():
                runs[key].append(run_once(target, ids, dr, args.new_tokens))
                bar.update(1)
    table = {name: {str(d): summarize(runs[(name, d)], plain) for d in args.depths} for name in args.drafters}
    plain_ms = 1e3 * statistics.median(sec / max(1, len(st)) for sec, _, st in plain)
    load_after = busy_elsewhere()
    print(f"machine: {machine_line()}; "
          f"other processes kept {_load(load_before)} cores busy before, {_load(load_after)} after "
          "(timings assume an idle machine)")
    print(f"plain decoding: {plain_ms:.1f} ms per token; {len(prompts)} prompts x {args.new_tokens} tokens, greedy, "
          "chains of exactly D tokens every step")
    print(f"{'drafter':<8} {'D':>2} {'draft ms':>9} {'draft%':>7} {'tau':>5} {'speedup':>20}")
    for name in args.drafters:
        for d in args.depths:
            r = table[name][str(d)]
            print(f"{name:<8} {d:>2} {r['draft_ms']:>9.2f} {100 * r['draft_share']:>6.0f}% {r['tau']:>5.2f} "
                  f"{r['speedup']:>6.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}]")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "depth.json"), "w") as fh:
        json.dump({"depths": args.depths, "plain_ms_per_token": plain_ms,
                   "busy_cores_elsewhere": [load_before, load_after],
                   "prompts": len(prompts), "new_tokens": args.new_tokens, "rows": table}, fh, indent=1)
    png = plot(table, args.depths, os.path.join(args.out, "depth.png"))
    print(f"wrote {os.path.join(args.out, 'depth.json')}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
