"""The target's LM head on a CPU, laid out for a few rows at a time.

A verify forward computes the logits of q = 1 + nodes rows. With some CPU BLAS builds (MKL on an AMD EPYC,
2 threads: measured) a (q, H) x (H, V) product for q >= 2 runs a general matrix multiply far slower than the
one-row product: SmolLM2's 49,152-token head took 8.8 ms for one row and 22 ms for 2 to 8 rows, more than its
30 layers grew together, so verifying a single draft token cost 1.57 plain steps. The same sums laid out as
W (V, H) @ x^T (H, q) took 6.6-9 ms for 2 to 8 rows (one draft token then cost 1.30 plain steps). Which layout
wins depends on the BLAS, the CPU and the shape, so `rows_first_head` measures both once per head (shape,
dtype, threads; saved beside the cost profiles) at the row counts steps use, and runs the transposed layout
only at those where it was clearly faster. One row, the plain decoding step, always runs the model's own head;
so does every head off the CPU (cuBLAS has no such gap) and any head that is not a plain Linear.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

ROW_BUCKETS = (2, 4, 8, 16, 32, 64)  # row counts measured; a step uses the largest bucket at or below its rows
CLEAR_WIN = 0.85  # the transposed layout must take at most this share of the Linear's time
MIN_REPS, MAX_REPS, MIN_SECONDS = 3, 200, 0.05  # timings per layout and bucket (module notes of _measure)
TABLE_TTL_S = 24 * 3600  # as the cost profiles: measured again a day later


def _head(model) -> torch.nn.Linear | None:
    """The model's output head when it is a plain Linear on the CPU, else None."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if get is not None else None
    if type(head) is not torch.nn.Linear or head.weight.device.type != "cpu":
        return None
    return head


def _transposed(head: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """head(x) as W @ x^T: (..., H) -> (..., V), contiguous."""
    flat = x.reshape(-1, x.shape[-1])
    out = torch.matmul(head.weight, flat.t()).t().contiguous()
    if head.bias is not None:
        out += head.bias
    return out.reshape(*x.shape[:-1], out.shape[-1])


@torch.no_grad()
def _measure(head: torch.nn.Linear) -> list[int]:
    """The buckets where the transposed layout is clearly faster than the Linear: the two timed alternately (a
    drift of the machine hits both), at least MIN_REPS times and until MIN_SECONDS are spent on the bucket, so
    that a head of a few hundred microseconds is not decided by one noisy reading; the minimum counts."""
    faster = []
    w = head.weight
    for rows in ROW_BUCKETS:
        x = torch.randn(rows, w.shape[1], generator=torch.Generator().manual_seed(rows)).to(w.dtype)
        layouts = {"linear": lambda: F.linear(x, w, head.bias), "transposed": lambda: _transposed(head, x)}
        times = {name: [] for name in layouts}
        for fn in layouts.values():
            fn()  # warm up
        spent = 0.0
        while len(times["linear"]) < MIN_REPS or (spent < MIN_SECONDS and len(times["linear"]) < MAX_REPS):
            for name, fn in layouts.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
                spent += times[name][-1]
        if min(times["transposed"]) <= CLEAR_WIN * min(times["linear"]):
            faster.append(rows)
    return faster


def _table_file(head: torch.nn.Linear):
    from draftkit.files import cache_root
    from draftkit.verify.cost_profile import machine_key

    key = f"{machine_key('cpu')}|head|{tuple(head.weight.shape)}|{head.weight.dtype}|bias={head.bias is not None}"
    return cache_root() / "head" / (hashlib.sha256(key.encode()).hexdigest()[:20] + ".json")


def transposed_buckets(head: torch.nn.Linear) -> list[int]:
    """The row buckets this head runs transposed at: measured once (saved for a day), then read."""
    from draftkit.files import write_text_atomically

    file = _table_file(head)
    try:
        saved = json.loads(file.read_text())
        if time.time() - saved["measured_at"] < TABLE_TTL_S:
            return list(saved["transposed"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or damaged: measure
    t0 = time.perf_counter()
    buckets = _measure(head)
    logging.getLogger("draftkit").info(
        "draftkit: timed the %s LM head's two layouts once (%.2f s): transposed at rows %s", tuple(head.weight.shape),
        time.perf_counter() - t0, buckets or "none")
    try:
        write_text_atomically(file, json.dumps({"transposed": buckets, "measured_at": time.time()}))
    except OSError:
        pass  # a read-only cache: measured again next process
    return buckets


def _layout(head: torch.nn.Linear) -> frozenset[int]:
    """transposed_buckets for this thread count, kept on the head: a forward reads it without touching the disk."""
    known = head.__dict__.setdefault("_draftkit_rows_first", {})
    threads = torch.get_num_threads()
    if threads not in known:
        known[threads] = frozenset(transposed_buckets(head))
    return known[threads]


def head_layout_key(model) -> str:
    """The LM head's layout by row count, which a verify cost curve depends on (verify/cost_profile.py): "" where
    it is the model's own at every size."""
    head = _head(model)
    rows = sorted(_layout(head)) if head is not None else []
    return f"|head-transposed{','.join(map(str, rows))}" if rows else ""


def _bucket(rows: int) -> int:
    return max(b for b in ROW_BUCKETS if b <= rows)


@contextmanager
def rows_first_head(model):
    """Within: the model's LM head runs W @ x^T for the row counts measured faster that way (module notes)."""
    head = _head(model)
    buckets = _layout(head) if head is not None and "forward" not in head.__dict__ else None
    if not buckets:  # not a CPU Linear, already inside this context, or the Linear is as fast everywhere
        yield
        return

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows >= 2 and _bucket(rows) in buckets:
            return _transposed(head, x)
        return F.linear(x, head.weight, head.bias)

    head.forward = forward
    try:
        yield
    finally:
        del head.forward
