"""Benchmark of the core: tree verification cost and the model-free / standalone drafters
against plain decoding and transformers' own speculative paths, interleaved in one run.

    python eval/bench_core.py                      # the shipped default models
    python eval/bench_core.py --target runs/target/final --draft runs/draft/final

Prints (1) ms per verification step for trees of 1, 8, 32 and 64 nodes beside one
plain decoding step, at a 256-token context; (2) tokens/s of lookahead and standalone
against plain decoding, `generate(prompt_lookup_num_tokens=...)` and
`generate(assistant_model=...)` on held-out code prompts.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import draftkit as dk  # noqa: E402
from drafters.base import DraftTree  # noqa: E402
from drafters.lookahead import LookaheadDrafter  # noqa: E402
from drafters.standalone import StandaloneDrafter  # noqa: E402
from eval.measure import Method, measure, median_spread, speedups  # noqa: E402
from eval.peers import hf_assisted, hf_plain, hf_prompt_lookup  # noqa: E402
from eval.tasks import build_tasks  # noqa: E402
from verify.cache import compact  # noqa: E402
from verify.forward import Verifier  # noqa: E402


def branchy_tree(n: int, vocab: int) -> DraftTree:
    """n nodes, 4 children per node breadth-first (a bushy tree like the methods' trees)."""
    g = torch.Generator().manual_seed(n)
    parents = [-1 if i < 4 else (i - 4) // 4 for i in range(n)]
    return DraftTree(torch.randint(0, vocab, (n,), generator=g), torch.tensor(parents)).validate()


def verify_cost(target, context: int, sizes, reps: int) -> dict[int, float]:
    """Median ms of one verification forward (+ compaction) per tree size; 0 = plain step."""
    ver = Verifier(target)
    vocab = ver.vocab_size
    ctx = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(0))
    ver.forward(ctx, DraftTree.empty().validate(), hidden=False)
    ver.cache_len = context
    out = {}
    for n in [0, *sizes]:
        tree = DraftTree.empty().validate() if n == 0 else (
            DraftTree.chain(torch.tensor([1])).validate() if n == 1 else branchy_tree(n, vocab))
        times = []
        for r in range(reps + 3):
            t0 = time.perf_counter()
            ver.forward(torch.tensor([5]), tree, hidden=False)
            compact(ver.cache, ver.cache_len, 1, len(tree), [])
            times.append(time.perf_counter() - t0)
            compact(ver.cache, ver.cache_len, 0, 1, [])  # drop the root entry again: same context every time
        out[n] = statistics.median(times[3:]) * 1e3
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target model path or hub id (default: the shipped target)")
    ap.add_argument("--draft", default=None, help="standalone draft model (default: the shipped draft)")
    ap.add_argument("--prompts", type=int, default=6, help="held-out code prompts")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median reported)")
    ap.add_argument("--k", type=int, default=4, help="standalone chain length and assisted-generation length")
    ap.add_argument("--reps", type=int, default=30, help="timing repetitions per tree size")
    args = ap.parse_args(argv)

    target, tok = dk.load_target(args.target)
    draft = dk.load_model(args.draft, default="draft")
    print(f"target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params, "
          f"draft {sum(p.numel() for p in draft.parameters()) / 1e6:.1f}M, {torch.get_num_threads()} threads")

    cost = verify_cost(target, 256, (1, 8, 32, 64), args.reps)
    draft_step = verify_cost(draft, 256, (), args.reps)[0]
    print(f"\none step at a 256-token context: target {cost[0]:.2f} ms, draft {draft_step:.2f} ms, "
          f"phi = {draft_step / cost[0]:.3f}")
    print("\nverification forward at a 256-token context (median ms)")
    print(f"{'tree nodes':>10} {'ms':>8} {'x plain step':>13}")
    for n, ms in cost.items():
        print(f"{'plain' if n == 0 else n:>10} {ms:8.2f} {ms / cost[0]:13.2f}")

    prompts = [p.ids for p in build_tasks(tok, ["code"], n=args.prompts)["code"]]
    n, eos = args.max_new_tokens, []

    def ours(drafter_fn):
        return lambda ids: (lambda o: (o.tokens.tolist(), o.stats))(
            dk.generate(target, ids, drafter_fn(), max_new_tokens=n, eos_token_id=eos))

    methods = [
        Method("plain", ours(lambda: None)),
        Method("lookahead", ours(lambda: LookaheadDrafter())),
        Method("prompt-lookup (ours)", ours(lambda: LookaheadDrafter(window=0))),
        Method(f"standalone K={args.k}", ours(lambda: StandaloneDrafter(draft, k=args.k))),
        Method("hf plain generate", hf_plain(target, n, None), "peer"),
        Method("hf prompt_lookup_num_tokens=10", hf_prompt_lookup(target, 10, n, None), "peer"),
        Method(f"hf assistant_model K={args.k}", hf_assisted(target, draft, args.k, n, None), "peer"),
    ]
    with tqdm(total=args.repeats * len(prompts) * len(methods), desc="interleaved runs") as bar:
        res = measure(methods, prompts, args.repeats, bar)
    base = res["plain"]
    print(f"\n{len(prompts)} held-out code prompts x {n} new tokens, greedy, {args.repeats} interleaved repeats")
    print(f"{'method':34} {'tok/s':>8} {'vs plain':>9} {'tau':>6} {'same as plain':>14}")
    for m in methods:
        r = res[m.name]
        sp, lo, hi = median_spread(speedups(r, base))
        tau = f"{r.stats.tau:6.2f}" if r.stats.steps else "     -"
        same = sum(a == b for a, b in zip(r.outputs, base.outputs))
        print(f"{m.name:34} {statistics.median(r.tokens_per_s):8.1f} {sp:8.2f}x {tau} {same:>8}/{len(prompts)}")
    for ours_name, peer in (("lookahead", "hf prompt_lookup_num_tokens=10"),
                            ("prompt-lookup (ours)", "hf prompt_lookup_num_tokens=10"),
                            (f"standalone K={args.k}", f"hf assistant_model K={args.k}")):
        ratio = statistics.median(a / b for a, b in zip(res[ours_name].tokens_per_s, res[peer].tokens_per_s))
        print(f"{ours_name} / {peer}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
