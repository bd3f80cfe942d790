"""A model's Linear layers on a CPU, laid out for the few rows a decoding step multiplies.

A plain decoding step multiplies one row by every weight matrix; a verify forward 1 + nodes rows. Some CPU BLAS
builds run these shapes far below what the memory allows. MKL on an AMD EPYC (2 threads, fp32, SmolLM2's 30
layers with their weights streamed from memory as a forward reads them): one row x^T through `F.linear` took
34.9 ms, two rows 49 ms, while the same sums laid out as W (O, I) @ x^T (I, q) took 15.3 ms for two rows, and one
row multiplied as two (itself twice) 14.5 ms: the one-row product runs on one core at a slow kernel's speed. A
plain SmolLM2 step went from 60 to 35 ms through the rows-first layout, a verify forward of 1-8 nodes from 83-116
to 35-82 ms (verify/cost_profile.py's curve shows both; docs/real-models.md has the table).

Which layout wins depends on the BLAS, the CPU, the dtype and the shape, so each group of a model's Linears
(same shape, dtype, bias) is timed both ways once per machine and thread count (saved beside the cost profiles for
a day), over as many of its weights as a forward streams through the caches, at the row counts steps use; the
rows-first layout runs only at the row buckets where it was clearly faster. Plain decoding takes it too when it
wins at one row: a speedup is then measured over the fastest plain step, not over a slow kernel. Both layouts
compute the same sums; their float rounding differs (as two BLAS kernels' do), like any change of a product's
row count. Off the CPU (cuBLAS has no such gap), for a Linear subclass (LoRA, quantized) and for groups too small
to matter (MIN_GROUP_BYTES), the model's own forward runs.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)  # row counts timed; a product takes the largest bucket at or below its rows,
# and past the last one (a prompt's forward, where the general product is the faster) the Linear's own layout
CLEAR_WIN = 0.85  # the rows-first layout must take at most this share of the Linear's time
MIN_REPS, MAX_REPS, MIN_SECONDS = 3, 200, 0.05  # timed passes per layout and bucket (see _measure)
STREAM_BYTES = 64 << 20  # weights per timed pass: past a CPU's caches, as a forward's layers stream them
MIN_GROUP_BYTES = 1 << 20  # a group of less weight than this runs its own forward: microseconds either way
# per model: its plan by (threads, dtype, device); weak, so a plan neither outlives its model nor is copied with it
_PLANS: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def rows_first_product(weight: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """F.linear(x, weight, bias) as W (O, I) @ x^T: (..., I) -> (..., O), contiguous. One row is multiplied as two
    (itself twice), which takes the same fast kernel as several rows (module notes)."""
    flat = x.reshape(-1, x.shape[-1])  # (q, I)
    if flat.shape[0] == 1:
        out = torch.matmul(weight, flat.expand(2, -1).contiguous().t())[:, :1]  # (O, 1) of (O, 2)
    else:
        out = torch.matmul(weight, flat.t())  # (O, q): x^T as a view of the contiguous rows
    out = out.t().contiguous()
    if bias is not None:
        out += bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _group_key(linear: torch.nn.Linear) -> tuple:
    return tuple(linear.weight.shape), linear.weight.dtype, linear.bias is not None


def linear_groups(model) -> dict[tuple, list[torch.nn.Linear]]:
    """The model's plain CPU Linears by (shape, dtype, bias), each group large enough to matter."""
    groups: dict[tuple, list[torch.nn.Linear]] = {}
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.device.type == "cpu":
            groups.setdefault(_group_key(module), []).append(module)
    return {key: mods for key, mods in groups.items()
            if sum(m.weight.numel() * m.weight.element_size() for m in mods) >= MIN_GROUP_BYTES}


def _streamed(linears: list[torch.nn.Linear]) -> list[torch.nn.Linear]:
    """The first of a group's Linears whose weights reach STREAM_BYTES (all of them when they do not)."""
    out, total = [], 0
    for m in linears:
        out.append(m)
        total += m.weight.numel() * m.weight.element_size()
        if total >= STREAM_BYTES:
            break
    return out


