"""EAGLE-2's tree selection on the device (drafters/tree_search.select_on_device) and on the host (select_on_host,
what a CPU run takes) against the rule written out with plain loops: the first-ranked chain, then the best candidates by (score, depth, index), in that order; and a tree
chosen on the device reads its topology only when asked."""
import random

import pytest
import torch

from draftkit.drafters.tree_search import select_on_device, select_on_host
from draftkit.verify.contract import DraftTree


def candidates(rng: random.Random, top_k: int, depth: int):
    """A top-k search's candidates: top_k root children, then per level top_k children of each of the top_k best
    new nodes (scores: the parent's plus a log-probability, some of them tied or -inf); the run order."""
    toks, pars, scores, depths, run = [], [], [], [], []

    def children(parent: int, base: float, d: int):
        logps = sorted((rng.choice([-0.1, -0.5, -1.0, -2.0, 0.0, -float("inf")]) for _ in range(top_k)), reverse=True)
        for lp in logps:
            toks.append(rng.randrange(100))
            pars.append(parent)
            scores.append(base + lp)
            depths.append(d)

    children(-1, 0.0, 1)
    frontier = list(range(top_k))
    for d in range(2, depth + 1):
        first = len(toks)
        for f in frontier:
            run.append(f)
            children(f, scores[f], d)
        new = range(first, len(toks))
        frontier = sorted(new, key=lambda i: (-scores[i], i))[:top_k]
    return toks, pars, scores, depths, run


def host_rule(toks, pars, scores, depths, run, total):
    """(tokens, parents, extra) of the selected tree, the rule written out with host loops."""
    n = len(toks)
    total = min(total, n)
    key = lambda i: (-scores[i], depths[i], i)  # noqa: E731
    chain, at = [], -1
    while True:
        kids = [i for i in range(n) if pars[i] == at]
        if not kids:
            break
        best = max(scores[i] for i in kids)
        at = next(i for i in kids if scores[i] == best)
        chain.append(at)
    keep = set(chain[:total])
    for i in sorted(range(n), key=key):
        if len(keep) >= total:
            break
        assert pars[i] < 0 or pars[i] in keep, "the order keeps every node's ancestors first"
        keep.add(i)
    chain = chain[:total]
    flat = chain + sorted(keep - set(chain), key=key)  # the chain, then the rest by score
    where = {old: new for new, old in enumerate(flat)}
    entry = {c: e for e, c in enumerate(run)}
    return ([toks[i] for i in flat], [where[pars[i]] if pars[i] >= 0 else -1 for i in flat],
            [entry.get(i, -1) for i in flat])


@pytest.mark.parametrize("seed", range(40))
def test_the_device_selection_follows_the_rule(seed):
    rng = random.Random(seed)
    top_k, depth = rng.choice([(2, 3), (3, 4), (4, 5), (2, 6)])
    toks, pars, scores, depths, run = candidates(rng, top_k, depth)
    total = rng.randint(depth + 1, len(toks) + 2)
    tree = select_on_device(torch.tensor(toks), torch.tensor(pars), torch.tensor(scores), torch.tensor(depths),
                            torch.tensor(run, dtype=torch.long), total, depth, top_k)
    assert tree.topology_on_device and len(tree) == min(total, len(toks))
    want = host_rule(toks, pars, scores, depths, run, total)
    got = tree.resolve(tree.payload().tolist())
    assert (got.host_tokens, got.host_parents, got.extra) == want
    on_host = select_on_host(toks, pars, scores, depths, run, total, "cpu")  # the host's route to the same tree
    assert (on_host.host_tokens, on_host.host_parents, on_host.extra) == want


def test_a_device_tree_reads_its_topology_once_when_asked_early():
    tree = DraftTree.on_device_topology(torch.tensor([7, 8, 9]), torch.tensor([-1, 0, -1]), torch.tensor([1, 2, 1]),
                                        max_depth=2, max_children=2, extra=torch.tensor([0, -1, 1]))
    assert tree.topology_on_device and tree.validate() is tree  # validating reads nothing
    assert tree.children == [[1, 3], [2], [], []]  # a grammar or a merge asks: read then
    assert not tree.topology_on_device and tree.extra == [0, -1, 1] and tree.depth == [0, 1, 2, 1]
