"""Compare drafters side by side on the same prompts, machine and run.

    python eval/compare.py --drafters medusa,eagle,lookahead
    python eval/compare.py --drafters all --json results.json --plots plots/
    python eval/compare.py --quick                       # a smoke run of about a minute

With no model flags it runs on the shipped default models (zoo/). Plain decoding is
always measured as the baseline, interleaved with every method, and transformers'
own `generate` paths (assisted generation, prompt lookup) run as peer rows.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import draftkit as dk  # noqa: E402
from eval.measure import Method, lossless_check, measure, median_spread, predicted_speedup, speedups  # noqa: E402
from eval.peers import hf_assisted, hf_prompt_lookup  # noqa: E402
from eval.report import log_wandb, plot_results, print_table  # noqa: E402
from eval.tasks import TASKS, build_tasks, load_jsonl  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafters", default="all",
                    help="comma list of standalone, medusa, eagle, eagle-chain (EAGLE drafting a chain of --k), "
                         "lookahead, or 'all' (all five)")
    ap.add_argument("--target", help="target: HF model id or path (default: the shipped target)")
    ap.add_argument("--draft", help="standalone draft model: HF id or path (default: the shipped draft)")
    ap.add_argument("--medusa", help="saved Medusa heads folder (default: the shipped heads)")
    ap.add_argument("--eagle", help="saved EAGLE draft folder (default: the shipped EAGLE draft)")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"comma list of {', '.join(TASKS)}")
    ap.add_argument("--prompts-file", help="JSONL of prompts ({'prompt': ...} or Spec-Bench 'turns'); replaces --tasks")
    ap.add_argument("--prompts", type=int, default=6, help="prompts per task")
    ap.add_argument("--prompt-len", type=int, default=192, help="prompt length in tokens for the built-in tasks")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats; speedup is their median")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy; > 0 samples with fixed seeds (and generates max-new-tokens, ignoring EOS)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for p (sampling only)")
    ap.add_argument("--seed", type=int, default=0, help="seed for prompts and sampling")
    ap.add_argument("--k", type=int, default=4, help="standalone draft chain length (also the assisted peer's)")
    ap.add_argument("--eagle-depth", type=int, default=4, help="EAGLE-2 dynamic tree depth")
    ap.add_argument("--eagle-top-k", type=int, default=2, help="EAGLE-2 children expanded per frontier node")
    ap.add_argument("--eagle-total-tokens", type=int, default=8, help="EAGLE-2 tree size (nodes)")
    ap.add_argument("--medusa-tree-size", type=int, default=8,
                    help="Medusa tree size, rebuilt from the saved head accuracies (0: the saved tree)")
    ap.add_argument("--no-peers", action="store_true", help="skip transformers' generate peer rows")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 prompts of 2 tasks, 32 tokens, 1 repeat")
    ap.add_argument("--json", help="write every figure to this JSON file")
    ap.add_argument("--plots", help="write PNG plots into this folder")
    ap.add_argument("--wandb", action="store_true", help="log the table to W&B (offline unless WANDB_MODE is set)")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_new_tokens, args.repeats = 2, 32, 1
        args.tasks = "code,copy"
    choices = (*dk.DRAFTERS, "eagle-chain")
    names = choices if args.drafters == "all" else tuple(d.strip() for d in args.drafters.split(",") if d.strip())
    bad = [d for d in names if d not in choices]
    if bad:
        ap.error(f"unknown drafter(s) {bad}; choose from {', '.join(choices)} or all")
    args.drafter_names = names
    return args


def machine() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({platform.processor() or platform.machine()})"
    return (f"{dev}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads, "
            f"Python {platform.python_version()}")


def build_methods(args, target, tokenizer):
    """(method, its peer method or None) in table order."""
    n, eos = args.max_new_tokens, None
    sampling = dk.Sampling(temperature=args.temperature, top_p=args.top_p)
    seed_counter = iter(range(10**9))

    def ours(drafter):
        def run(ids):
            # sampled runs differ in length per method, so they ignore EOS to time equal work
            out = dk.generate(target, ids, drafter, max_new_tokens=n, sampling=sampling,
                              seed=args.seed + next(seed_counter), eos_token_id=[] if args.temperature > 0 else None)
            return out.tokens.tolist(), out.stats
        return run

    def params(d):
        mods = [getattr(d, a) for a in ("model", "heads", "draft") if isinstance(getattr(d, a, None), torch.nn.Module)]
        return sum(p.numel() for m in mods for p in m.parameters())

    methods = [Method("plain", ours(None))]
    peers = []
    for name in args.drafter_names:
        flags, path = {}, None
        if name == "standalone":
            flags, path = {"k": args.k}, args.draft
        elif name == "eagle":
            flags = {"depth": args.eagle_depth, "top_k": args.eagle_top_k, "total_tokens": args.eagle_total_tokens}
            path = args.eagle
        elif name == "eagle-chain":
            flags, path = {"depth": args.k, "chain": True}, args.eagle
        elif name == "medusa":
            flags = {"tree_size": args.medusa_tree_size} if args.medusa_tree_size else {}
            path = args.medusa
        drafter = dk.make_drafter(name.split("-")[0], target, path, tokenizer=tokenizer, **flags)
        methods.append(Method(name, ours(drafter), draft_params=params(drafter)))
        if args.no_peers or args.temperature > 0:
            continue
        if name == "standalone":
            peers.append(Method(f"hf assisted K={args.k}", hf_assisted(target, drafter.model, args.k, n, eos), "peer"))
        if name == "lookahead":
            peers.append(Method("hf prompt lookup", hf_prompt_lookup(target, 10, n, eos), "peer"))
    return methods + peers


def rows_for_task(task, res, methods, args):
    base = res["plain"]
    plain_step_s = statistics.median(s / t for s, t in zip(base.seconds, base.tokens))
    rows = []
    for m in methods:
        r = res[m.name]
        sp, lo, hi = median_spread(speedups(r, base))
        st = r.stats
        steps = st.decode_steps
        depth = statistics.mean(s.depth for s in steps) if steps else 0
        phi = (st.draft_s / len(steps) / depth / plain_step_s) if steps and depth else None
        same, total = lossless_check(r, base)
        row = {
            "drafter": m.name, "task": task, "kind": "baseline" if m.name == "plain" else m.kind,
            "tau": st.tau if steps else (1.0 if m.name == "plain" else None),
            "alpha": st.alpha if steps else None,
            "acceptance_by_depth": st.acceptance_by_depth() if steps else [],
            "mean_tree_size": st.mean_tree_size if steps else None,
            "tokens_per_s": statistics.median(r.tokens_per_s), "speedup": sp, "speedup_min": lo, "speedup_max": hi,
            "draft_share": st.draft_s / (st.draft_s + st.verify_s) if steps else None,
            "phi": phi,
            "predicted_speedup": predicted_speedup(st.alpha, round(depth), phi) if phi is not None else None,
            "peak_rss_mb": r.peak_rss_mb, "draft_params": m.draft_params,
            "lossless": (same == total) if args.temperature == 0 else None,
            "identical_outputs": f"{same}/{total}" if args.temperature == 0 else None,
        }
        rows.append(row)
    return rows


def main(argv=None):
    args = parse_args(argv)
    target, tok = dk.load_target(args.target)
    if args.prompts_file:
        tasks = load_jsonl(args.prompts_file, tok, args.prompts)
    else:
        tasks = build_tasks(tok, [t.strip() for t in args.tasks.split(",")], args.prompts, args.prompt_len, args.seed)
    methods = build_methods(args, target, tok)
    total = sum(len(p) for p in tasks.values()) * len(methods) * args.repeats
    rows = []
    with tqdm(total=total, desc="compare", unit="run") as bar:
        for task, prompts in tasks.items():
            res = measure(methods, [p.ids for p in prompts], args.repeats, bar)
            rows += rows_for_task(task, res, methods, args)
    report = {"machine": machine(), "settings": {k: v for k, v in vars(args).items() if k != "drafter_names"},
              "target_params": sum(p.numel() for p in target.parameters()), "rows": rows}
    print_table(report)
    lossy = [r for r in rows if r["lossless"] is False]
    if lossy:
        print(f"\nWARNING: {len(lossy)} rows differ from plain greedy decoding: "
              + ", ".join(f"{r['drafter']}/{r['task']} ({r['identical_outputs']})" for r in lossy))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"wrote {args.json}")
    if args.plots:
        for path in plot_results(report, args.plots):
            print(f"wrote {path}")
    if args.wandb:
        log_wandb(report)
    return report


if __name__ == "__main__":
    main()