@torch.no_grad()
def _measure(linears: list[torch.nn.Linear]) -> list[int]:
    """The buckets where the rows-first layout is clearly faster over one pass through the group's streamed
    weights: both layouts timed alternately (a drift of the machine hits both), at least MIN_REPS times and until
    MIN_SECONDS are spent on the bucket; the minimum counts (other processes only ever add time)."""
    faster = []
    mods = _streamed(linears)
    w0 = mods[0].weight
    for rows in ROW_BUCKETS:
        x = torch.randn(rows, w0.shape[1], generator=torch.Generator().manual_seed(rows)).to(w0.dtype)
        layouts = {"linear": lambda: [F.linear(x, m.weight, m.bias) for m in mods],
                   "rows_first": lambda: [rows_first_product(m.weight, m.bias, x) for m in mods]}
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
        if min(times["rows_first"]) <= CLEAR_WIN * min(times["linear"]):
            faster.append(rows)
    return faster


def _table_file(key: tuple, streamed: int):
    from draftkit.files import cache_root
    from draftkit.verify.cost_profile import machine_key

    shape, dtype, bias = key
    text = f"{machine_key('cpu')}|linear|{shape}|{dtype}|bias={bias}|streamed={streamed}"
    return cache_root() / "linear_layout" / (hashlib.sha256(text.encode()).hexdigest()[:20] + ".json")


def rows_first_buckets(linears: list[torch.nn.Linear]) -> list[int]:
    """The row buckets a group of Linears runs rows-first at: measured once (saved for a day), then read."""
    from draftkit.files import write_text_atomically
    from draftkit.verify.cost_profile import PROFILE_TTL_S  # measured again when the cost profiles are

    key = _group_key(linears[0])
    file = _table_file(key, len(_streamed(linears)))
    try:
        saved = json.loads(file.read_text())
        if time.time() - saved["measured_at"] < PROFILE_TTL_S:
            return list(saved["rows_first"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or damaged: measure
    t0 = time.perf_counter()
    buckets = _measure(linears)
    logging.getLogger("draftkit").info(
        "draftkit: timed %d Linear(s) of shape %s (%s) both ways once (%.2f s): rows-first at rows %s",
        len(linears), key[0], key[1], time.perf_counter() - t0, buckets or "none")
    try:
        write_text_atomically(file, json.dumps({"rows_first": buckets, "measured_at": time.time()}))
    except OSError:
        pass  # a read-only cache: measured again next process
    return buckets


def _taken_rows(buckets: frozenset[int]) -> tuple[bool, ...]:
    """For each row count 0..ROW_BUCKETS[-1], whether it takes the rows-first layout (its bucket is in `buckets`)."""
    return (False,) + tuple(max(b for b in ROW_BUCKETS if b <= rows) in buckets
                            for rows in range(1, ROW_BUCKETS[-1] + 1))


def _forward_for(linear: torch.nn.Linear, take: tuple[bool, ...]):
    """linear's forward that takes the rows-first layout at the row counts `take` marks (_taken_rows)."""
    top = len(take) - 1

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        # past the largest bucket (a prompt's forward) the Linear's own layout: SmolLM2's head took 298 ms
        # rows-first against 205 ms at 512 rows
        if rows <= top and take[rows]:
            return rows_first_product(linear.weight, linear.bias, x)
        return F.linear(x, linear.weight, linear.bias)

    return forward


def _plan(model) -> tuple[list, str]:
    """([(linear, its forward)] for every Linear that takes the rows-first layout somewhere, the layout's key) for
    this thread count and the model's dtype and device, kept so that a forward reads it without touching the disk."""
    known = _PLANS.setdefault(model, {})
    weight = next(model.parameters(), None)
    setting = (torch.get_num_threads(), None if weight is None else (weight.dtype, weight.device))
    if setting not in known:
        swaps, table = [], []
        for key, linears in linear_groups(model).items():
            buckets = frozenset(rows_first_buckets(linears))
            if buckets:
                take = _taken_rows(buckets)  # one table for the group
                swaps += [(m, _forward_for(m, take)) for m in linears]
                table.append(f"{key}:{sorted(buckets)}")
        digest = hashlib.sha256("|".join(sorted(table)).encode()).hexdigest()[:10] if table else ""
        known[setting] = (swaps, f"|rows-first-{digest}" if digest else "")
    return known[setting]


def layout_key(model) -> str:
    """The model's Linear layout by row count, which a verify cost curve depends on (verify/cost_profile.py): ""
    where every Linear runs its own forward at every size."""
    return _plan(model)[1]


@contextmanager
def rows_first(model):
    """Within: the model's Linears take the rows-first layout at the row counts measured faster that way."""
    swaps = [(m, fn) for m, fn in _plan(model)[0] if "forward" not in m.__dict__]  # nested: the outer one stays
    for m, fn in swaps:
        m.__dict__["forward"] = fn
    try:
        yield
    finally:
        for m, _ in swaps:
            del m.__dict__["forward"]
