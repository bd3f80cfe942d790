"""The suffix drafter: its index (insert, longest suffix match, continuation frequencies,
eviction), the shape of its trees (frequency order, min_prob pruning, budget), greedy
equality with plain decoding on every architecture, sampling that follows the target, and
the repeated-requests task builder."""
import dataclasses
import itertools
import os
import random

import pytest
import torch
from scipy.stats import chisquare

from draftkit.drafters.suffix import SuffixCache, SuffixConfig, SuffixDrafter, SuffixIndex, merge
from tests.models import ARCHS, tiny_model
from draftkit.verify.accept import Sampling
from draftkit.verify.budget import FixedBudget
from draftkit.verify.contract import Budget, DecodeState, Drafter, DraftTree, StepResult
from draftkit.verify.decode import generate as _generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one thread is faster than two, and far steadier on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def generate(target, prompt, drafter=None, **kw):
    """The decoding loop at the drafter's own cap every step (the auto budget may decide not to
    draft at all on a busy machine, and these tests are about what the drafts do)."""
    if drafter is not None:
        kw.setdefault("budget", FixedBudget.of(drafter))
    return _generate(target, prompt, drafter, **kw)


def brute_count(seq, pat):
    return sum(seq[i:i + len(pat)] == pat for i in range(len(seq) - len(pat) + 1))


def propose(drafter, tokens, depth=16, nodes=16):
    """Index `tokens` as the current request (nothing goes to the global index) and propose
    once: (node tokens, parents, tree)."""
    drafter._start(list(tokens))
    tree = drafter.propose(DecodeState(torch.tensor(tokens), len(tokens), Budget(depth, nodes), True))
    tree.validate()
    return tree.host_tokens, tree.host_parents, tree


# ---- the index ----------------------------------------------------------------------------
def test_index_matches_brute_force_counts_matches_and_continuations():
    rng = random.Random(0)
    for _ in range(60):
        seq = [rng.randrange(3) for _ in range(rng.randrange(1, 30))]
        index = SuffixIndex()
        index.extend(seq)
        assert len(index) == len(seq)
        for size in range(1, 5):
            for pat in map(list, itertools.product(range(3), repeat=size)):
                n = brute_count(seq, pat)
                assert index.count(pat) == n, (seq, pat)
                if n:  # what followed pat, the occurrence at the very end left out
                    state = 0
                    for t in pat:
                        state = index.next[state][t]
                    seen = n - (seq[-size:] == pat)
                    want = {c: brute_count(seq, pat + [c]) / seen for c in range(3)} if seen else {}
                    assert index.continuations(state) == pytest.approx({c: p for c, p in want.items() if p})
        # the longest suffix that also ends earlier, and the longest suffix of a pattern seen
        longest = max([k for k in range(1, len(seq)) if brute_count(seq[:-1], seq[-k:])], default=0)
        assert index.longest_repeat()[1] == longest, seq
        probe = [rng.randrange(3) for _ in range(6)]
        seen = max([k for k in range(1, 7) if brute_count(seq, probe[-k:])], default=0)
        assert index.find(probe)[1] == seen, (seq, probe)


def test_longest_suffix_match():
    index = SuffixIndex()
    index.extend([1, 2, 3, 4, 9, 2, 3, 4, 1, 2, 3])
    state, length = index.longest_repeat()  # "1 2 3" occurred before; "4 1 2 3" did not
    assert length == 3 and index.length[state] >= 3
    assert index.find([7, 7, 9, 2, 3])[1] == 3  # "9 2 3" was seen, "7 9 2 3" was not
    assert index.find([5, 5])[1] == 0
    fresh = SuffixIndex()
    assert fresh.longest_repeat() == (0, 0)
    fresh.extend([5, 6, 7])
    assert fresh.longest_repeat()[1] == 0  # nothing repeats


