"""The hybrid under sampling (drafters/hybrid.py, drafters/tree_merge.py): merged trees of deterministic, i.i.d.
and without-replacement members follow the target exactly (and testing a shared node once is caught as biased),
suffix + EAGLE through the loop at temperature 0.8 follow it, and the node budget is split among the members
before they draft."""
from __future__ import annotations

import itertools

import pytest
import torch

from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.hybrid import HybridDrafter
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.drafters.tree_merge import merge_trees
from draftkit.verify.accept import Sampling
from draftkit.verify.contract import IID, WITHOUT_REPLACEMENT, Budget, DraftTree, SiblingDraws
from tests.test_hybrid import calibrate, generate
from tests.test_sampled_trees import (EXACT12, Q1, Q2, V, VE, chi2_pvalue, eagle_pair, first_two, fit_pvalues,
                                      gumbel_order, tv)

torch.set_num_threads(1)
P_OK, P_WRONG = 1e-3, 1e-6  # p-values: an exact sampler passes the first, a biased one falls under the second


# ---- sampling: hand-built merged trees -----------------------------------------------------------
def member_trees(gen):
    """Three members: a deterministic one (tokens 0 and 3, and 4 under 0, as n-gram drafters propose),
    one drawing 2 siblings from Q1 without replacement (Q1 favours token 0: duplicates of the first
    member's 0 are frequent) and 2 under each, one drawing a path i.i.d. from a flatter q."""
    det = DraftTree.from_lists([0, 3, 4], [-1, -1, 0]).validate()
    toks, pars, qs = [], [], []
    for x in gumbel_order(Q1[None], 2, gen)[0].tolist():
        toks.append(x), pars.append(-1), qs.append(Q1)
        me = len(toks) - 1
        for y in gumbel_order(Q2[x][None], 2, gen)[0].tolist():
            toks.append(y), pars.append(me), qs.append(Q2[x])
    wor = DraftTree.from_lists(toks, pars, q=torch.stack(qs), draws=WITHOUT_REPLACEMENT).validate()
    flat = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.1, 0.1])
    x = int(torch.multinomial(flat, 1, generator=gen))
    y = int(torch.multinomial(Q2[x], 1, generator=gen))
    iid = DraftTree.from_lists([x, y], [-1, 0], q=torch.stack([flat, Q2[x]]), draws=IID).validate()
    return [det, wor, iid]


def first_draw_only(tree: DraftTree) -> None:
    """The deliberately wrong rule: a node proposed by several members is tested at its first draw only
    (the later draws of the same token, and what they take out of p, are forgotten)."""
    sd = tree.sibling_draws
    order = [[d for j, d in enumerate(cell) if d[0] not in {e[0] for e in cell[:j]}] for cell in sd.order]
    tree.sibling_draws = SiblingDraws(order, sd.q, sd.without_replacement)


EVEN = lambda m, d, r: 0.5  # noqa: E731
# the members tested in reverse order at the root and in their own order below it (likeliest first)
BY_DEPTH = lambda m, d, r: (0.3, 0.6, 0.9)[m] / (1 + r) if d == 1 else (0.9, 0.6, 0.3)[m] / (1 + r)  # noqa: E731


def merged_first_two(gen, wrong=False, chance=EVEN):
    tree = merge_trees(member_trees(gen), chance, 0.0, 64).validate(V)
    if wrong:
        first_draw_only(tree)
    return first_two(tree, gen)


def merged_counts(n, seed, **kw):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(n):
        a, b = merged_first_two(gen, **kw)
        counts[a, b] += 1
    return counts


@pytest.mark.parametrize("chance", [EVEN, BY_DEPTH], ids=["member-order", "likeliest-first"])
def test_heterogeneous_merged_trees_follow_the_target(chance):
    counts = merged_counts(4000, seed=3, chance=chance)
    assert chi2_pvalue(counts, EXACT12) > P_OK, tv(counts, EXACT12)


def test_testing_a_shared_node_once_is_biased():
    counts = merged_counts(2000, seed=3, wrong=True)
    assert chi2_pvalue(counts, EXACT12) < P_WRONG, tv(counts, EXACT12)
    assert tv(counts, EXACT12) > 0.1


def test_a_slots_draws_are_tested_likeliest_member_first():
    """Under sampling a later member is tested against what the earlier ones left of p: the member likeliest to
    pass at a depth goes first there, each member's draws together and in their own order."""
    merged = merge_trees(member_trees(torch.Generator().manual_seed(0)), BY_DEPTH, 0.0, 64).validate(V)
    for slot, cell in enumerate(merged.extra.slot_draws):
        members = [d.member for d, _ in cell]
        want = sorted(members, reverse=slot == 0)  # depth 1: member 2 is likeliest; deeper: member 0
        assert members == want, (slot, members)
        for m in set(members):
            ranks = [d.rank for d, _ in cell if d.member == m]
            assert ranks == sorted(ranks)
    assert [d.member for d, _ in merged.extra.slot_draws[0]][0] == 2


