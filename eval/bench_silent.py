"""What a drafter that does not pay still costs: each drafter against plain sampling, paired prompt by prompt,
interleaved over many rounds on the shipped default models. Prints figures; asserts nothing.

    python eval/bench_silent.py                                  # lookahead, suffix, medusa on prose; ~10 min
    python eval/bench_silent.py --drafters suffix --tasks copy,prose --rounds 12

Two rows per drafter:
- `auto`: the drafter under the cost-aware controller (the default), as compare.py runs it;
- `silent`: the same drafter told to draft nothing at every step, so the row is what the drafter costs while
  it sits out: its bookkeeping (update() on every committed token, the hidden states the verifier hands it) and
  nothing else. A silent drafter that costs nothing reads 1.00x.
Why paired: compare.py's default run gives one speedup per repeat (a ratio of sums over a few prompts), and on a
machine whose speed wanders by several percent between minutes its rows move by as much: two drafters that never
drafted read 0.94x and 1.02x in one run. Here every run of a method on a prompt is paired with plain's run on the
same prompt in the same round (a few seconds apart; the order rotates), and the figure is the median of those
paired ratios with a bootstrap 90% interval: on 2 idle cores, 8 rounds x 3 prompts give about +-4%.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import draftkit as dk  # noqa: E402
from draftkit.eval.tasks import TASKS, build_tasks  # noqa: E402
from draftkit.verify.contract import Budget  # noqa: E402


class Silent:
    """A budget policy that never lets the drafter draft (the drafter still sees every step's update)."""

    def __init__(self, cap: Budget):
        self.cap = cap

    def start(self, prompt_len: int) -> None:
        pass

    def budget(self, context_len: int) -> Budget:
        return Budget(0, 0)

    def observe(self, step, context_len: int) -> None:
        pass


def paired(plain: list[float], other: list[float], draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Median of plain_s / other_s over the pairs, and a bootstrap 90% interval of that median."""
    ratios = [p / o for p, o in zip(plain, other)]
    rng = random.Random(seed)
    boot = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return statistics.median(ratios), boot[int(0.05 * draws)], boot[int(0.95 * draws)]


def run_task(target, prompts, names: list[str], args) -> dict[str, list[float]]:
    """Seconds per (round, prompt) for plain and each drafter's auto and silent rows, interleaved."""
    sampling = dk.Sampling(temperature=args.temperature)
    drafters = {n: dk.make_drafter(n, target) for n in names}
    rows = ["plain"] + [f"{n} {mode}" for n in names for mode in ("auto", "silent")]
    seconds = {r: [] for r in rows}
    seed = 0
    for rnd in range(args.rounds + 1):  # round 0 warms up (allocations, the controller's cost profile)
        for i, p in enumerate(prompts):
            order = rows[(rnd + i) % len(rows):] + rows[:(rnd + i) % len(rows)]
            seed += 1
            for row in order:
                name, _, mode = row.partition(" ")
                d = drafters.get(name)
                if hasattr(d, "forget"):
                    d.forget()
                budget = Silent(d.budget_cap) if mode == "silent" else "auto"  # plain: mode is ""
                t0 = time.perf_counter()
                dk.generate(target, p.ids, d, max_new_tokens=args.max_new_tokens, sampling=sampling, seed=seed,
                            eos_token_id=[], budget=budget)
                if rnd:
                    seconds[row].append(time.perf_counter() - t0)
    return seconds


def parse(argv=None) -> argparse.Namespace:
    """The flags, checked before any model loads."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafters", default="lookahead,suffix,medusa", help="comma list (default: %(default)s)")
    ap.add_argument("--tasks", default="prose", help=f"comma list of {', '.join(TASKS)} (default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=3, help="prompts per task (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=80, help="tokens per prompt (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds after one warm-up (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default: %(default)s)")
    args = ap.parse_args(argv)
    args.names, args.task_list = names, tasks = args.drafters.split(","), args.tasks.split(",")
    from draftkit.drafters.registry import REGISTRY

    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        ap.error(f"--drafters: unknown {unknown}; choose from {', '.join(REGISTRY)}")
    bad = [t for t in tasks if t not in TASKS]
    if bad or args.rounds < 1 or args.prompts < 1 or args.max_new_tokens < 1 or args.temperature <= 0:
        ap.error(f"unknown task(s) {bad}" if bad else "--rounds, --prompts, --max-new-tokens and --temperature "
                 "must be positive")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    names, tasks = args.names, args.task_list
    torch.set_num_threads(args.threads)
    target, tok = dk.load_target(None)
    print(f"T = {args.temperature}, {args.prompts} prompts x {args.max_new_tokens} tokens x {args.rounds} rounds, "
          f"{args.threads} threads; speedup = median of plain_s / row_s over the pairs [bootstrap 90%]")
    for task in tasks:
        prompts = build_tasks(tok, (task,), args.prompts, 192, 0)[task]
        seconds = run_task(target, prompts, names, args)
        plain = seconds.pop("plain")
        print(f"{task}: plain {statistics.median(plain) * 1e3:.0f} ms a prompt (median)")
        for row, secs in seconds.items():
            mid, lo, hi = paired(plain, secs)
            print(f"  {row:18s} {mid:.3f}x [{lo:.3f}-{hi:.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
