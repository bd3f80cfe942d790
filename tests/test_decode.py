"""The decoding loop end to end: greedy equality with plain decoding and with transformers'
generate, EOS and budget edge cases, bad input, and sampling that follows the target."""
import itertools

import pytest
import torch
from scipy.stats import chisquare

import draftkit as dk
from draftkit.verify.contract import DraftTree, NoDrafter
from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.standalone import StandaloneDrafter, check_same_vocabulary
from tests.models import ARCHS, tiny_model
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate as _generate


def generate(*args, **kwargs):
    """The loop with the drafter's fixed cap every step: these tests check drafting itself, not the controller."""
    return _generate(*args, **{"budget": "fixed", **kwargs})


def drafters_for(target, arch):
    small = tiny_model(arch, hidden=16, layers=1, seed=1)
    return {
        "standalone-chain": lambda: StandaloneDrafter(small, max_depth=3),
        "standalone-tree": lambda: StandaloneDrafter(small, max_depth=4, top_k=3, max_nodes=12),
        "self-chain": lambda: StandaloneDrafter(target, max_depth=5),  # accepts everything: long accepted paths
        "self-tree": lambda: StandaloneDrafter(target, max_depth=4, top_k=2, max_nodes=9),
        "lookahead": lambda: LookaheadDrafter(),
        "prompt-lookup": lambda: LookaheadDrafter(window=0),
    }


def plain(model, prompt, n, eos=()):
    return generate(model, prompt, max_new_tokens=n, eos_token_id=list(eos)).tokens.tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_plain_loop_equals_transformers_generate(arch):
    model = tiny_model(arch)
    for seed in range(3):
        prompt = torch.randint(0, 64, (1 + 7 * seed,), generator=torch.Generator().manual_seed(seed))
        ref = model.generate(prompt[None], max_new_tokens=24, do_sample=False, eos_token_id=None,
                             pad_token_id=0)[0, prompt.numel():].tolist()
        assert plain(model, prompt, 24) == ref


@pytest.mark.parametrize("arch", ARCHS)
def test_every_drafter_is_lossless_under_greedy(arch):
    target = tiny_model(arch)
    makers = drafters_for(target, arch)
    for seed, budget in itertools.product(range(3), (1, 7, 30)):
        prompt = torch.randint(0, 64, (1 + 5 * seed,), generator=torch.Generator().manual_seed(seed))
        ref = plain(target, prompt, budget)
        for name, make in makers.items():
            out = generate(target, prompt, drafter=make(), max_new_tokens=budget, eos_token_id=[])
            assert out.tokens.tolist() == ref, (arch, name, seed, budget)
            assert out.stats.new_tokens == len(ref) <= budget


class OracleDrafter:
    """Proposes the next `k` tokens of a known reference, ignoring the budget."""

    hidden_layers = ()

    def __init__(self, reference, k):
        self.reference, self.k = reference, k

    def reset(self, prompt):
        self.prompt_len = prompt.numel()

    def propose(self, state):
        done = state.tokens.numel() - self.prompt_len
        return DraftTree.chain(torch.tensor(self.reference[done:done + self.k] or [0]))

    def update(self, result):
        pass


def test_budget_ending_mid_draft_is_cut_and_full_drafts_are_accepted():
    target = tiny_model("llama")
    prompt = torch.tensor([1, 2, 3])
    ref = plain(target, prompt, 40)
    out = generate(target, prompt, drafter=OracleDrafter(ref, 5), max_new_tokens=15, eos_token_id=[])
    assert out.tokens.tolist() == ref[:15]  # 1 (prefill) + 6 + 6 + a step of 6 cut to 2
    assert [s.committed for s in out.stats.steps] == [1, 6, 6, 2]
    assert out.stats.steps[-1].budget_depth == 1  # the budget was clipped to the tokens left; the oracle ignored it
    assert out.stats.tau == pytest.approx(6.0)
    assert out.stats.acceptance_by_depth() == [1.0] * 5


def test_self_drafting_reaches_the_longest_paths():
    target = tiny_model("llama")
    prompt = torch.tensor([1, 2, 3])
    out = generate(target, prompt, drafter=StandaloneDrafter(target, max_depth=5), max_new_tokens=16, eos_token_id=[])
    assert out.tokens.tolist() == plain(target, prompt, 16)
    assert out.stats.tau == pytest.approx((6 + 6 + 3) / 3)  # the last draft is shortened to the budget


def test_eos_inside_an_accepted_draft_stops_there():
    target = tiny_model("llama")
    prompt = torch.tensor([5, 6, 7])
    ref = plain(target, prompt, 30)
    eos = ref[9]  # a token the self-draft will propose inside a longer accepted run
    stop = ref.index(eos) + 1
    for drafter in (StandaloneDrafter(target, max_depth=6), LookaheadDrafter(), NoDrafter()):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=30, eos_token_id=eos)
        assert out.tokens.tolist() == ref[:stop]


