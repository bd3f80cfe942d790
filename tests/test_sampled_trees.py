"""Sampling through draft trees whose siblings are drawn from q WITHOUT replacement (issue 16).

The verifier's rule for such trees is recursive rejection sampling (Jeon et al. 2024): sibling j
is accepted with min(1, p_j(x_j) / q_j(x_j)), q_j being q without the earlier siblings' tokens
(renormalized), and a rejection leaves p_{j+1} = norm(max(p_j - q_j, 0)). These tests check, with
fixed seeds, that the first two generated tokens follow the exact target distribution through
hand-built trees with a given q, through standalone, EAGLE and Medusa trees sampled by the
drafters, and that two wrong rules are caught by the same statistics:
- treating without-replacement siblings as i.i.d. (q keeps the rejected sibling's token);
- keeping a data-dependent subset of the drawn siblings (EAGLE-2's rerank by the draws' own
  probability), which is why `sampled_tree` grows best-first and never drops a draw.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.drafters.tree_search import gumbel_order, level_widths, run_search, sampled_search
from tests.models import tiny_model
from draftkit.verify.accept import Sampling, sample_accept
from draftkit.verify.contract import IID, WITHOUT_REPLACEMENT, DraftTree
from draftkit.verify.decode import generate as _generate

torch.set_num_threads(1)
P_OK = 1e-3  # a correct rule passes the chi-square test at this level
P_WRONG = 1e-6  # a wrong rule must fail it by far


def generate(*args, **kwargs):
    """The loop with the drafter's fixed cap every step (drafting itself is under test, not the controller)."""
    return _generate(*args, **{"budget": "fixed", **kwargs})


def chi2_pvalue(counts: torch.Tensor, exact: torch.Tensor) -> float:
    """Chi-square goodness of fit of counts against the exact distribution; cells expecting fewer
    than 5 are pooled into one."""
    counts, expected = counts.double().flatten(), (exact.double().flatten() * counts.sum())
    keep = expected >= 5
    f_obs, f_exp = counts[keep], expected[keep]
    if (~keep).any():
        f_obs = torch.cat([f_obs, counts[~keep].sum()[None]])
        f_exp = torch.cat([f_exp, expected[~keep].sum()[None]])
    f_exp = f_exp * f_obs.sum() / f_exp.sum()
    return float(chisquare(f_obs.numpy(), f_exp.numpy()).pvalue)


def tv(counts: torch.Tensor, exact: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - exact).abs().sum())


# ---- hand-built trees with a given q -----------------------------------------------------------
V = 6
_g = torch.Generator().manual_seed(0)
P1 = torch.tensor([0.05, 0.10, 0.30, 0.30, 0.15, 0.10])  # p at the root
P2 = (1.5 * torch.randn(V, V, generator=_g)).softmax(-1)  # p(t2 | t1)
Q1 = torch.tensor([0.60, 0.30, 0.05, 0.03, 0.01, 0.01])  # a peaked draft that disagrees with p
Q2 = (2.5 * torch.randn(V, V, generator=_g)).softmax(-1)  # q(t2 | t1)
EXACT12 = P1[:, None] * P2  # the exact joint of the first two generated tokens


def hand_tree(widths, gen, draws=WITHOUT_REPLACEMENT, keep=None) -> DraftTree:
    """Root: widths[0] children drawn from Q1 without replacement; each depth-1 node: widths[1] children
    drawn from Q2[its token]. q rows: each node's parent's q. keep(token, q_row) -> bool, if given,
    drops draws after the fact (a deliberately wrong, data-dependent selection)."""
    tokens, parents, qs = [], [], []
    for x in gumbel_order(Q1[None], widths[0], gen)[0].tolist():
        if keep is not None and not keep(x, Q1):
            continue
        tokens.append(x), parents.append(-1), qs.append(Q1)
        if len(widths) > 1:
            me = len(tokens) - 1
            for y in gumbel_order(Q2[x][None], widths[1], gen)[0].tolist():
                tokens.append(y), parents.append(me), qs.append(Q2[x])
    q = torch.stack(qs) if qs else torch.zeros(0, V)
    return DraftTree.from_lists(tokens, parents, q=q, draws=draws).validate()