def test_continuation_frequencies():
    a, b, c, d, e = 1, 2, 3, 4, 5
    index = SuffixIndex()
    index.extend([a, b, c, a, b, d, a, b, c, e, a, b])  # "a b" is followed by c, d, c; the last one by nothing yet
    state, length = index.longest_repeat()
    assert length == 2 and index.occ[state] == 4
    assert index.continuations(state) == pytest.approx({c: 2 / 3, d: 1 / 3})


def test_requests_do_not_match_across_their_boundary():
    cache = SuffixCache(max_tokens=100)
    cache.add([1, 2, 3])
    cache.add([4, 5, 6])
    assert cache.index.find([3, 4])[1] == 1  # "3 4" never happened: only "4" matches
    assert cache.index.count([2, 3]) == 1 and cache.index.count([3, 4]) == 0


def test_eviction_keeps_the_global_index_under_its_bound_least_recently_used_first():
    cache = SuffixCache(max_tokens=12)
    seqs = [[10 * i + j for j in range(4)] for i in range(1, 6)]  # 5 requests of 4 distinct tokens
    for s in seqs[:3]:
        cache.add(s)
    assert cache.total == 12 and all(cache.index.count(s) == 1 for s in seqs[:3])
    cache.touch(next(iter(cache.seqs)))  # the oldest was used just now: it outlives the second
    cache.add(seqs[3])
    assert cache.total <= 12
    assert cache.index.count(seqs[0]) == 1 and cache.index.count(seqs[1]) == 0  # LRU went first
    assert cache.index.count(seqs[3]) == 1
    for s in seqs[4:]:
        cache.add(s)
    assert cache.total <= 12
    kept = list(cache.seqs.values())
    assert seqs[4] in kept
    for s in seqs:  # what is kept is indexed, what was evicted is gone
        assert cache.index.count(s) == (1 if s in kept else 0)
    big = SuffixCache(max_tokens=5)
    big.add(list(range(20)))  # longer than the bound: its last tokens are kept
    assert big.total == 5 and big.index.count([15, 16, 17, 18, 19]) == 1


def test_frequent_contexts_walked_by_count_give_the_same_trees(monkeypatch):
    import draftkit.drafters.suffix_index as suffix  # where the automaton reads RANK_FANOUT

    rng = random.Random(2)
    index = SuffixIndex()
    for _ in range(400):  # token 0 followed by one of 40 tokens, skewed: a state with 40 children
        index.extend([0, min(int(rng.expovariate(0.15)), 39) + 1, rng.randrange(41, 44)])
    state = index.next[0][0]
    assert len(index.next[state]) > suffix.RANK_FANOUT
    ranked = [index.speculate(state, n, 4, p) for n, p in [(8, 0.0), (16, 0.05), (30, 0.01)]]
    monkeypatch.setattr(suffix, "RANK_FANOUT", 10 ** 9)  # every state walks its children in dict order
    assert [index.speculate(state, n, 4, p) for n, p in [(8, 0.0), (16, 0.05), (30, 0.01)]] == ranked


def test_merge_shares_prefixes_and_respects_the_cap():
    toks, pars, where = merge([1, 2], [-1, 0], [1, 3, 4], [-1, 0, -1], cap=4)
    assert (toks, pars, where) == ([1, 2, 3, 4], [-1, 0, 0, -1], [0, 2, 3])
    toks, pars, where = merge([1, 2], [-1, 0], [5, 6], [-1, 0], cap=3)
    assert (toks, pars, where) == ([1, 2, 5], [-1, 0, -1], [2, None])