def test_stats_are_consistent():
    target = tiny_model("llama")
    out = generate(target, torch.arange(10),
                   drafter=StandaloneDrafter(tiny_model("llama", hidden=16, layers=1, seed=1), max_depth=3),
                   max_new_tokens=40, eos_token_id=[])
    s = out.stats
    assert s.new_tokens == 40
    assert 1.0 <= s.tau <= 4.0 and 0.0 <= s.alpha <= 1.0
    by_depth = s.acceptance_by_depth()
    assert len(by_depth) == 3 and all(a >= b for a, b in zip(by_depth, by_depth[1:]))
    assert s.draft_s > 0 and s.verify_s > 0


# ---- bad input ------------------------------------------------------------------------
def test_bad_input_gives_clear_errors():
    target = tiny_model("llama", max_len=64)
    with pytest.raises(ValueError, match="at least one token"):
        generate(target, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="context of 64"):
        generate(target, torch.zeros(60, dtype=torch.long), max_new_tokens=10)
    with pytest.raises(ValueError, match="lie in"):
        generate(target, torch.tensor([1, 99]))
    with pytest.raises(ValueError, match="one sequence"):
        generate(target, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="max_depth must be"):
        StandaloneDrafter(target, max_depth=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(target, torch.tensor([1]), max_new_tokens=0)
    for bad in (None, 4.0, True):
        with pytest.raises(TypeError, match="max_new_tokens must be an integer"):
            generate(target, torch.tensor([1]), max_new_tokens=bad)
    with pytest.raises(TypeError, match="top_k must be an integer"):
        Sampling(temperature=1.0, top_k=2.5)
    with pytest.raises(TypeError, match="eos_token_id must be"):
        generate(target, torch.tensor([1]), max_new_tokens=2, eos_token_id="2")
    ref = generate(target, torch.tensor([1, 2]), max_new_tokens=12, eos_token_id=[]).tokens.tolist()
    for eos in ({ref[3]}, torch.tensor([ref[3]]), (ref[3], 63)):  # any collection of ids stops at the first
        stop = ref.index(ref[3]) + 1
        assert generate(target, torch.tensor([1, 2]), max_new_tokens=12, eos_token_id=eos).tokens.tolist() == ref[:stop]
    with pytest.raises(ValueError, match="at least one prompt"):
        dk.generate_batch(target, [], drafter="lookahead")
    with pytest.raises(ValueError, match="prompt 2 must hold at least one token"):  # which of a batch's prompts
        dk.generate_batch(target, [[1, 2], [3], []], drafter="lookahead")
    with pytest.raises(ValueError, match=r"prompt 1's token ids must lie in \[0, 64\)"):
        dk.generate_batch(target, [[1, 2], [3, 64]], drafter="lookahead")
    for method, flags in (("lookahead", {"max_nodes": 0}), ("suffix", {"max_depth": 0})):
        with pytest.raises(ValueError, match="max_depth and max_nodes must be >= 1"):
            dk.make_drafter(method, target, **flags)
    with pytest.raises(TypeError, match="drafter 0 is a str, not a drafter: build one with draftkit.make_drafter"):
        generate(target, torch.tensor([1, 2]), "lookahead")  # verify/'s loop takes drafters, not names


def test_prompts_budgets_drafters_and_stop_ids_of_the_wrong_kind_are_named():
    """What a user passes by mistake is one error that says what it is and what to pass: text or a tokenizer's
    output as the prompt, a prompt of three dimensions or of shape (1, 0), a drafter's class, an object that is not
    a budget policy, a stop id outside the vocabulary (it could never stop)."""
    from draftkit.drafters.suffix import SuffixDrafter

    target = tiny_model("llama", max_len=64)
    cases = [(dict(input_ids="def f():"), TypeError, "the prompt is text; pass its token ids"),
             (dict(input_ids={"input_ids": [1, 2]}), TypeError, r"the prompt is a dict; pass token ids \(its \['input_ids'\]\)"),
             (dict(input_ids=[object()]), TypeError, "must be token ids .* got a list"),
             (dict(input_ids=torch.ones(1, 1, 3, dtype=torch.long)), ValueError, r"must be 1-D or \(1, T\) token ids; got shape \(1, 1, 3\)"),
             (dict(input_ids=torch.ones(1, 0, dtype=torch.long)), ValueError, r"at least one token; got shape \(1, 0\)"),
             (dict(drafter=SuffixDrafter), TypeError, r"drafter 0 is the class SuffixDrafter, not a drafter: build one"),
             (dict(budget=object()), TypeError, "budget must be 'auto', 'fixed', a Budget or a budget policy"),
             (dict(eos_token_id=-1), ValueError, r"eos_token_id -1 is not a token id of this model \(0..63\)"),
             (dict(eos_token_id=[5, 64]), ValueError, "eos_token_id 64 is not a token id")]
    for kwargs, error, says in cases:
        call = dict(input_ids=torch.tensor([1, 2]), max_new_tokens=4) | kwargs
        with pytest.raises(error, match=says):
            generate(target, call.pop("input_ids"), **call)


def test_a_budget_is_taken_as_that_budget_every_step_within_the_drafters_cap():
    from draftkit.verify.budget import FixedBudget, make_policy

    target = tiny_model("llama", max_len=64)
    drafter = StandaloneDrafter(target, max_depth=3)  # cap: depth 3
    policy = make_policy(dk.Budget(2, 8), drafter, target)
    assert isinstance(policy, FixedBudget) and (policy.cap.max_depth, policy.cap.max_nodes) == (2, 3)
    wide = make_policy(dk.Budget(9, 99), drafter, target)
    assert (wide.cap.max_depth, wide.cap.max_nodes) == (3, 3)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    plain = generate(target, prompt, max_new_tokens=12, eos_token_id=[]).tokens.tolist()
    out = generate(target, prompt, drafter, max_new_tokens=12, eos_token_id=[], budget=dk.Budget(2, 2))
    assert out.tokens.tolist() == plain and max(s.budget_depth for s in out.stats.steps) == 2


def test_the_top_level_generate_takes_a_method_name_as_generate_batch_does():
    target = tiny_model("llama", max_len=64)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    plain = generate(target, prompt, max_new_tokens=12, eos_token_id=[]).tokens.tolist()
    out = dk.generate(target, prompt, "lookahead", max_new_tokens=12, eos_token_id=[])
    assert out.tokens.tolist() == plain and out.stats.steps  # decoded through a lookahead drafter built by name
    with pytest.raises(ValueError, match="unknown drafter 'lookahed'"):
        dk.generate(target, prompt, "lookahed")


def test_vocabulary_mismatch_names_both_models():
    with pytest.raises(ValueError, match="target has 64.*draft has 32"):
        check_same_vocabulary(tiny_model("llama"), tiny_model("llama", vocab=32))


# ---- sampling follows the target distribution --------------------------------------------
V = 8


def exact_first_three(model, prompt):
    """Brute force: P(t1, t2, t3) under the target with temperature 1. Returns (V, V, V)."""
    with torch.no_grad():
        p1 = model(input_ids=prompt[None]).logits[0, -1].softmax(-1)
        seqs2 = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = model(input_ids=seqs2).logits[:, -1].softmax(-1)  # (V, V)
        pairs = torch.tensor(list(itertools.product(range(V), range(V))))
        seqs3 = torch.cat([prompt.expand(V * V, -1), pairs], 1)
        p3 = model(input_ids=seqs3).logits[:, -1].softmax(-1).view(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.mark.parametrize("drafter_name", ["standalone-chain-q", "standalone-tree", "lookahead"])
def test_sampling_through_drafts_follows_the_target(drafter_name):
    target = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=3)
    small = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=4)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    make = {"standalone-chain-q": lambda: StandaloneDrafter(small, max_depth=2),
            "standalone-tree": lambda: StandaloneDrafter(small, max_depth=2, top_k=3, max_nodes=6),
            "lookahead": lambda: LookaheadDrafter(ngram=3, window=3)}[drafter_name]
    exact = exact_first_three(target, prompt).sum(0).flatten()  # (t2, t3) after marginalising t1
    n = 1200
    counts = torch.zeros(V * V)
    drafter = make()
    accepted = 0
    for i in range(n):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=3, eos_token_id=[],
                       sampling=Sampling(temperature=1.0), seed=i)
        t = out.tokens.tolist()
        counts[t[1] * V + t[2]] += 1
        accepted += sum(s.accepted for s in out.stats.decode_steps)
    assert accepted > 50  # the drafts really were accepted (otherwise this tests plain sampling)
    expected = (exact * n).double()
    keep = expected >= 5  # chi-square needs expected counts of about 5; pool the rest into one cell
    f_obs, f_exp = counts.double()[keep], expected[keep]
    if (~keep).any():
        f_obs = torch.cat([f_obs, counts.double()[~keep].sum()[None]])
        f_exp = torch.cat([f_exp, expected[~keep].sum()[None]])
    f_exp = f_exp * f_obs.sum() / f_exp.sum()
    assert chisquare(f_obs.numpy(), f_exp.numpy()).pvalue > 1e-3


def test_standalone_checks_the_vocabulary_against_its_target():
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        StandaloneDrafter(tiny_model("llama", vocab=32), max_depth=2, target=tiny_model("llama"))


def test_tokenizer_mismatch_names_both_tokenizers():
    from draftkit.train.data import train_tokenizer

    a = train_tokenizer(["def f(x): return x"] * 50, vocab_size=300)
    b = train_tokenizer(["the quick brown fox jumps"] * 50, vocab_size=300)
    model = tiny_model("llama")
    check_same_vocabulary(model, model, a, a)  # same tokenizer: fine
    with pytest.raises(ValueError, match="tokenizer mismatch.*target.*draft"):
        check_same_vocabulary(model, model, a, b)


def test_drafts_running_past_the_context_end_are_dropped_not_fatal():
    target = tiny_model("llama", max_len=48)
    prompt = torch.arange(10)
    ref = plain(target, prompt, 38)  # fills the context exactly
    for drafter in (LookaheadDrafter(window=7, ngram=4), StandaloneDrafter(target, max_depth=5, top_k=2, max_nodes=9),
                    StandaloneDrafter(target, max_depth=4)):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=38, eos_token_id=[])
        assert out.tokens.tolist() == ref
