"""Benchmark of the suffix drafter against plain decoding, lookahead and prompt lookup,
interleaved in one run on the shipped default models (greedy). Prints figures; asserts nothing.

    python eval/bench_suffix.py                        # code + repeated, 2 to 3 minutes on 2 cores
    python eval/bench_suffix.py --tasks code,copy,repeated --hf --threads 1

Tasks: held-out code windows and copy prompts (eval.tasks.build_tasks) and the repeated-
requests stream (eval.repeated.build_repeated). Every method keeps ONE drafter object for a
task's prompts, run in order, so the suffix drafter's global cache carries earlier requests
into later ones (that is what `suffix` vs `suffix-noglobal` shows); each repeat starts from
fresh drafters, so repeats measure the same thing. Speedup = tokens/s over plain tokens/s
within a repeat (median, [min, max] over repeats); tau = committed tokens per target forward;
nodes = mean tree size; loop us/step = time per step outside the target forward (propose, tree
checks, update; plain's figure is the loop's own floor). Every method drafts at its own cap
each step (a fixed budget), so the rows compare the drafts, not the budget controller.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import draftkit as dk  # noqa: E402
from draftkit.drafters.lookahead import LookaheadDrafter  # noqa: E402
from draftkit.drafters.suffix import SuffixDrafter  # noqa: E402
from draftkit.eval.measure import Method, measure, median_spread, speedups  # noqa: E402
from draftkit.eval.repeated import build_repeated  # noqa: E402
from draftkit.eval.tasks import build_tasks  # noqa: E402
from draftkit.verify.budget import FixedBudget  # noqa: E402
from draftkit.verify.contract import Budget, DecodeState, NoDrafter, StepResult  # noqa: E402
from draftkit.verify.decode import generate  # noqa: E402
from draftkit.verify.stats import DecodeStats  # noqa: E402


def methods_for(target, prompts: list[list[int]], max_new: int, hf: bool) -> list[Method]:
    makers = {
        "plain": None,
        "lookahead": LookaheadDrafter,
        "prompt-lookup": lambda: LookaheadDrafter(window=0),
        "suffix": SuffixDrafter,
        "suffix-noglobal": lambda: SuffixDrafter(use_global=False),
    }

    def ours(make):
        held = {}

        def run(ids):
            if ids is prompts[0] or "d" not in held:  # a new repeat: fresh drafter, empty caches
                held["d"] = make() if make else None
            d = held["d"]  # every method at its own cap each step: the comparison is of the drafts
            out = generate(target, ids, d, max_new_tokens=max_new, eos_token_id=[],
                           budget=FixedBudget.of(d or NoDrafter()))
            return out.tokens.tolist(), out.stats
        return run

    methods = [Method(name=name, run=ours(make)) for name, make in makers.items()]
    if hf:
        from draftkit.eval.peers import hf_prompt_lookup
        methods.append(Method(name="hf prompt lookup", run=hf_prompt_lookup(target, 10, max_new, None), kind="peer"))
    return methods


def draft_cost(tok, context: int = 512, steps: int = 400) -> tuple[float, float, float]:
    """Microseconds per propose + update at a `context`-token context, replaying held-out code
    as if the target had written it (committed per step = the accepted draft + 1), and per
    indexed prompt token. No model runs: this is the drafter's own cost. Returns
    (median us per step, mean us per step, us per prompt token at reset)."""
    from draftkit.eval.tasks import held_out_texts

    code, _ = held_out_texts()
    text = max((tok(t)["input_ids"] for _, t in code), key=len)
    ids = torch.tensor(text)
    drafter = SuffixDrafter()
    t0 = time.perf_counter()
    drafter.reset(ids[:context])
    per_token = (time.perf_counter() - t0) / context * 1e6
    pos, times = context, []
    cap = drafter.budget_cap
    while len(times) < steps and pos + 1 < len(text):
        t0 = time.perf_counter()
        tree = drafter.propose(DecodeState(ids[:pos], context, Budget(cap.max_depth, cap.max_nodes), True))
        kids, toks = tree.children, tree.host_tokens  # the greedy walk against the real text
        acc, slot = [], 0
        while pos + len(acc) < len(text):
            nxt = [c for c in kids[slot] if toks[c - 1] == text[pos + len(acc)]]
            if not nxt:
                break
            slot = nxt[0]
            acc.append(slot - 1)
        new = ids[pos:pos + len(acc) + 1]
        drafter.update(StepResult(new, new, None, None, tree, acc))
        times.append(time.perf_counter() - t0)
        pos += len(new)
    return statistics.median(times) * 1e6, statistics.mean(times) * 1e6, per_token


def report(task: str, res: dict, seconds: float) -> None:
    base = res["plain"]
    print(f"\n{task}: {len(base.outputs)} prompts, {seconds:.0f} s")
    print(f"{'method':18s} {'tok/s':>7s} {'vs plain':>18s} {'tau':>5s} {'nodes':>5s} {'loop us/step':>13s} same")
    for name, r in res.items():
        med, lo, hi = median_spread(speedups(r, base))
        st: DecodeStats = r.stats
        steps = len(st.steps) or 1
        same = sum(a == b for a, b in zip(r.outputs, base.outputs))
        tps = sorted(r.tokens_per_s)[len(r.tokens_per_s) // 2]
        tau = f"{st.tau:5.2f}" if st.steps else "    -"
        nodes = f"{st.mean_tree_size:5.1f}" if st.steps else "    -"
        draft = f"{st.draft_s / steps * 1e6:13.0f}" if st.steps else f"{'-':>13s}"
        print(f"{name:18s} {tps:7.1f} {med:6.2f}x [{lo:4.2f}, {hi:4.2f}] {tau} {nodes} {draft} "
              f"{same}/{len(base.outputs)}")
    for ref in ("prompt-lookup", "lookahead", "hf prompt lookup"):
        if ref not in res:
            continue
        for name in ("suffix", "suffix-noglobal"):
            ratio = [a / b for a, b in zip(res[name].tokens_per_s, res[ref].tokens_per_s)]
            med, lo, hi = median_spread(ratio)
            print(f"{name} / {ref}: {med:.2f}x [{lo:.2f}, {hi:.2f}]")
    if task == "repeated":  # per-request tau: the global cache needs earlier requests to help
        later = range(1, len(base.outputs))
        if later and hasattr(base, "tokens_per_s_over"):
            for name in ("suffix", "suffix-noglobal", "prompt-lookup"):
                med, lo, hi = median_spread(speedups(res[name], base, later))
                print(f"{name} vs plain over requests 2..{len(base.outputs)}: {med:.2f}x [{lo:.2f}, {hi:.2f}]")
        for name in ("suffix", "suffix-noglobal"):
            print(f"{name} tau per request in order: "
                  + " ".join(f"{st.tau:.2f}" for st in per_request(res[name])))


def per_request(res) -> list[DecodeStats]:
    """Each prompt's stats (every repeat merged), in order (split from the merged steps when the
    result does not keep them per prompt: each prompt's steps commit its output's tokens)."""
    by_prompt = getattr(res, "stats_by_prompt", None)
    if by_prompt:
        return [by_prompt[i] for i in sorted(by_prompt)]
    out, i, steps = [], 0, res.stats.steps
    for tokens in res.outputs:
        k, got = i, 0
        while k < len(steps) and got < len(tokens):
            got += steps[k].committed
            k += 1
        out.append(DecodeStats(steps[i:k]))
        i = k
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target model path or hub id (default: the shipped target)")
    ap.add_argument("--tasks", default="code,repeated", help="comma list of code, copy, prose, repeated")
    ap.add_argument("--prompts", type=int, default=6, help="prompts (requests) per task")
    ap.add_argument("--length", type=int, default=192, help="prompt length in tokens")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved repeats (median reported)")
    ap.add_argument("--hf", action="store_true", help="add transformers' prompt_lookup_num_tokens=10")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    started = time.perf_counter()
    target, tok = dk.load_target(args.target)
    print(f"target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params, {torch.get_num_threads()} "
          f"threads; {args.prompts} prompts x {args.max_new_tokens} new tokens, greedy, {args.repeats} repeats")
    med, mean, per_token = draft_cost(tok)
    print(f"suffix drafter cost at a 512-token context: {med:.0f} us median, {mean:.0f} us mean per "
          f"propose + update; {per_token:.1f} us per prompt token indexed at reset")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    builtin = [t for t in names if t != "repeated"]
    prompts = {t: [p.ids for p in ps] for t, ps in
               build_tasks(tok, builtin, n=args.prompts, length=args.length, seed=args.seed).items()} if builtin else {}
    if "repeated" in names:
        prompts["repeated"] = build_repeated(tok, n=args.prompts, length=args.length, seed=args.seed)
    for task in names:
        t0 = time.perf_counter()
        ps = prompts[task]
        methods = methods_for(target, ps, args.max_new_tokens, args.hf)
        for m in methods:  # untimed warm-up on a prompt of no task (its drafter is replaced)
            m.run(list(range(100, 164)))
        res = measure(methods, ps, args.repeats)
        report(task, res, time.perf_counter() - t0)
    print(f"\nran {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