# ---- the trees ----------------------------------------------------------------------------
def test_tree_follows_frequencies_and_prunes_below_min_prob():
    x, y, a, b = 1, 2, 3, 4
    text = [x, y, a, x, y, a, x, y, a, x, y, b, x, y]  # "x y" is followed by a 3 times, b once
    d = SuffixDrafter(use_global=False, min_prob=0.2, alpha=4, offset=0)
    toks, pars, tree = propose(d, text)
    assert d.local.longest_repeat()[1] == 2
    assert toks[:3] == [a, x, y] and pars[:3] == [-1, 0, 1]  # the most frequent path first (0.75 each)
    assert [t for t, p in zip(toks, pars) if p == -1] == [a, b]  # siblings in descending frequency
    assert tree.extra.score >= 3 * 0.75
    toks, pars, _ = propose(SuffixDrafter(use_global=False, min_prob=0.3, alpha=4, offset=0), text)
    assert [t for t, p in zip(toks, pars) if p == -1] == [a]  # b: 0.25 < 0.3, pruned
    assert toks == [a, x, y, a, x, y]  # "x y a x y" is followed by a, a, b: a at 0.75 * 2 / 3
    toks, pars, _ = propose(SuffixDrafter(use_global=False, min_prob=0.6, alpha=4, offset=0), text)
    assert toks == [a, x, y]  # 0.5 < 0.6: the path stops
    d = SuffixDrafter(use_global=False, min_prob=0.0, alpha=4, offset=0)
    d._start(text)  # a budget's min_path_prob prunes like min_prob
    tree = d.propose(DecodeState(torch.tensor(text), len(text), Budget(16, 16, min_path_prob=0.6), True))
    assert tree.host_tokens == [a, x, y]


def test_adaptive_length_and_budget_are_respected():
    rng = random.Random(1)
    for trial in range(40):
        seq = [rng.randrange(4) for _ in range(rng.randrange(2, 120))]
        alpha, offset = rng.choice([(1.0, 0.0), (2.0, 2.0), (0.5, 1.0)])
        depth, nodes = rng.randrange(1, 8), rng.randrange(1, 12)
        d = SuffixDrafter(max_depth=6, max_nodes=10, alpha=alpha, offset=offset, min_prob=0.0, use_global=False)
        toks, pars, tree = propose(d, seq, depth, nodes)
        assert len(toks) <= min(nodes, 10) and (not toks or tree.max_depth <= min(depth, 6))
        match = d.local.longest_repeat()[1]
        assert len(toks) <= max(int(alpha * match + offset + 1e-6), 0)  # the longest match drafts most
    d = SuffixDrafter(use_global=False)
    toks, _, _ = propose(d, [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2], depth=1, nodes=1)
    assert toks == [3]
    assert propose(SuffixDrafter(use_global=False), [1, 2, 3, 4])[0] == []  # nothing repeats: no draft


def test_config_is_the_constructor_and_bad_flags_are_clear():
    fields = {f.name: f for f in dataclasses.fields(SuffixConfig)}
    assert all(f.metadata.get("help") for f in fields.values())
    d = SuffixDrafter(**dataclasses.asdict(SuffixConfig()))
    assert isinstance(d, Drafter) and d.hidden_layers == ()
    assert d.budget_cap == Budget(SuffixConfig.max_depth, SuffixConfig.max_nodes)
    assert SuffixDrafter(**dataclasses.asdict(SuffixConfig(max_depth=3, max_nodes=5))).budget_cap == Budget(3, 5)
    for bad, match in [(dict(max_depth=0), "max_depth"), (dict(max_nodes=-1), "max_nodes"),
                       (dict(min_prob=1.5), "min_prob"), (dict(min_prob=float("nan")), "min_prob"),
                       (dict(alpha=-1.0), "alpha"), (dict(offset=float("inf")), "offset"),
                       (dict(global_max_tokens=0), "global_max_tokens")]:
        with pytest.raises(ValueError, match=match):
            SuffixDrafter(**bad)