def first_two(tree: DraftTree, gen) -> tuple[int, int]:
    """The first two committed tokens of one step over `tree` (and, when only one token is committed,
    the next plain step's token)."""
    rows = [P1] + [P2[t] if tree.depth[i + 1] == 1 else torch.full((V,), 1 / V) for i, t in enumerate(tree.host_tokens)]
    acc, bonus = sample_accept(tree, torch.stack(rows), gen)
    toks = [tree.host_tokens[a] for a in acc] + [bonus]
    if len(toks) == 1:
        toks.append(int(torch.multinomial(P2[toks[0]], 1, generator=gen)))
    return toks[0], toks[1]


def hand_counts(widths, n, seed, **kw) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V, V)
    for _ in range(n):
        a, b = first_two(hand_tree(widths, gen, **kw), gen)
        counts[a, b] += 1
    return counts


@pytest.mark.parametrize("widths", [(2,), (4,), (3, 2)])
def test_hand_built_trees_follow_the_target(widths):
    counts = hand_counts(widths, 4000, seed=1)
    assert chi2_pvalue(counts, EXACT12) > P_OK, (widths, tv(counts, EXACT12))


@pytest.mark.slow
@pytest.mark.parametrize("widths", [(1,), (3,), (6,), (1, 3), (2, 2), (4, 3)])
def test_hand_built_trees_follow_the_target_more_shapes(widths):
    counts = hand_counts(widths, 6000, seed=2)
    assert chi2_pvalue(counts, EXACT12) > P_OK, (widths, tv(counts, EXACT12))


def test_iid_rule_on_without_replacement_draws_fails():
    """The same draws verified as if i.i.d. (q keeps each rejected sibling's token): biased."""
    counts = hand_counts((3, 2), 4000, seed=1, draws=IID)
    assert chi2_pvalue(counts, EXACT12) < P_WRONG, tv(counts, EXACT12)
    assert tv(counts, EXACT12) > 0.08  # the exact first-token bias of this rule here is 0.125


def test_keeping_draws_by_their_own_probability_fails():
    """Drawing 3 siblings and keeping those with q >= 0.1 (a rerank by the draws' own scores, as
    EAGLE-2's final selection does) keeps a prefix of the draws that depends on the draws: biased."""
    counts = hand_counts((3,), 4000, seed=1, keep=lambda x, q: float(q[x]) >= 0.1)
    assert chi2_pvalue(counts, EXACT12) < P_WRONG, tv(counts, EXACT12)


# ---- the tree the drafters build ---------------------------------------------------------------
def toy_forward(table: torch.Tensor):
    """A draft whose next-token logits depend on the node's token only (for sampled_tree in isolation)."""
    def forward(tokens, parent_rows, block, depths):
        assert block.shape == (tokens.numel(), block.shape[1]) and block[:, -tokens.numel():].diagonal().all()
        return table[tokens]
    return forward


@pytest.mark.parametrize("depth, top_k, max_nodes", [(1, 3, 3), (3, 2, 8), (4, 4, 20), (5, 8, 48), (3, 3, 40)])
def test_sampled_tree_shape(depth, top_k, max_nodes):
    torch.manual_seed(0)
    table = 3 * torch.randn(16, 16)
    root = 3 * torch.randn(16)
    gen = torch.Generator().manual_seed(0)
    widths = level_widths(max_nodes, depth, top_k)
    for _ in range(20):
        tree = run_search(sampled_search(root, depth, top_k, max_nodes, gen, temperature=0.8),
                          toy_forward(table)).validate(16)
        assert tree.draws == WITHOUT_REPLACEMENT and tree.q.shape == (len(tree), 16)
        assert len(tree) == sum(widths) <= max_nodes and tree.max_depth == depth
        assert [tree.depth[1:].count(d) for d in range(1, depth + 1)] == widths
        for slot, kids in enumerate(tree.children):
            toks = [tree.host_tokens[c - 1] for c in kids]
            assert len(toks) == len(set(toks)) <= top_k  # distinct siblings
            want = (root if slot == 0 else table[tree.host_tokens[slot - 1]]).div(0.8).softmax(-1)
            for c in kids:  # each node carries its parent's full q row
                torch.testing.assert_close(tree.q[c - 1], want)
        ran = [e for e in tree.extra if e >= 0]
        assert sorted(ran) == list(range(len(ran)))  # run rows are the draft's pending entries


