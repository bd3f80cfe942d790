"""Medusa's draft tree: a fixed set of paths of head top-k ranks ("medusa choices").

A path such as (0, 1) means "head 0's best token, then head 1's second-best token below it". The tree is built
greedily from per-head, per-rank accuracies (`build_tree_choices`): a path's value is the product of the
accuracies along it, the chance the whole path is accepted, and the sum of the values the expected accepted
tokens per step. drafters/medusa.py lays the tree out and fills it from the heads' top-k.
"""
from __future__ import annotations

import heapq

TreeChoices = list[tuple[int, ...]]


def check_tree_choices(choices, num_heads: int | None = None, max_rank: int | None = None) -> TreeChoices:
    """Normalise to a list of int tuples and check it is a tree: every path's parent present, no repeats."""
    out: TreeChoices = []
    for c in choices:
        path = tuple(int(r) for r in c)
        if not path:
            raise ValueError("a Medusa tree choice must be a non-empty path of top-k ranks, got ()")
        if any(r < 0 for r in path):
            raise ValueError(f"Medusa tree choice {path} has a negative rank")
        if max_rank is not None and any(r >= max_rank for r in path):
            raise ValueError(f"Medusa tree choice {path} uses rank >= {max_rank}")
        if num_heads is not None and len(path) > num_heads:
            raise ValueError(f"Medusa tree choice {path} is {len(path)} deep but there are only {num_heads} heads")
        out.append(path)
    seen = set(out)
    if len(seen) != len(out):
        raise ValueError("Medusa tree choices contain a repeated path")
    for path in out:
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"Medusa tree choice {path} has no parent {path[:-1]} in the tree")
    return out


def build_tree_choices(accuracies, tree_size: int) -> TreeChoices:
    """Greedy Medusa tree from per-rank accuracies.

    accuracies[k][r]: probability that head k's rank-r token is the right one (per rank, not
    cumulative). A path's value is the product of accuracies along it (the chance the whole
    path is accepted); the path with the highest value whose parent is already in the tree is
    added until there are `tree_size` nodes. The sum of the values is the expected number of
    accepted tokens. Returned in depth-first order, rank 0 first (the most likely branch first).
    """
    acc = [[float(a) for a in row] for row in accuracies]
    if not acc or not all(acc):
        raise ValueError("accuracies must be a non-empty (num_heads, top_k) table")
    if tree_size < 0:
        raise ValueError(f"tree_size must be >= 0, got {tree_size}")
    heap = [(-acc[0][r], (r,)) for r in range(len(acc[0]))]
    heapq.heapify(heap)
    chosen: TreeChoices = []
    while heap and len(chosen) < tree_size:
        neg, path = heapq.heappop(heap)
        chosen.append(path)
        depth = len(path)
        if depth < len(acc):
            for r, a in enumerate(acc[depth]):
                heapq.heappush(heap, (neg * a, path + (r,)))
    return sorted(chosen)


def path_value(path: tuple[int, ...], accuracies) -> float:
    """Chance that the whole path is accepted: the product of its per-rank accuracies."""
    v = 1.0
    for depth, r in enumerate(path):
        row = accuracies[depth]
        v *= float(row[r]) if r < len(row) else 0.0
    return v


def expected_accepted(choices: TreeChoices, accuracies) -> float:
    """Expected accepted draft tokens per step under the independence assumption of the tree builder."""
    return sum(path_value(p, accuracies) for p in choices)


def default_accuracies(num_heads: int, top_k: int = 10) -> list[list[float]]:
    """A plausible accuracy profile for heads never measured (falls with depth and rank)."""
    return [[0.6 * 0.75 ** k / (r + 1) ** 1.5 for r in range(top_k)] for k in range(num_heads)]
