"""Tree attention: masks and position ids for one verification forward.

The forward's input is a committed prefix (m >= 1 tokens not yet in the KV
cache; the last one is the root) followed by the n draft nodes:

    input:     [p_0 ... p_{m-1}=root] [node_0 ... node_{n-1}]
    positions:  L .. L+m-1             L+m-1+depth(node)

where L is the cache length. Prefix tokens attend causally; a node attends to
the cache, the whole prefix, and its own ancestors and itself. A chain is a
tree whose mask is plain causal, so chains need no explicit mask at all.
"""
from __future__ import annotations

import torch

from drafters.base import DraftTree


def is_chain(tree: DraftTree) -> bool:
    """True when node i's parent is i - 1 for all i (the empty tree included)."""
    return all(len(c) <= 1 for c in tree.children) and all(
        c[0] == s + 1 for s, c in enumerate(tree.children) if c)


def ancestor_matrix(tree: DraftTree) -> torch.Tensor:
    """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors."""
    n = len(tree)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for i, par in enumerate(tree.parents.tolist()):
        if par >= 0:
            anc[i] = anc[par]
        anc[i, i] = True
    return anc


def tree_positions(tree: DraftTree, cache_len: int, prefix_len: int, device) -> torch.Tensor:
    """(1, m + n) long position ids."""
    depth = torch.tensor(tree.depth[1:], dtype=torch.long)
    pos = torch.cat([torch.arange(prefix_len), prefix_len - 1 + depth]) + cache_len
    return pos.unsqueeze(0).to(device)


def tree_attention_mask(tree: DraftTree, cache_len: int, prefix_len: int, dtype, device) -> torch.Tensor:
    """(1, 1, m + n, L + m + n) additive mask: 0 where attention is allowed, dtype-min elsewhere."""
    m, n = prefix_len, len(tree)
    allowed = torch.zeros(m + n, cache_len + m + n, dtype=torch.bool)
    allowed[:, :cache_len] = True
    allowed[:m, cache_len:cache_len + m] = torch.ones(m, m, dtype=torch.bool).tril()
    allowed[m:, cache_len:cache_len + m] = True
    allowed[m:, cache_len + m:] = ancestor_matrix(tree)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


def path_slots(tree: DraftTree, node: int) -> list[int]:
    """Node indices from the root's first child down to `node` (inclusive)."""
    path = []
    parents = tree.parents.tolist()
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]
