"""What a method holds beside the target, counted in bytes (not the process's resident memory).

A drafter is walked attribute by attribute:
- params: parameters and buffers of its own modules; modules it shares with the target
  (EAGLE's LM head and embeddings, Medusa's LM head) are the target's and count nothing;
- kv: its KV caches (a `transformers.Cache`: verify.cache.KVBuffer reports its allocated
  `nbytes()`, any other cache the size of its key and value tensors);
- buffers: every other tensor it keeps (masks, token buffers, saved hidden states) and
  host-side tables (n-gram pools, suffix indexes), as Python reports their size.
Each tensor storage is counted once, however many attributes view it.
"""
from __future__ import annotations

import sys

import torch

_SCALARS = (int, float, str, bytes, bool)


def _storage(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def cache_bytes(cache) -> int:
    if hasattr(cache, "nbytes"):
        return int(cache.nbytes())
    seen, total = set(), 0
    for layer in getattr(cache, "layers", ()):
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor) and _storage(t)[0] not in seen:
                seen.add(_storage(t)[0])
                total += _storage(t)[1]
    return total


def footprint(obj, target=None) -> dict[str, int]:
    """{"params": bytes, "kv": bytes, "buffers": bytes} that `obj` (a drafter, a draft model) holds
    beside `target`."""
    from transformers.cache_utils import Cache

    out = {"params": 0, "kv": 0, "buffers": 0}
    seen_obj = {id(target)}
    seen_mem = {_storage(t)[0] for t in (*target.parameters(), *target.buffers())} if target is not None else set()

    def tensor(t: torch.Tensor, key: str) -> None:
        ptr, n = _storage(t)
        if ptr not in seen_mem:
            seen_mem.add(ptr)
            out[key] += n

    stack = [(obj, 0)]  # iterative: host tables (suffix trees) nest deeper than the recursion limit
    while stack:
        x, depth = stack.pop()
        if id(x) in seen_obj:
            continue
        seen_obj.add(id(x))
        if isinstance(x, torch.nn.Module):
            for t in (*x.parameters(), *x.buffers()):
                tensor(t, "params")
        elif isinstance(x, Cache):
            out["kv"] += cache_bytes(x)
        elif isinstance(x, torch.Tensor):
            tensor(x, "buffers")
        elif isinstance(x, _SCALARS):
            out["buffers"] += sys.getsizeof(x) if depth > 1 else 0  # the drafter's own settings are no buffer
        elif isinstance(x, dict):
            out["buffers"] += sys.getsizeof(x)
            stack += [(v, depth + 1) for kv in x.items() for v in kv]
        elif isinstance(x, (list, tuple, set, frozenset)):
            out["buffers"] += sys.getsizeof(x)
            stack += [(v, depth + 1) for v in x]
        elif hasattr(x, "__dict__") and not isinstance(x, type) and not callable(x):
            stack += [(v, depth + 1) for v in vars(x).values()]
    return out


def param_count(obj, target=None) -> int:
    """Parameters of `obj`'s own modules (those it shares with the target excluded)."""
    shared = {id(p) for p in target.parameters()} if target is not None else set()
    parts = [obj] + [getattr(m, "drafter", m) for m in getattr(obj, "members", ())]  # a hybrid: its members too
    held = [v for p in parts if not isinstance(p, torch.nn.Module) for v in vars(p).values()
            if isinstance(v, torch.nn.Module)]  # the modules a plain-object drafter holds
    mods = [p for p in parts if isinstance(p, torch.nn.Module)] + held
    own = {id(p): p for m in mods for p in m.parameters() if id(p) not in shared}
    return sum(p.numel() for p in own.values())
