"""Compiled static-shape forwards, shared by the verifier and the draft models: the row buckets, the compiled
callable kept on each model, and the call that marks a CUDA-graph step and says once when a new graph compiled.

A static forward (verify/forward.py, verify/tree.py) has shapes that depend only on its bucket of rows, its
KV buffer's capacity and its rows of sequences, so `torch.compile(dynamic=False)` compiles one graph per
(rows, bucket, capacity) and replays it after that; CUDA graphs on a GPU ("reduce-overhead"), inductor's
default elsewhere.
"""
from __future__ import annotations

import logging
import time

import torch

BUCKET_STEP = 64  # buckets grow by doubling up to this many rows, then by this many
RECOMPILE_LIMIT = 64  # compiled graphs kept per model: one per bucket (and per capacity the buffer grew to)


def bucket(q: int) -> int:
    """The rows a static forward of q rows runs with: the next of 1, 2, 4, ..., 64, 128, 192, ..."""
    return 1 << max(q - 1, 0).bit_length() if q <= BUCKET_STEP else -(-q // BUCKET_STEP) * BUCKET_STEP


def device_of(model) -> torch.device:
    """The device of a model's weights (a draft module need not have transformers' `.device`)."""
    return next(model.parameters()).device


def graph_outputs(device: torch.device) -> bool:
    """Whether a compiled forward's outputs live in CUDA-graph memory that its next replay rewrites."""
    return device.type == "cuda"


def compiled_forward(model):
    """model.__call__ compiled with static shapes, once per model object (kept on it): CUDA graphs on a GPU
    ("reduce-overhead"), inductor's default elsewhere."""
    fn = getattr(model, "_draftkit_compiled", None)
    if fn is None:
        mode = "reduce-overhead" if graph_outputs(device_of(model)) else None
        fn = model._draftkit_compiled = torch.compile(model.__call__, dynamic=False, mode=mode)
    return fn


def compiled_keys(model) -> set:
    """The graph keys compiled so far for this model (kept on it, as its compiled function is)."""
    return model.__dict__.setdefault("_draftkit_buckets", set())


def call_compiled(model, key: tuple, what: str, ahead: str, graphs: bool, **inputs):
    """The model's compiled forward on `inputs`. graphs: its outputs are CUDA-graph memory, so the call starts a
    new step first (the previous replay's outputs may be rewritten from here on; the caller copies what it keeps).
    The first call with a new `key` (the graph's shapes) compiles a graph: said once, in one line naming `what`
    and its seconds and `ahead` (what compiles every graph before a timed call), so they are never read as
    decoding."""
    if graphs:
        torch.compiler.cudagraph_mark_step_begin()
    t0 = time.perf_counter()
    # more graphs than dynamo keeps by default; past them, an error rather than dynamo's silent eager fallback
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True):
        try:
            out = compiled_forward(model)(**inputs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
            raise RuntimeError(f"draftkit: {what} would be graph number {RECOMPILE_LIMIT + 1} on code that models "
                               "of one class share; torch._dynamo.reset() forgets the graphs of models no longer "
                               "in use") from exc
    seen = compiled_keys(model)
    if key not in seen:
        seen.add(key)
        logging.getLogger("draftkit").warning("draftkit: compiled %s (%.1f s, once; %s)", what,
                                              time.perf_counter() - t0, ahead)
    return out


def warm_graphs(model, calls: list, what: str) -> None:
    """Compile ahead, before any step is timed, the graphs `model` has not compiled yet: `calls` is a list of (graph
    key, a call that runs the compiled forward once with that key's shapes). Each key is marked compiled before its
    call, so the calls say nothing one by one; the whole warm-up is said once, naming `what`, with its seconds.
    Nothing runs and nothing is said when every key is compiled (graphs are kept on the model)."""
    seen = compiled_keys(model)
    todo = [(key, call) for key, call in calls if key not in seen]
    if not todo:
        return
    t0 = time.perf_counter()
    for key, call in todo:
        seen.add(key)
        call()
    logging.getLogger("draftkit").warning("draftkit: compiled %s (%.1f s, once)", what, time.perf_counter() - t0)
