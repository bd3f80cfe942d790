"""Acceptance rules on hand-built logits: never / always / sometimes accepted, and the
statistical check that lossless sampling returns exactly the target distribution."""
import math

import pytest
import torch

from draftkit.verify.contract import DraftTree
from draftkit.verify.accept import Sampling, accept, greedy_accept, sample_accept, target_probs

V = 6


def logits_with_argmax(rows):
    """(len(rows), V) logits whose argmax per row is rows[i]."""
    out = torch.zeros(len(rows), V)
    for i, t in enumerate(rows):
        out[i, t] = 5.0
    return out


CHAIN = DraftTree.chain(torch.tensor([1, 2, 3])).validate()


def test_greedy_always_never_sometimes():
    assert greedy_accept(CHAIN, logits_with_argmax([1, 2, 3, 4])) == ([0, 1, 2], 4)  # always
    assert greedy_accept(CHAIN, logits_with_argmax([5, 2, 3, 4])) == ([], 5)  # never
    assert greedy_accept(CHAIN, logits_with_argmax([1, 2, 0, 4])) == ([0, 1], 0)  # sometimes


def test_greedy_follows_the_matching_branch():
    tree = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, -1, 1, 1])).validate()
    # root wants 2 (node 1), node 1 wants 4 (node 3), node 3 wants 0 -> bonus 0
    assert greedy_accept(tree, logits_with_argmax([2, 0, 4, 0, 0])) == ([1, 3], 0)


def test_sampling_always_and_never():
    gen = torch.Generator().manual_seed(0)
    sure = torch.full((4, V), -1e9)
    for i, t in enumerate([1, 2, 3, 4]):
        sure[i, t] = 0.0
    assert accept(CHAIN, sure, Sampling(temperature=1.0), gen) == ([0, 1, 2], 4)  # p(draft) = 1
    impossible = torch.zeros(4, V)
    impossible[0, 1] = -1e9  # p(first draft token) = 0
    for _ in range(20):
        acc, bonus = accept(CHAIN, impossible, Sampling(temperature=1.0), gen)
        assert acc == [] and bonus != 1  # the rejected token is never the bonus


def test_q_at_least_p_accepts_with_ratio():
    """p(x)/q(x) = 0.5 -> accepted about half the time."""
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([[0.25, 0.25, 0.25, 0.25, 0.0, 0.0], [1 / 6] * 6])
    q = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0, 0.0]])
    tree = DraftTree(torch.tensor([0]), torch.tensor([-1]), q=q).validate()
    hits = sum(sample_accept(tree, p, gen)[0] == [0] for _ in range(4000))
    assert abs(hits / 4000 - 0.5) < 0.03


def test_temperature_top_k_top_p():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    p = target_probs(logits, Sampling(temperature=1.0, top_k=2))
    assert (p[0, 2:] == 0).all() and math.isclose(float(p.sum()), 1.0, rel_tol=1e-6)
    p = target_probs(logits, Sampling(temperature=1.0, top_p=0.5))
    assert p[0, 0] == 1.0  # the top token alone holds more than half of the mass
    cold = target_probs(logits, Sampling(temperature=0.1))
    assert cold[0, 0] > 0.99
    with pytest.raises(ValueError):
        Sampling(temperature=-1)
    with pytest.raises(ValueError):
        Sampling(top_p=0)


def test_typical_acceptance_is_labelled_lossy():
    assert not Sampling(temperature=1.0, acceptance="typical").lossless
    assert Sampling(temperature=1.0).lossless
    assert Sampling(temperature=0.0, acceptance="typical").lossless  # greedy's rule is argmax whatever it says
    tree = DraftTree(torch.tensor([1]), torch.tensor([-1])).validate()
    logits = torch.log(torch.tensor([[0.05, 0.9, 0.05, 1e-9, 1e-9, 1e-9], [1 / 6] * 6]))
    acc, _ = accept(tree, logits, Sampling(temperature=1.0, acceptance="typical"))
    assert acc == [0]


# ---- the statistical check -------------------------------------------------------------
P_ROOT = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.07, 0.03])
Q_ROOT = torch.tensor([0.1, 0.5, 0.1, 0.2, 0.05, 0.05])
N = 20000
TV_BOUND = 0.02  # sampling noise at N = 20000 over 6 cells is about 0.006


def first_token_distribution(make_tree, n=N, seed=0):
    """Empirical distribution of the first committed token (first accepted node or the bonus);
    make_tree(gen) builds a fresh draft for every trial (fresh draws from q)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    for _ in range(n):
        tree = make_tree(gen)
        p_all = torch.cat([P_ROOT[None], torch.full((len(tree), V), 1 / V)])
        acc, bonus = sample_accept(tree, p_all, gen)
        counts[int(tree.tokens[acc[0]]) if acc else bonus] += 1
    return counts / n


def tv(a, b):
    return 0.5 * float((a - b).abs().sum())


def siblings_from_q(k):
    def make(gen):
        draws = torch.multinomial(Q_ROOT, k, replacement=True, generator=gen)
        return DraftTree(draws, torch.full((k,), -1), q=Q_ROOT.expand(k, V)).validate()
    return make


def fixed(tokens):
    tree = DraftTree(torch.tensor(tokens), torch.full((len(tokens),), -1)).validate()
    return lambda gen: tree


@pytest.mark.parametrize("case, make_tree", [
    ("chain_q", siblings_from_q(1)),  # one draft token drawn from q
    ("chain_onehot", fixed([1])),  # a deterministic draft token
    ("tree_q", siblings_from_q(3)),  # three siblings drawn i.i.d. from q (SpecInfer multi-draft)
    ("tree_onehot", fixed([3, 0, 1])),  # distinct deterministic siblings (top-k trees, n-grams)
])
def test_sampling_follows_the_target_distribution(case, make_tree):
    dist = first_token_distribution(make_tree)
    assert tv(dist, P_ROOT) < TV_BOUND, (case, dist)


def test_the_bound_catches_a_wrong_residual():
    """Resampling from p instead of the residual after a rejection (a common bug) is caught."""
    # exact distribution of that wrong rule for one-hot draft x = 1: P(1) = p1 + (1 - p1) p1
    wrong = P_ROOT * (1 - P_ROOT[1])
    wrong[1] = P_ROOT[1] + (1 - P_ROOT[1]) * P_ROOT[1]
    assert tv(wrong, P_ROOT) > 3 * TV_BOUND


def test_sample_from_follows_each_row_and_never_draws_a_zero():
    """The inverse-CDF draw behind every bonus token: unnormalized rows, zeros anywhere (first and last
    included), one row a point mass; chi-square-sized tolerance on 20k draws per row."""
    from draftkit.verify.accept import sample_from

    probs = torch.tensor([[0.0, 2.0, 0.0, 1.0, 1.0, 0.0],
                          [3.0, 0.0, 0.0, 0.0, 0.0, 1.0],
                          [0.0, 0.0, 0.0, 0.0, 5.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_from(probs, gen) for _ in range(20000)])  # (20000, 3)
    for row in range(3):
        freq = torch.bincount(draws[:, row], minlength=6).float() / draws.shape[0]
        exact = probs[row] / probs[row].sum()
        assert freq[exact == 0].sum() == 0
        assert (freq - exact).abs().max() < 0.015, (row, freq, exact)