# ---- decoding -----------------------------------------------------------------------------
def repetitive_prompt(seed, n=24):
    g = torch.Generator().manual_seed(seed)
    motif = torch.randint(0, 64, (5,), generator=g)
    return torch.cat([motif.repeat(n // 5), torch.randint(0, 64, (n % 5 + 1,), generator=g)])


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_plain_decoding(arch):
    target = tiny_model(arch)
    drafters = [SuffixDrafter(), SuffixDrafter(use_global=False, max_depth=3, max_nodes=4, min_prob=0.0, offset=4)]
    accepted = 0
    prompts = [torch.randint(0, 64, (7,), generator=torch.Generator().manual_seed(9)), repetitive_prompt(1)]
    for prompt, n in [(prompts[0], 40), (prompts[1], 1), (prompts[1], 9), (prompts[1], 40), (prompts[0], 40),
                      (repetitive_prompt(2), 30)]:
        ref = generate(target, prompt, max_new_tokens=n, eos_token_id=[]).tokens.tolist()
        for i, d in enumerate(drafters):  # the same drafters across prompts: the global cache carries over
            out = generate(target, prompt, drafter=d, max_new_tokens=n, eos_token_id=[])
            assert out.tokens.tolist() == ref, (arch, i, n)
            accepted += sum(s.accepted for s in out.stats.decode_steps)
    assert accepted > 20, accepted  # drafts were really accepted (the random models repeat themselves)


def test_global_cache_carries_earlier_requests():
    target = tiny_model("llama")
    prompt = torch.randint(0, 64, (12,), generator=torch.Generator().manual_seed(5))
    taus = {}
    for use_global in (True, False):
        d = SuffixDrafter(use_global=use_global)
        taus[use_global] = [generate(target, prompt, drafter=d, max_new_tokens=48, eos_token_id=[]).stats.tau
                            for _ in range(2)]
    assert taus[True][1] > taus[False][1]  # the second identical request drafts from the first
    assert taus[False][0] == pytest.approx(taus[False][1])  # without the cache, no memory of it
    d = SuffixDrafter()
    first = generate(target, prompt, drafter=d, max_new_tokens=48, eos_token_id=[]).stats.tau
    d.forget()  # a new repeat of a benchmark: nothing carried over
    assert generate(target, prompt, drafter=d, max_new_tokens=48, eos_token_id=[]).stats.tau == pytest.approx(first)
    shared = SuffixCache()
    a, b = SuffixDrafter(global_cache=shared), SuffixDrafter(global_cache=shared)
    generate(target, prompt, drafter=a, max_new_tokens=48, eos_token_id=[])
    a.end_request()
    assert generate(target, prompt, drafter=b, max_new_tokens=48, eos_token_id=[]).stats.tau >= taus[True][1] - 1e-9


def test_skipped_update_resynchronises():
    d = SuffixDrafter(use_global=False)
    d.reset(torch.tensor([1, 2, 3, 1, 2]))
    tree = d.propose(DecodeState(torch.tensor([1, 2, 3, 1, 2, 3, 1]), 5, Budget(4, 4), True))
    assert tree.host_tokens[:1] == [2]  # matched against the state's tokens, not the stale prompt
    d.update(StepResult(torch.tensor([2]), None, None, None, tree, [0]))
    assert d.tokens == [1, 2, 3, 1, 2, 3, 1, 2]


# ---- sampling follows the target ----------------------------------------------------------
V = 8


def exact_first_three(model, prompt):
    """Brute force: P(t1, t2, t3) under the target at temperature 1. Returns (V, V, V)."""
    with torch.no_grad():
        p1 = model(input_ids=prompt[None]).logits[0, -1].softmax(-1)
        seqs2 = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = model(input_ids=seqs2).logits[:, -1].softmax(-1)
        pairs = torch.tensor(list(itertools.product(range(V), range(V))))
        seqs3 = torch.cat([prompt.expand(V * V, -1), pairs], 1)
        p3 = model(input_ids=seqs3).logits[:, -1].softmax(-1).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


def chi_square_pvalue(counts, probs):
    """Pearson's test of counts against probs; cells expected below 5 are pooled into one."""
    expected = probs.double() * counts.sum()
    keep = expected >= 5
    f_obs, f_exp = counts.double()[keep], expected[keep]
    if (~keep).any():
        f_obs = torch.cat([f_obs, counts.double()[~keep].sum()[None]])
        f_exp = torch.cat([f_exp, expected[~keep].sum()[None]])
    return chisquare(f_obs.numpy(), (f_exp * f_obs.sum() / f_exp.sum()).numpy()).pvalue


def test_sampling_through_suffix_drafts_follows_the_target():
    target = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=3)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    exact = exact_first_three(target, prompt)  # (t1, t2, t3)
    n = 600
    counts = torch.zeros(V, V, V)
    drafter = SuffixDrafter(min_prob=0.0, offset=2)  # one drafter: earlier samples fill its global cache
    accepted = 0
    for i in range(n):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=3, eos_token_id=[],
                       sampling=Sampling(temperature=1.0), seed=i)
        t1, t2, t3 = out.tokens.tolist()
        counts[t1, t2, t3] += 1
        accepted += sum(s.accepted for s in out.stats.decode_steps)
    assert accepted > 100  # the drafts really were accepted (otherwise this tests plain sampling)
    # the pairs the drafts decide: (t1, t2) and (t2, t3), 64 cells each
    assert chi_square_pvalue(counts.sum(2).flatten(), exact.sum(2).flatten()) > 1e-3
    assert chi_square_pvalue(counts.sum(0).flatten(), exact.sum(0).flatten()) > 1e-3
    # total variation of the joint law, beside what n exact samples reach (fixed seed)
    p = exact.flatten()
    tv = 0.5 * (counts.flatten() / n - p).abs().sum().item()
    g = torch.Generator().manual_seed(0)
    noise = [0.5 * (torch.bincount(torch.multinomial(p, n, replacement=True, generator=g), minlength=V ** 3)
                    / n - p).abs().sum().item() for _ in range(20)]
    assert tv < 1.2 * max(noise), (tv, max(noise))


# ---- the repeated-requests task -----------------------------------------------------------
def test_repeated_requests_share_their_tail_and_differ_before_it():
    from transformers import AutoTokenizer

    from draftkit.eval.repeated import INSTRUCTION, build_repeated

    tok = AutoTokenizer.from_pretrained(os.path.join(ROOT, "zoo", "tokenizer"))
    prompts = build_repeated(tok, n=4, length=96, seed=0)
    assert len(prompts) == 4 and all(len(p) == 96 for p in prompts)
    tail = len(tok(INSTRUCTION)["input_ids"])
    assert len({tuple(p[-tail:]) for p in prompts}) == 1  # the same instruction and fragment
    assert len({tuple(p[:16]) for p in prompts}) == 4  # different files before it
    assert build_repeated(tok, n=4, length=96, seed=0) == prompts
    with pytest.raises(ValueError, match="length"):
        build_repeated(tok, n=2, length=10)


def test_outlook_follows_the_match_length():
    """outlook() (contract.Drafter.outlook) rises with the longest match: 1 with none, 4 once the text quotes 8 or
    more tokens of what came before; the global index's matches count too."""
    passage = list(range(100, 120))
    d = SuffixDrafter(use_global=False)
    d.reset(torch.tensor(passage + [7]))
    assert d.outlook() == 1
    seen = []
    for t in passage[:9]:  # the answer quotes the passage
        d.update(StepResult(torch.tensor([t]), None, None, None, DraftTree.empty(), []))
        seen.append(d.outlook())
    assert seen[0] == 1 and seen[1:3] == [2, 2] and seen[3:7] == [3] * 4 and seen[7:] == [4, 4]
    g = SuffixDrafter()
    g.reset(torch.tensor(passage))
    g.update(StepResult(torch.tensor([7]), None, None, None, DraftTree.empty(), []))
    g.reset(torch.tensor([7] + passage[:9]))  # the first request went to the global index
    assert g.outlook() == 4