@pytest.mark.parametrize("max_nodes, depth, top_k, want", [
    (5, 5, 8, [1, 1, 1, 1, 1]),  # a chain
    (12, 4, 4, [3, 3, 3, 3]),  # spread from the root down, round after round
    (9, 4, 4, [3, 2, 2, 2]),
    (40, 3, 3, [3, 9, 9]),  # capped by what a level can draw: 21 nodes
    (6, 3, 2, [2, 2, 2]),
    (10, 2, 3, [3, 7]),
])
def test_level_widths(max_nodes, depth, top_k, want):
    assert level_widths(max_nodes, depth, top_k) == want


def test_sampled_tree_first_child_is_a_draw_from_q():
    """The first sibling at the root is the first draw: distributed as q itself."""
    root = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    q = root.softmax(-1)
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(6)
    for _ in range(3000):
        tree = run_search(sampled_search(root, 2, 3, 6, gen), toy_forward(torch.zeros(6, 6)))
        counts[tree.host_tokens[tree.children[0][0] - 1]] += 1
    assert chi2_pvalue(counts, q) > P_OK


def test_draws_past_the_support_are_never_accepted():
    """A slot keeps a fixed number of draws; past q's support they are tokens of q = 0. The verifier never accepts
    one and leaves p as it was, so the tree follows the target as if they were not there (accepted at p(x) / 0
    they would pass whenever p(x) > 0: far off)."""
    gen = torch.Generator().manual_seed(3)
    q1 = torch.tensor([0.0, 0.0, 0.7, 0.3, 0.0, 0.0])  # two tokens of support, four draws kept
    counts = torch.zeros(V)
    for _ in range(4000):
        tokens = gumbel_order(q1[None], 4, gen)[0].tolist()
        assert sorted(tokens[:2]) == [2, 3]
        tree = DraftTree.from_lists(tokens, [-1] * 4, q=q1.expand(4, V), draws=WITHOUT_REPLACEMENT).validate()
        acc, bonus = sample_accept(tree, torch.stack([P1] + [P2[t] for t in tokens]), gen)
        counts[tokens[acc[0]] if acc else bonus] += 1
    assert chi2_pvalue(counts, P1) > P_OK, tv(counts, P1)


# ---- through the decoding loop with real drafters -----------------------------------------------
VE = 8  # vocabulary of the end-to-end models: 64 cells for the joint of two tokens


def exact_tokens_2_3(model, prompt) -> torch.Tensor:
    """Brute force: P(t2, t3) of the 2nd and 3rd generated tokens at temperature 1 (t1 summed out)."""
    with torch.no_grad():
        p1 = model(input_ids=prompt[None]).logits[0, -1].softmax(-1)
        seqs2 = torch.cat([prompt.expand(VE, -1), torch.arange(VE)[:, None]], 1)
        p2 = model(input_ids=seqs2).logits[:, -1].softmax(-1)
        pairs = torch.tensor(list(itertools.product(range(VE), range(VE))))
        seqs3 = torch.cat([prompt.expand(VE * VE, -1), pairs], 1)
        p3 = model(input_ids=seqs3).logits[:, -1].softmax(-1).view(VE, VE, VE)
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


def as_iid(drafter):
    """The deliberately wrong rule: the drafter's without-replacement trees labelled i.i.d."""
    propose = drafter.propose

    def wrong(state):
        tree = propose(state)
        assert tree.draws == WITHOUT_REPLACEMENT or not len(tree)
        tree.draws = IID
        return tree
    drafter.propose = wrong
    return drafter


