"""The target's verify cost curve on this machine: c(n), the seconds of a forward over the root and n draft
nodes against a plain step, measured once per machine + model + context bucket + forward path and saved under
~/.cache/draftkit/cost/ (the controller, verify/controller.py, prices every node with it).

The path is the forward a run verifies with: "eager" (the dynamic verifier), "static" (static shapes) or
"compiled" (static shapes through torch.compile: CUDA graphs on a GPU). Their curves differ (a compiled plain
step is cheaper, padding to buckets makes sizes within a bucket cost alike), so a run is priced on its own path:
a static or compiled run's profile is measured on that run's own verifier (its buffers, hence its compiled
graphs, which the run then reuses).

The eager curve is measured at every size up to PADDED_REACH nodes as well: where a larger size measured clearly
cheaper (some CPU BLAS builds run a product of 2-3 or 5-7 rows slower than one of 4 or 8), a step of that size
runs padded to it (`row_padding`, verify/forward.py), and c(n) is the cost of the size it runs as: a longer tree
then never costs less, which the controller's model assumes.

Which sizes pad is a matter of the BLAS's row counts, not of the context, so a model measured at one context bucket
is measured at the next only at PROFILE_SIZES, fewer times (REPS_AT_NEXT), with the padding of its nearest
measured bucket: SmolLM2-135M on 2 CPU cores at context 4096 took 40 s for the dense curve, inside the first call
whose prompt passed 2,048 tokens. A benchmark's `refresh` measures the dense curve at every bucket, each size
REPS times; a model's first curve, inside a user's call, REPS_FIRST times (SmolLM2: 7-8.5 s against 11 s; the
padding found differs as much between two refreshes as between the two)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, field

import torch

from draftkit.files import cache_root, write_text_atomically
from draftkit.verify.linear_layout import layout_key

PROFILE_SIZES = (1, 2, 4, 8, 16, 32, 64)
PROFILE_TTL_S = 24 * 3600
PADDED_REACH = 16  # the eager curve is measured at every size up to this many nodes: the sizes a step is padded to
PAD_WIN = 0.95  # a size is padded to a larger one that measured at most this share of its time (a clear win)
PROMPT_SEED = 128  # tokens of the timed context that run a forward (KVBuffer.tile repeats their entries)
REPS, REPS_FIRST, REPS_AT_NEXT = 5, 3, 3  # timings per size: a benchmark's refresh, a model's first (dense) curve
# inside a user's call, a later bucket's (coarse)


def machine_key(device=None) -> str:
    device = torch.device(device or "cpu")
    dev = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    return f"{dev}|{os.cpu_count()}cpu|{torch.get_num_threads()}threads|torch{torch.__version__}"


def model_key(model) -> str:
    params = sum(p.numel() for p in model.parameters())
    name = str(getattr(model.config, "_name_or_path", "") or type(model).__name__)
    return f"{name}|{params}|{model.dtype}|{model.device}"


def path_of(verifier) -> str:
    """The forward path a verifier runs: eager (None or dynamic), static or compiled."""
    if verifier is None or not verifier.static:
        return "eager"
    return "compiled" if verifier.compile else "static"


def context_bucket(n: int) -> int:
    """Contexts are profiled at powers of two (128, 256, 512, ...)."""
    return max(128, 1 << max(0, (n - 1)).bit_length())


@dataclass
class CostProfile:
    """Verify cost of the target on this machine at one context length.

    plain_s: seconds of one plain decoding step (one token on top of the cache);
    sizes / ratios: c(n) = seconds of a forward over [root] + n draft nodes / plain_s.
    """

    plain_s: float
    sizes: list[int]
    ratios: list[float]
    context: int = 0
    path: str = "eager"  # the forward path measured: eager, static or compiled (module docstring)
    key: str = ""
    measured_at: float = 0.0  # unix time; profiles older than PROFILE_TTL_S are measured again
    padded: list = field(default_factory=list)  # [nodes, nodes it runs as] where padding measured cheaper (eager)
    unpadded: list = field(default_factory=list)  # c(n) per size as measured, before padding and the monotone rule

    def row_padding(self) -> dict[int, int]:
        """The verifier's padding (rows -> rows, verify/forward.py): n nodes and their root run as m + 1 rows."""
        return {n + 1: m + 1 for n, m in self.padded}

    def c(self, n: float) -> float:
        """c(n), linear between measured sizes and beyond the last two; c(0) = 1."""
        if n <= 0:
            return 1.0
        xs, ys = [0, *self.sizes], [1.0, *self.ratios]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
        return y1 + (y1 - y0) * (n - x1) / (x1 - x0)

    @classmethod
    @torch.no_grad()
    def measure(cls, model, context: int, sizes=PROFILE_SIZES, reps: int = REPS, verifier=None,
                padded_as: "CostProfile | None" = None) -> "CostProfile":
        """A few forwards at `context` tokens: the minimum of `reps` timings per tree size. verifier: an empty
        static verifier to measure on (its path; emptied again after), else a fresh eager one. padded_as: an eager
        profile of the same model at another context, whose padding this one takes (only `sizes` are timed)."""
        from draftkit.verify.contract import DraftTree
        from draftkit.verify.forward import Verifier, context_limit
        from draftkit.verify.tree_probe import probe_tree_attention
        from draftkit.verify.timing import clock_for

        if verifier is None and padded_as is None:  # eager: every size a step may be padded from or to
            sizes = tuple(sorted(set(sizes) | set(range(1, PADDED_REACH + 1))))
        # a model of learned positions (GPT-2, OPT) has none past its context: the trees are timed on a context
        # short enough for them (a bucket is keyed by its size; its last entries cost what the ones before do).
        # Timed past it, a 300-token prompt to a 512-position GPT-2 died in its first drafted call
        limit = context_limit(model)
        if limit:
            sizes = tuple(n for n in sizes if n + 3 <= limit) or (1,)
        timed = context if not limit else max(1, min(context, limit - max(sizes) - 2))
        need = timed + max(sizes) + 2
        ver = verifier if verifier is not None else Verifier(model, capacity=need)
        if ver.kv.capacity < need:
            raise ValueError(f"a {ver.kv.capacity}-entry verifier cannot time trees at context {context}")
        vocab = ver.vocab_size
        ids = torch.randint(0, vocab, (timed,), generator=torch.Generator().manual_seed(0)).to(model.device)
        seed = min(timed, PROMPT_SEED)  # a prompt's forward, the rest of the context its entries repeated
        ver.forward(ids[:seed], DraftTree.empty(model.device).validate())
        ver.commit(seed, [])
        ver.kv.tile(timed)
        root = ids[-1:]

        trees = [DraftTree.empty(model.device).validate()]
        branched = probe_tree_attention(model)  # a model limited to chains is measured on chains
        for n in sizes:  # bushy trees, 4 children per node, like the methods' trees
            parents = [-1 if i < 4 else (i - 4) // 4 for i in range(n)] if branched else list(range(-1, n - 1))
            tokens = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(n)).tolist()
            trees.append(DraftTree.from_lists(tokens, parents, model.device).validate())
        times = [[] for _ in trees]
        clock = clock_for(model)  # waits for the model's own device before each reading
        for rep in range(reps + 1):  # interleaved, so drifts of the machine hit every size alike
            for i, tree in enumerate(trees):
                t0 = clock.now()
                ver.forward(root, tree)
                if rep:  # the first round warms up
                    times[i].append(clock.now() - t0)
                ver.kv.drop_pending()  # the same context every time
        if verifier is not None:
            ver.reset()  # the run starts on an empty buffer
        plain, *rest = (min(t) for t in times)  # other processes only ever add time: the minimum is the cost
        seconds = dict(zip(sizes, rest))
        if padded_as is not None:  # its padding, each size priced at what it runs as (linear between timed sizes)
            padded = dict(map(tuple, padded_as.padded))
            as_timed = cls(plain, list(sizes), [t / plain for t in rest])
            ratios = [max(1.0, as_timed.c(padded.get(n, n))) for n in sizes]
        else:
            padded = padding(seconds) if verifier is None else {}
            ratios = [max(1.0, seconds[padded.get(n, n)] / plain) for n in sizes]
        # a longer tree never costs less: keep the curve monotone against timing noise
        for i in range(1, len(ratios)):
            ratios[i] = max(ratios[i], ratios[i - 1])
        return cls(plain, list(sizes), ratios, context, path_of(verifier), padded=sorted(map(list, padded.items())),
                   unpadded=[seconds[n] / plain for n in sizes])

    @classmethod
    def for_model(cls, model, context: int, cache: bool = True, refresh: bool = False, verifier=None,
                  max_nodes: int | None = None) -> "CostProfile":
        """The saved profile for this machine + model + context bucket + path, measured and saved if absent
        (or when `refresh`: a benchmark about to start). verifier: the run's static verifier, empty: the profile
        of its path, measured on it (at the largest context bucket it has room for), at the sizes up to the first
        that holds `max_nodes` (each size a bucket the compiled path compiles: none the run would not use; c(n)
        is extrapolated past the last)."""
        bucket = context_bucket(context)
        forward = path_of(verifier)
        sizes = PROFILE_SIZES
        if verifier is not None:
            reach = next((n for n in PROFILE_SIZES if n >= (max_nodes or PROFILE_SIZES[-1])), PROFILE_SIZES[-1])
            sizes = tuple(n for n in PROFILE_SIZES if n <= max(reach, 2))
            while bucket > 128 and bucket + max(sizes) + 2 > verifier.kv.capacity:
                bucket //= 2
            if bucket + max(sizes) + 2 > verifier.kv.capacity:
                verifier, forward, sizes = None, "eager", PROFILE_SIZES  # no room to time trees: the eager curve
        key = cls._key(model, bucket, forward, sizes)
        file = _file(key)
        if cache and not refresh:
            prof = _saved(file)
            if prof is not None:
                return prof
        # an eager curve at a new bucket takes the padding of the model's nearest measured one (module docstring)
        nearest = cls._nearest_saved(model, bucket) if forward == "eager" and cache and not refresh else None
        t0 = time.perf_counter()
        prof = cls.measure(model, bucket, sizes, verifier=verifier, padded_as=nearest,
                           reps=REPS if refresh else REPS_FIRST if nearest is None else REPS_AT_NEXT)
        prof.key, prof.measured_at = key, time.time()
        # the one time a call pays for it: said, so that a first call's time is not read as decoding speed
        logging.getLogger("draftkit").warning(
            "draftkit: measured this model's verify cost curve (%s forward) at context %d once (%.1f s%s)%s",
            forward, bucket, time.perf_counter() - t0, "" if nearest is None else
            f"; the padding measured at context {nearest.context}", f"; saved under {file.parent} for later calls"
            if cache else "")
        if cache:
            write_text_atomically(file, json.dumps(asdict(prof)))
        return prof

    @classmethod
    def _nearest_saved(cls, model, bucket: int) -> "CostProfile | None":
        """The model's saved eager profile at the context bucket nearest `bucket` (another one), if any."""
        saved = [p for p in (_saved(_file(cls._key(model, b, "eager", PROFILE_SIZES))) for b in _other_buckets(bucket))
                 if p is not None]
        return min(saved, key=lambda p: abs(p.context.bit_length() - bucket.bit_length()), default=None)

    @staticmethod
    def _key(model, bucket: int, forward: str, sizes) -> str:
        return f"{machine_key(model.device)}|{model_key(model)}|ctx{bucket}{layout_key(model)}" + \
            ("|padded" if forward == "eager" else f"|{forward}|n{max(sizes)}")


