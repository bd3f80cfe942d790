"""KV cache compaction after a verification step.

The forward appended entries for the prefix and for every draft node. We keep
the prefix (it is committed) and the accepted nodes, in order, and drop the
rest. Nothing is recomputed: kept entries already hold the right keys and
values, and their rotary positions were the committed positions. When the
accepted nodes are the first ones in the flat order (always for chains, and
for trees laid out depth-first along their best branch) compaction is a crop.
"""
from __future__ import annotations

import torch
from transformers import Cache


def _layers(cache: Cache):
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise TypeError(f"{type(cache).__name__} has no .layers; draftkit needs a transformers 5.x DynamicCache")
    return layers


def compact(cache: Cache, cache_len: int, prefix_len: int, n_nodes: int, accepted: list[int]) -> int:
    """Drop the entries of rejected nodes. Returns the new cache length.

    Before: cache_len + prefix_len + n_nodes entries; node i sits at cache_len + prefix_len + i.
    After:  cache_len + prefix_len + len(accepted) entries.
    """
    base = cache_len + prefix_len
    keep_len = base + len(accepted)
    if len(accepted) == n_nodes:  # every node kept (or none drafted): nothing to drop
        return keep_len
    if accepted == list(range(len(accepted))):  # contiguous: a crop
        for layer in _layers(cache):
            layer.keys = layer.keys[..., :keep_len, :]
            layer.values = layer.values[..., :keep_len, :]
        return keep_len
    idx = torch.arange(base, device=_layers(cache)[0].keys.device)
    idx = torch.cat([idx, torch.tensor(accepted, device=idx.device) + base])
    for layer in _layers(cache):
        # (B, H, T, D) -> gather along T
        layer.keys = layer.keys.index_select(-2, idx)
        layer.values = layer.values.index_select(-2, idx)
    return keep_len
