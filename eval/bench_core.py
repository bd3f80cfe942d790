"""Benchmark of the decoding core, side by side in one run on this machine.

    python eval/bench_core.py                      # the shipped default models (about 2 minutes)
    python eval/bench_core.py --target runs/target/final --draft runs/draft/final
    python eval/bench_core.py --quick                   # a smoke run: small counts, noisy figures

Prints:
 1. ms of a raw transformers forward (DynamicCache, the model's own causal mask) over
    1, 8, 32 and 64 new tokens at a 256-token context, beside draftkit's verifier forward
    over the same token counts (the root + a chain, and the root + a bushy tree), and the
    verifier's overhead on top of the raw forward; then the verify curve of the bushy tree
    three ways: eager, static shapes run eagerly (the step padded to its bucket, the KV
    buffer and mask at full capacity) and static shapes compiled (`compile=True`; each
    bucket compiles before the timed rounds);
 2. the loop's own time per decoding step outside model forwards (plain decoding);
 3. the share of each step spent drafting for EAGLE-2, EAGLE-3 and the standalone draft (fixed budgets);
 4. plain decoding through draftkit, eager and with compile=True, against transformers' `generate`, eager
    and with a static cache and its forward compiled, interleaved (compiles happen in an untimed warm-up);
 5. host <-> device transfers per step (eval/syncs.py): the loop's own (one upload, one read) and
    each drafter's, per decoding step of one prompt (per-run transfers included).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import draftkit as dk  # noqa: E402
from draftkit.eval.measure import Method, measure, median_spread, speedups, warm_up  # noqa: E402
from draftkit.eval.peers import hf_plain, hf_static_compiled  # noqa: E402
from draftkit.eval.syncs import SyncCounter  # noqa: E402
from draftkit.eval.tasks import build_tasks  # noqa: E402
from draftkit.verify.contract import DraftTree  # noqa: E402
from draftkit.verify.forward import Verifier, static_verifier, warm_compiled  # noqa: E402
from draftkit.verify.packed import static_capacity  # noqa: E402


def bushy(n: int, vocab: int) -> DraftTree:
    """n nodes, 4 children per node breadth-first (like the methods' trees)."""
    g = torch.Generator().manual_seed(n)
    return DraftTree.from_lists(torch.randint(0, vocab, (n,), generator=g).tolist(),
                                [-1 if i < 4 else (i - 4) // 4 for i in range(n)]).validate()


@torch.no_grad()
def forward_costs(target, context: int, sizes, reps: int) -> dict[str, dict[int, float]]:
    """Median ms per forward of `n` new tokens: raw transformers, verifier chain, verifier tree, and the tree with
    static shapes eagerly and compiled."""
    vocab = target.get_output_embeddings().weight.shape[0]
    ctx = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(0))
    raw = DynamicCache(config=target.config)
    target(input_ids=ctx, cache=raw, use_cache=True)
    capacity = context + max(sizes) + 1
    warm_compiled(target, capacity, max(sizes))  # every bucket compiled here, untimed
    vers = {"tree": Verifier(target, capacity), "chain": Verifier(target, capacity),
            "static": Verifier(target, capacity, static=True), "compiled": static_verifier(target, capacity, True)}
    for ver in vers.values():
        ver.forward(ctx[0], DraftTree.empty().validate())
        ver.commit(context, [])
    root = ctx[0, -1:]
    runs = {}
    for n in sizes:
        ids = torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(n))
        chain = DraftTree.chain(ids[0, 1:].tolist()).validate()
        tree = bushy(n - 1, vocab)

        def raw_forward(ids=ids):
            target(input_ids=ids, cache=raw, use_cache=True, logits_to_keep=ids.shape[1])
            raw.crop(-ids.shape[1])

        def ver_forward(ver, tree):
            ver.forward(root, tree)
            ver.kv.drop_pending()

        runs[("raw", n)] = raw_forward
        for kind, ver in vers.items():
            runs[(kind, n)] = lambda ver=ver, t=chain if kind == "chain" else tree: ver_forward(ver, t)
    times = {k: [] for k in runs}
    for rep in range(reps + 2):  # interleaved; the first two rounds warm up
        for key, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            if rep >= 2:
                times[key].append(time.perf_counter() - t0)
    out: dict[str, dict[int, float]] = {"raw": {}, **{kind: {} for kind in vers}}
    for (kind, n), ts in times.items():
        out[kind][n] = statistics.median(ts) * 1e3
    return out


class ForwardClock:
    """Total seconds spent inside a module's forward (hooks on the top-level module)."""

    def __init__(self, module):
        self.total, self._t0 = 0.0, 0.0
        self.hooks = [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]

    def _start(self, *args):
        self._t0 = time.perf_counter()

    def _stop(self, *args):
        self.total += time.perf_counter() - self._t0

    def close(self):
        for h in self.hooks:
            h.remove()


def loop_overhead(target, prompts, n: int) -> tuple[float, float]:
    """(ms per plain step outside model forwards, ms per plain step in total)."""
    dk.generate(target, prompts[0], max_new_tokens=8, eos_token_id=[])  # warm up
    clock = ForwardClock(target)
    steps, t0 = 0, time.perf_counter()
    for ids in prompts:
        steps += len(dk.generate(target, ids, max_new_tokens=n, eos_token_id=[]).stats.steps)
    total = time.perf_counter() - t0
    clock.close()
    return (total - clock.total) / steps * 1e3, total / steps * 1e3


def draft_shares(target, tok, prompts, n: int) -> dict[str, tuple[float, float]]:
    """(draft share of a step, tau) for EAGLE-2 (tree, chain), EAGLE-3 (tree) and the standalone chain,
    fixed budgets."""
    out = {}
    for name in ("eagle", "eagle-chain", "eagle3", "standalone"):
        drafter = dk.make_drafter(name, target, tokenizer=tok)
        stats = None
        for ids in prompts:
            s = dk.generate(target, ids, drafter, max_new_tokens=n, eos_token_id=[], budget="fixed").stats
            stats = s if stats is None else stats.merge(s)
        steps = stats.decode_steps
        draft = sum(s.draft_s for s in steps)
        out[name] = (draft / (draft + sum(s.verify_s for s in steps)), stats.tau)
    return out


def transfers(target, tok, ids, n: int) -> dict[str, dict[str, float]]:
    """Per drafter: host reads and uploads per step, by who makes them (a conservative count on a CPU)."""
    out = {}
    for name in ("plain", "lookahead", "suffix", "standalone", "eagle", "medusa"):
        drafter = dk.make_drafter(name, target, tokenizer=tok)
        dk.generate(target, ids, drafter, max_new_tokens=8, eos_token_id=[])  # one-time costs (the probe, profiles)
        with SyncCounter(drafter) as counter:
            steps = len(dk.generate(target, ids, drafter, max_new_tokens=n, eos_token_id=[],
                                    budget="fixed").stats.steps)
        out[name] = counter.per_step(steps)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None, help="target model path or hub id (default: the shipped target)")
    ap.add_argument("--prompts", type=int, help="held-out code prompts (default: 6; --quick: 2)")
    ap.add_argument("--max-new-tokens", type=int, help="tokens generated per prompt (default: 96; --quick: 16)")
    ap.add_argument("--repeats", type=int, help="interleaved repeats, median reported (default: 3; --quick: 1)")
    ap.add_argument("--reps", type=int, help="timing repetitions per forward size (default: 30; --quick: 3)")
    ap.add_argument("--quick", action="store_true", help="a smoke run with the small counts above (explicit flags "
                    "win; the figures are noise)")
    args = ap.parse_args(argv)
    preset = dict(prompts=2, max_new_tokens=16, repeats=1, reps=3) if args.quick else \
        dict(prompts=6, max_new_tokens=96, repeats=3, reps=30)
    for flag, value in preset.items():
        if getattr(args, flag) is None:
            setattr(args, flag, value)
    for flag in ("prompts", "max_new_tokens", "repeats", "reps"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")

    target, tok = dk.load_target(args.target)
    print(f"target {sum(p.numel() for p in target.parameters()) / 1e6:.1f}M params, {torch.get_num_threads()} threads")
    sizes = (1, 8, 32, 64)
    cost = forward_costs(target, 256, sizes, args.reps)
    print("\n1. one forward of n new tokens at a 256-token context (median ms)")
    print(f"{'n':>4} {'raw':>8} {'verifier chain':>15} {'overhead':>9} {'verifier tree':>14} {'overhead':>9}")
    for n in sizes:
        r, c, t = cost["raw"][n], cost["chain"][n], cost["tree"][n]
        print(f"{n:>4} {r:8.2f} {c:15.2f} {100 * (c / r - 1):+8.1f}% {t:14.2f} {100 * (t / r - 1):+8.1f}%")
    print("\n   the verify curve (bushy tree of n - 1 nodes and the root; median ms, c(n) = ms / ms at n = 1)")
    print(f"{'n':>4} {'eager':>8} {'c(n)':>6} {'static':>8} {'c(n)':>6} {'compiled':>9} {'c(n)':>6}")
    for n in sizes:
        row = [(cost[kind][n], cost[kind][n] / cost[kind][sizes[0]]) for kind in ("tree", "static", "compiled")]
        print(f"{n:>4} " + " ".join(f"{ms:{w}.2f} {c:6.2f}" for (ms, c), w in zip(row, (8, 8, 9))))

    prompts = [p.ids for p in build_tasks(tok, ["code"], n=args.prompts)["code"]]
    outside, per_step = loop_overhead(target, prompts, args.max_new_tokens)
    print(f"\n2. plain decoding: {per_step:.2f} ms per step, of which {outside:.3f} ms outside model forwards")

    print("\n3. draft share of a step (fixed budgets, held-out code)")
    for name, (share, tau) in draft_shares(target, tok, prompts[:3], args.max_new_tokens).items():
        print(f"   {name:12} {100 * share:5.1f}% of each step drafting, tau {tau:.2f}")

    n = args.max_new_tokens

    def ours(compile):
        return lambda ids: (lambda o: (o.tokens.tolist(), o.stats))(
            dk.generate(target, ids, max_new_tokens=n, eos_token_id=[], compile=compile))
    methods = [Method("draftkit", ours(False)), Method("draftkit compile=True", ours(True)),
               Method("hf generate", hf_plain(target, n, None), "peer"),
               Method("hf generate static+compiled", hf_static_compiled(target, n, None), "peer")]
    # compiles, untimed: draftkit's buckets at the capacity the longest prompt needs (the buffer only grows, so
    # shorter prompts meet the same shapes), transformers' forward (its static cache is sized per call)
    warm_compiled(target, static_capacity(max(len(ids) for ids in prompts), 1, n, 0), 1)
    for length in sorted({len(ids) for ids in prompts}):  # plain decoding learns nothing from a prompt: reuse them
        warm_up(methods, next(ids for ids in prompts if len(ids) == length))
    res = measure(methods, prompts, args.repeats)
    base = res["hf generate"]
    print(f"\n4. plain decoding, interleaved (tokens/s, median over {args.repeats} repeats; speedup over "
          "transformers' eager generate; outputs identical to it)")
    for m in methods:
        sp, lo, hi = median_spread(speedups(res[m.name], base))
        same = sum(a == b for a, b in zip(res[m.name].outputs, base.outputs))
        print(f"   {m.name:28} {statistics.median(res[m.name].tokens_per_s):7.1f} tok/s  {sp:.2f}x "
              f"[{lo:.2f}-{hi:.2f}]  {same}/{len(prompts)}")

    print("\n5. host transfers per step (fixed budgets, one prompt; per-run transfers included)")
    for name, c in transfers(target, tok, prompts[0], args.max_new_tokens).items():
        print(f"   {name:12} loop {c['loop_upload']:.2f} up / {c['loop_read']:.2f} read; drafter "
              f"{c['drafter_upload']:.2f} up / {c['drafter_read']:.2f} read; other {c['other_upload']:.2f} up / "
              f"{c['other_read']:.2f} read")


if __name__ == "__main__":
    main()