def _file(key: str):
    return cache_root() / "cost" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


def _saved(file) -> CostProfile | None:
    """The profile saved in `file` if there is one and it is younger than PROFILE_TTL_S."""
    try:
        prof = CostProfile(**json.loads(file.read_text()))
    except (OSError, ValueError, TypeError):  # none, or a damaged file: measure again
        return None
    return prof if time.time() - prof.measured_at < PROFILE_TTL_S else None


def _other_buckets(bucket: int, most: int = 1 << 20) -> list[int]:
    """The context buckets other than `bucket` (context_bucket's: 128, 256, ..., up to `most`)."""
    first = context_bucket(1).bit_length() - 1
    return [b for b in (1 << i for i in range(first, most.bit_length())) if b != bucket]


def padding(seconds: dict[int, float]) -> dict[int, int]:
    """{n: m}: the sizes (nodes) up to PADDED_REACH that run padded to m > n, the cheapest measured size up to
    PADDED_REACH, where it took at most PAD_WIN of n's time."""
    dense = sorted(n for n in seconds if n <= PADDED_REACH)
    out = {}
    for n in dense:
        best = min((m for m in dense if m > n), key=lambda m: (seconds[m], m), default=None)
        if best is not None and seconds[best] <= PAD_WIN * seconds[n]:
            out[n] = best
    return out