def decode_counts(target, prompt, drafter, n: int, max_new_tokens: int = 4):
    """Joint counts of the 2nd and 3rd generated tokens (the prefill commits the 1st; the first draft
    step then holds a tree of depth max_new_tokens - 2) and the draft tokens accepted."""
    counts, accepted = torch.zeros(VE, VE), 0
    for i in range(n):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=max_new_tokens,
                       sampling=Sampling(temperature=1.0), eos_token_id=[], seed=i)
        t = out.tokens.tolist()
        counts[t[1], t[2]] += 1
        accepted += sum(s.accepted for s in out.stats.steps)
        assert out.stats.steps[1].drafted  # the first draft step holds a tree
    return counts, accepted


def standalone_pair():
    target = tiny_model("llama", vocab=VE, hidden=16, layers=1, seed=3)
    small = tiny_model("llama", vocab=VE, hidden=16, layers=1, seed=9)
    with torch.no_grad():  # a peaked draft that often disagrees with the target: the i.i.d. rule's bias on
        target.get_output_embeddings().weight.mul_(2.0)  # the 2nd token is then TV 0.10 (exact, 4 siblings)
        small.get_output_embeddings().weight.mul_(5.0)
    return target, small


def fit_pvalues(counts, exact) -> tuple[float, float]:
    """Chi-square p-values of the joint of the 2nd and 3rd tokens and of the 2nd token alone."""
    return chi2_pvalue(counts, exact), chi2_pvalue(counts.sum(1), exact.sum(1))


PROMPT = torch.tensor([1, 2, 3, 1, 2])


@pytest.mark.parametrize("rule", ["recursive", "wrong-iid"])
def test_standalone_tree_through_the_loop(rule):
    """A depth-2 tree of up to 4 siblings per node, sampled without replacement by the standalone
    drafter: exact with recursive rejection sampling; far off when verified as i.i.d. draws."""
    torch.manual_seed(0)
    target, small = standalone_pair()
    exact = exact_tokens_2_3(target, PROMPT)
    drafter = StandaloneDrafter(small, max_depth=2, top_k=4, max_nodes=8)
    counts, accepted = decode_counts(target, PROMPT, drafter if rule == "recursive" else as_iid(drafter), 1200)
    pvalues = fit_pvalues(counts, exact)
    if rule == "recursive":
        assert accepted > 300  # the drafts really are accepted
        assert min(pvalues) > P_OK, (pvalues, tv(counts, exact))
    else:
        assert min(pvalues) < P_WRONG, (pvalues, tv(counts, exact))


@pytest.mark.slow
@pytest.mark.parametrize("depth, top_k, max_nodes, new", [(2, 2, 3, 4), (3, 4, 12, 5), (3, 8, 8, 5)])
def test_standalone_tree_shapes_follow_the_target(depth, top_k, max_nodes, new):
    torch.manual_seed(0)
    target, small = standalone_pair()
    exact = exact_tokens_2_3(target, PROMPT)
    drafter = StandaloneDrafter(small, max_depth=depth, top_k=top_k, max_nodes=max_nodes)
    counts, accepted = decode_counts(target, PROMPT, drafter, 1500, max_new_tokens=new)
    assert accepted > 300
    assert min(fit_pvalues(counts, exact)) > P_OK, (fit_pvalues(counts, exact), tv(counts, exact))


def eagle_pair(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VE, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, max_position_embeddings=64)
    target = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    torch.manual_seed(seed + 1)
    draft = EagleDraftModel.from_target(target)
    with torch.no_grad():  # a random draft made peaked (q mostly on one or two tokens p does not favour):
        draft.body.norm.weight.mul_(6.0)  # verified as i.i.d. draws, its later siblings would pass far too often
    return target, draft


@pytest.mark.slow
@pytest.mark.parametrize("top_k, max_nodes", [(2, 4), (4, 8)])
def test_eagle_tree_through_the_loop_follows_the_target(top_k, max_nodes):
    target, draft = eagle_pair()
    exact = exact_tokens_2_3(target, PROMPT)
    drafter = EagleDrafter(target, draft, max_depth=2, top_k=top_k, max_nodes=max_nodes)
    counts, accepted = decode_counts(target, PROMPT, drafter, 1500)
    assert accepted > 300
    assert min(fit_pvalues(counts, exact)) > P_OK, (fit_pvalues(counts, exact), tv(counts, exact))