# ---- sampling: suffix + EAGLE through the loop at temperature 0.8 ------------------------------------
def exact_tokens_2_3(model, prompt, temperature: float) -> torch.Tensor:
    """P(t2, t3) of the 2nd and 3rd generated tokens at `temperature` (t1 summed out)."""
    with torch.no_grad():
        sm = lambda x: (x / temperature).softmax(-1)  # noqa: E731
        p1 = sm(model(input_ids=prompt[None]).logits[0, -1])
        p2 = sm(model(input_ids=torch.cat([prompt.expand(VE, -1), torch.arange(VE)[:, None]], 1)).logits[:, -1])
        pairs = torch.tensor(list(itertools.product(range(VE), range(VE))))
        p3 = sm(model(input_ids=torch.cat([prompt.expand(VE * VE, -1), pairs], 1)).logits[:, -1]).view(VE, VE, VE)
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


def suffix_eagle_counts(n: int):
    target, draft = eagle_pair()
    prompt = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2])  # the suffix index proposes the repetition
    exact = exact_tokens_2_3(target, prompt, 0.8)
    eagle = EagleDrafter(target, draft, max_depth=2, top_k=4, max_nodes=6)
    hybrid = HybridDrafter([("suffix", SuffixDrafter(use_global=False)), ("eagle", eagle)], max_depth=2, max_nodes=6,
                           skip=False)  # both members draft every step, whatever they cost
    counts, accepted = torch.zeros(VE, VE), 0
    sampling = Sampling(temperature=0.8)
    for i in range(n):
        out = generate(target, prompt, hybrid, max_new_tokens=4, sampling=sampling, eos_token_id=[], seed=i)
        t = out.tokens.tolist()
        counts[t[1], t[2]] += 1
        accepted += sum(s.accepted for s in out.stats.steps)
    return counts, exact, accepted, hybrid


def test_suffix_and_eagle_at_temperature_08_follow_the_target():
    counts, exact, accepted, hybrid = suffix_eagle_counts(1000)
    assert accepted > 200 and min(hybrid.member_accepted.values()) > 0  # both members' drafts are accepted
    assert min(fit_pvalues(counts, exact)) > P_OK, (fit_pvalues(counts, exact), tv(counts, exact))


def test_sampled_shares_go_to_the_member_whose_next_node_adds_most():
    """Under sampling the node budget is split before drafting: a member accepted 5% of the time gets no node
    of a 4-level chain whose other member passes 70% a level (0.7^4 = 0.24 > 0.05); a member on probe gets one;
    past the depth the further nodes are level-1 siblings of the member that fails there more often, except in a
    chain step (one node per level), where each member drafts a chain within its own cap."""
    hybrid = HybridDrafter([("a", SuffixDrafter()), ("b", SuffixDrafter())], max_depth=4, max_nodes=8)
    calibrate(hybrid, 0.7, 0.05)  # first-ranked draws: a passes 70 of 100 at every level, b 5 of 100
    a, b = hybrid.members
    assert hybrid._shares([a, b], Budget(4, 4), greedy=False) == {"a": 4, "b": 0}
    b.probe = True
    assert hybrid._shares([a, b], Budget(4, 4), greedy=False) == {"a": 3, "b": 1}
    b.probe = False
    assert hybrid._shares([a, b], Budget(4, 4), greedy=True) == {"a": 4, "b": 4}
    shares = hybrid._shares([a, b], Budget(4, 8), greedy=False)
    assert shares["a"] + shares["b"] == 8 and shares["a"] >= 4
    a.drafter.budget_cap = Budget(2, 8)  # in a chain step a member drafts its own chain: no siblings past its cap
    assert hybrid._shares([a, b], Budget(4, 4), greedy=False)["a"] == 2
    assert hybrid._shares([a, b], Budget(4, 4), greedy=True) == {"a": 2, "b": 4}
    assert hybrid._shares([a, b], Budget(4, 8), greedy=True) == {"a": 8, "b": 8}


def test_a_sampled_share_counts_only_where_the_members_tried_first_failed():
    """b's first node (0.7 alone) sits beside a's at the root and passes only when a's failed (0.3 of the time):
    0.7 * 0.3 = 0.21, below a's second level (0.8^2 = 0.64), so a chain step of two levels stays a's chain."""
    hybrid = HybridDrafter([("a", SuffixDrafter()), ("b", SuffixDrafter())], max_depth=4, max_nodes=8)
    calibrate(hybrid, 0.8, 0.7)
    a, b = hybrid.members
    assert hybrid._shares([a, b], Budget(2, 2), greedy=False) == {"a": 2, "b": 0}
    assert hybrid._shares([a, b], Budget(4, 4), greedy=False) == {"a": 4, "b": 0}  # 0.21 < 0.8^4 = 0.41
    assert hybrid._shares([a, b], Budget(4, 5), greedy=False)["b"] == 1  # past a's chain: b's 0.21 is the best
