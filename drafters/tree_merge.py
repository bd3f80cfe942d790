"""Several drafters' trees as one tree: shared prefixes once, each draw kept with its member, rank and q.

`merge_trees` takes one tree per member (None: the member was not asked) and a calibrated chance
per draw, `chance(member, depth, rank)`: the chance that the target accepts a draw of that member at
that depth and sibling rank once the walk has reached its parent. A merged node's chance combines its
draws, 1 - prod(1 - chance); its score is the product of the chances on its path (the chance that the
accepted path reaches it). Three rules, in this order:

1. union: nodes are keyed by (merged parent, token), so a token proposed by several members under
   the same path is one node, verified once; every member's draw of it is remembered;
2. floor: a draw is kept only if score(parent) * chance(draw) >= floor (members in `keep_all` are
   exempt: a probe measures a member whose chance has fallen); a node lives while one draw does;
3. cap: past `max_nodes`, the best nodes by score (a child always scores below its parent, so
   the kept set is a tree).

The members' draws at a slot are tested in the order of their rank-0 chance at that depth, the likeliest
member first: under sampling a later member is tested against the residual of the earlier ones, so a
member whose q is close to the target's (EAGLE's) loses acceptance behind one that proposes a single token
with q = 1 (suffix: a shared token x passes with p(x) instead of min(1, p(x) / q(x)), and its second draw of x
can no longer pass). In suffix-first order a suffix + EAGLE hybrid at temperature 0.8, fixed budget, accepted
depth 1 at 0.77 where EAGLE alone accepted 0.86.

Why this stays exact under sampling (verify/accept.py tests the draws of each slot member by member,
each member's draws by its own rule): the order comes from the calibration (past steps), never from this
step's tokens or q, so it is fixed before the draws are seen, as multi-draft sampling needs. The floor decides a
draw from its parent's score, its own
member, depth and rank: never from its token, its q or the draws after it, and a member's kept
draws at a slot are a prefix of its own (the chance never rises with rank). So a member's kept
draws are still "its first draws, their number fixed before they were seen". The cap compares
nodes of different members and would break that; the hybrid drafter keeps it from binding under
sampling (drafters/hybrid.py: each member is asked for a share of the budget).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from draftkit.drafters.tree_search import depth_first
from draftkit.verify.contract import WITHOUT_REPLACEMENT, DraftTree, SiblingDraws

MAX_CHANCE = 0.99  # a child always scores strictly below its parent


@dataclass
class Draw:
    member: int  # the member that proposed it
    node: int  # its node index in the member's tree
    depth: int
    rank: int  # its place among the member's children of the same parent (0: first)
    chance: float


@dataclass
class MergedTree:
    """DraftTree.extra of a merged tree.

    draws[i]:    the kept draws behind merged node i (member order)
    where[m]:    per node of member m's tree, its merged node (None: cut); None when m was not asked
    trees[m]:    member m's tree as proposed (None: not asked)
    """

    draws: list[list[Draw]]
    where: list[list[int | None] | None]
    trees: list[DraftTree | None]
    slot_draws: list[list[tuple[Draw, int]]] = field(default_factory=list)  # per slot: (draw, merged node)
    fixed_budget: bool = False  # the step's budget was fixed (verify.budget.Budget.fixed): judge without timings

    def whole(self, m: int) -> bool:
        """Member m was asked and every node of its tree is in the merged tree."""
        return self.where[m] is not None and all(w is not None for w in self.where[m])

    def member_path(self, m: int, accepted: list[int]) -> list[int]:
        """The longest prefix of the accepted merged path that member m's tree holds, as m's node indices."""
        tree, where = self.trees[m], self.where[m]
        if tree is None:
            return []
        out, parent = [], -1
        for a in accepted:
            mine = next((i for i, w in enumerate(where) if w == a and tree.host_parents[i] == parent), None)
            if mine is None:
                break
            out.append(mine)
            parent = mine
        return out


def sibling_ranks(tree: DraftTree) -> list[int]:
    """Each node's place among its parent's children (in the tree's order)."""
    rank = [0] * len(tree)
    for kids in tree.children:
        for r, c in enumerate(kids):
            rank[c - 1] = r
    return rank


def _union(trees, chance):
    """Every draw of every member, nodes keyed by (merged parent, token), in creation (topological) order."""
    key: dict[tuple[int, int], int] = {}
    tokens, parents, draws = [], [], []
    where: list[list[int] | None] = []
    for m, tree in enumerate(trees):
        if tree is None:
            where.append(None)
            continue
        mine, ranks = [], sibling_ranks(tree)
        for i, (t, p) in enumerate(zip(tree.host_tokens, tree.host_parents)):
            parent = -1 if p < 0 else mine[p]
            node = key.get((parent, t))
            if node is None:
                node = key[(parent, t)] = len(tokens)
                tokens.append(t)
                parents.append(parent)
                draws.append([])
            d = tree.depth[i + 1]
            draws[node].append(Draw(m, i, d, ranks[i], min(MAX_CHANCE, chance(m, d, ranks[i]))))
            mine.append(node)
        where.append(mine)
    return tokens, parents, draws, where


def _score(parents, draws, floor: float, keep_all) -> list[float]:
    """Top-down: keep the draws that clear the floor; score = parent's score * combined chance (0: cut)."""
    score = [0.0] * len(parents)
    for i, p in enumerate(parents):
        above = 1.0 if p < 0 else score[p]
        if above <= 0.0:
            draws[i] = []
            continue
        draws[i] = [d for d in draws[i] if d.member in keep_all or above * d.chance >= floor]
        miss = 1.0
        for d in draws[i]:
            miss *= 1.0 - d.chance
        score[i] = above * (1.0 - miss) if draws[i] else 0.0
    return score


def merge_trees(trees: list[DraftTree | None], chance: Callable[[int, int, int], float], floor: float,
                max_nodes: int, keep_all=frozenset(), device=None) -> DraftTree:
    """One tree from the members' trees (see the module notes); .extra is a `MergedTree`."""
    tokens, parents, draws, where = _union(trees, chance)
    score = _score(parents, draws, floor, keep_all)
    alive = [i for i in range(len(tokens)) if score[i] > 0.0]
    depth = [0] * len(tokens)
    for i, p in enumerate(parents):
        depth[i] = 1 if p < 0 else depth[p] + 1
    keep = set(sorted(alive, key=lambda i: (-score[i], depth[i], i))[:max_nodes])
    flat = depth_first(parents, sorted(keep, key=lambda i: -score[i]))
    index = {old: new for new, old in enumerate(flat)}
    info = MergedTree([draws[i] for i in flat],
                      [None if w is None else [index.get(v) for v in w] for w in where], list(trees))
    info.slot_draws = [[] for _ in range(len(flat) + 1)]
    for new, old in enumerate(flat):
        slot = 0 if parents[old] < 0 else index[parents[old]] + 1
        info.slot_draws[slot] += [(d, new) for d in draws[old]]
    for cell in info.slot_draws:  # the verifier tests a slot's draws member by member, each in its own order
        cell.sort(key=lambda dn: (*tried_before(chance, dn[0].member, dn[0].depth), dn[0].rank))
    merged = DraftTree.from_lists([tokens[i] for i in flat], [index[parents[i]] if parents[i] >= 0 else -1
                                                              for i in flat], device, extra=info)
    merged.sibling_draws = sibling_draws(info, trees)
    return merged


def tried_before(chance: Callable[[int, int, int], float], member: int, depth: int) -> tuple[float, int]:
    """Sort key of the members' draws at a slot of that depth: the member likeliest to pass there first, ties in
    member order (the module notes say why the order must come from the calibration alone)."""
    return -chance(member, depth, 0), member


def sibling_draws(info: MergedTree, trees: list[DraftTree | None]) -> SiblingDraws | None:
    """How each slot's children were drawn, for the verifier; None when every draw is deterministic
    (then the plain rule is exact: a token tested twice as one-hot is rejected the second time)."""
    sampled = [(d.member, d.node) for cell in info.slot_draws for d, _ in cell if trees[d.member].q is not None]
    if not sampled:
        return None
    row_of = {key: r for r, key in enumerate(sampled)}
    q = torch.stack([trees[m].q[i] for m, i in sampled])  # (rows, V): each draw's q
    order = [[(node, row_of.get((d.member, d.node), -1), d.member) for d, node in cell] for cell in info.slot_draws]
    wor = [t is not None and t.draws == WITHOUT_REPLACEMENT for t in trees]
    return SiblingDraws(order, q, wor)