@pytest.mark.slow
def test_eagle_tree_labelled_iid_fails():
    target, draft = eagle_pair()
    exact = exact_tokens_2_3(target, PROMPT)
    drafter = as_iid(EagleDrafter(target, draft, max_depth=2, top_k=4, max_nodes=8))
    counts, _ = decode_counts(target, PROMPT, drafter, 1500)
    assert min(fit_pvalues(counts, exact)) < P_WRONG, (fit_pvalues(counts, exact), tv(counts, exact))


def medusa_pair():
    target, _ = eagle_pair(seed=5)
    torch.manual_seed(6)
    heads = MedusaHeads(32, VE, num_heads=2)
    heads.init_from_lm_head(target.get_output_embeddings())
    with torch.no_grad():
        for proj in heads.proj:
            proj.weight.add_(2.0 * torch.randn_like(proj.weight))
    # ranks (0, 2) under the root's child 1: a slot's children need not name successive ranks
    return target, MedusaDrafter(target, heads, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 2)])


@pytest.mark.slow
def test_medusa_tree_through_the_loop_follows_the_target():
    torch.manual_seed(0)
    target, drafter = medusa_pair()
    exact = exact_tokens_2_3(target, PROMPT)
    counts, accepted = decode_counts(target, PROMPT, drafter, 1500)
    assert accepted > 300
    assert min(fit_pvalues(counts, exact)) > P_OK, (fit_pvalues(counts, exact), tv(counts, exact))


def test_medusa_sampled_tree_is_successive_draws():
    """Each slot's children are the first draws of their head's sequence: distinct, with the head's q."""
    torch.manual_seed(0)
    target, drafter = medusa_pair()
    from draftkit.verify.contract import Budget, DecodeState
    drafter.hidden = torch.randn(32)
    state = DecodeState(PROMPT, 3, Budget(2, 7), greedy=False, temperature=0.7)
    for _ in range(20):
        tree = drafter.propose(state).validate(VE)
        assert tree.draws == WITHOUT_REPLACEMENT and tree.q.shape == (7, VE)
        for kids in tree.children:
            toks = [tree.host_tokens[c - 1] for c in kids]
            assert len(toks) == len(set(toks))
        # children of slots 1 and 2 (two depth-1 nodes) share head 1's draw sequence from its start
        first = [tree.host_tokens[kids[0] - 1] for kids in tree.children[1:] if kids]
        assert len(set(first)) == 1
    greedy = drafter.propose(DecodeState(PROMPT, 3, Budget(2, 7), greedy=True)).validate(VE)
    assert greedy.q is None


def test_a_greedy_tree_keeps_its_first_ranked_chain_where_cumulative_scores_would_drop_it():
    """Every node's best child has probability 0.6 and the next 0.3: ranked by cumulative probability alone, the
    root's second child (0.3) beats the chain's third node (0.216), and a 5-node, depth-4 tree would stop the chain
    at depth 2. The tree keeps the chain the drafter would draft to depth 4, then spends what is left by score."""
    from draftkit.drafters.tree_search import topk_search

    V = 10
    base = torch.full((V,), 0.1 / (V - 2)).log()

    def logits_for(depth_row):  # token (d + 1) % V is the best child at depth d, token (d + 5) % V the second
        out = base.clone()
        out[(depth_row + 1) % V], out[(depth_row + 5) % V] = math.log(0.6), math.log(0.3)
        return out

    def forward(tokens, parent_rows, block, depths):
        return torch.stack([logits_for(int(d)) for d in depths])

    tree = run_search(topk_search(logits_for(0), depth=4, top_k=2, max_nodes=5), forward)
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    chain, at = [], -1
    for want in (1, 2, 3, 4):  # the best child's token at each depth
        at = next(i for i, (p, t) in enumerate(zip(parents, tokens)) if p == at and t == want)
        chain.append(at)
    assert len(chain) == 4 and len(tokens) == 5
    assert 5 in [t for p, t in zip(parents, tokens) if p == -1]  # the fifth node: the root's second child
