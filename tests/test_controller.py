"""The cost-aware budget controller: the seeds' rule, its choices at the extremes, and that it never
changes what is generated."""

import pytest
import torch

from tests.models import ARCHS, tiny_model
from tests.test_packed import tv_bound
from draftkit.verify.accept import Sampling
from draftkit.verify.contract import Budget, DraftTree
from draftkit.verify.controller import AutoBudget, CostProfile
from draftkit.verify.estimates import AcceptanceModel, seeds_best_k, seeds_speedup
from draftkit.verify.decode import generate
from draftkit.verify.stats import StepStats


@pytest.mark.parametrize("alpha, k, s", [(0.5, 2, 1.458), (0.7, 4, 1.981), (0.75, 5, 2.192), (0.9, 10, 3.431)])
def test_seeds_rule_matches_the_formula_not_the_seed_table(alpha, k, s):
    """S = (1 - a^(K+1)) / ((1 - a)(K phi + 1)) at phi = 0.1, best K and S computed by hand from the formula
    (the seed's own table says 1.35 / K 5 / 1.86 / K 5 / 2.03 / K 8 / 2.59, which the formula does not give)."""
    best, speed = seeds_best_k(alpha, 0.1)
    assert best == k and speed == pytest.approx(s, abs=1e-3)
    assert seeds_speedup(alpha, k + 1, 0.1) < speed and seeds_speedup(alpha, k - 1, 0.1) < speed


def test_seeds_rule_edges():
    assert seeds_best_k(0.0, 0.1) == (0, 1.0)  # nothing is ever accepted: do not draft
    assert seeds_speedup(1.0, 4, 0.0) == 5.0  # everything accepted, free drafts: K + 1 tokens a step


def flat(ratio_per_node=0.0, plain_s=0.01):
    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostProfile(plain_s, sizes, [1 + ratio_per_node * n for n in sizes], context=128)


def feed(policy, steps, depth, accepted, draft_s, verify_s):
    for _ in range(steps):
        b = policy.budget(100)
        drafted = b.max_nodes if b.max_depth else 0
        policy.observe(StepStats(drafted, depth if drafted else 0, accepted if drafted else 0, accepted + 1,
                                 draft_s if drafted else 0.0, verify_s, budget_depth=b.max_depth,
                                 budget_nodes=b.max_nodes, first_accepted=accepted if drafted else 0), 100)


def test_always_wrong_drafter_gets_budget_zero():
    policy = AutoBudget(None, Budget(6, 6), profile=flat(0.05), cache_profile=False)
    feed(policy, 60, depth=6, accepted=0, draft_s=0.004, verify_s=0.012)
    last = policy.choices[-30:]
    assert sum(d == 0 for d, _ in last) >= 25  # plain steps, with a rare probe
    assert any(d > 0 for d, _ in policy.choices[-60:])  # but it keeps probing


def test_always_right_drafter_with_flat_verify_gets_the_deepest_budget():
    policy = AutoBudget(None, Budget(8, 16), profile=flat(0.0), cache_profile=False)
    feed(policy, 40, depth=8, accepted=8, draft_s=0.0005 * 8, verify_s=0.01)
    assert policy.choices[-1][0] == 8 and sum(d == 8 for d, _ in policy.choices) > 0.8 * len(policy.choices)
    assert policy.summary()["predicted_speedup"] > 3


def test_costly_verify_shortens_the_budget():
    """Same acceptance (0.7 per level), verify cost rising steeply with the tree: a shallower choice."""
    cheap, dear = (AutoBudget(None, Budget(8, 8), profile=flat(r), cache_profile=False) for r in (0.0, 0.3))
    for policy in (cheap, dear):
        policy.acceptance = AcceptanceModel(8, prior_rate=0.7, prior_weight=1e9)
        for depth in (1, 4):  # drafting costs 0.5 ms per level
            policy.draft_cost.observe(depth, 0.0005 * depth)
    assert cheap.plan()[0] > dear.plan()[0] >= 1


@pytest.mark.parametrize("rate, drafts", [(0.02, False), (0.05, True)])
def test_a_gain_inside_the_margin_is_a_plain_step(rate, drafts):
    """Free verification and drafting: one level passing 2% of the time predicts 2% more tokens per second than a
    plain step, inside DRAFT_MARGIN (3%), so the step is plain; passing 5% of the time, it drafts."""
    policy = AutoBudget(None, Budget(1, 1), profile=flat(0.0), cache_profile=False)
    policy.acceptance = AcceptanceModel(1, prior_rate=rate, prior_weight=1e9)
    policy.draft_cost.observe(1, 0.0)
    best, _, gains, times = policy.plan()
    assert gains[1] / times[1] > gains[0] / times[0]  # the model's best is drafting either way
    assert (best == 1) == drafts


def test_draft_cost_separates_fixed_and_per_level_cost():
    from draftkit.verify.estimates import DraftCost

    cost = DraftCost(keep=1.0)
    for depth in (1, 2, 4, 1, 4):
        cost.observe(depth, 0.004 + 0.001 * depth)  # 4 ms once per step, 1 ms per level
    assert cost(8) == pytest.approx(0.012) and cost(0) == 0.0
    single = DraftCost(keep=1.0)
    single.observe(2, 0.006)  # one depth only: half fixed, half per level
    assert single(2) == pytest.approx(0.006) and single(4) == pytest.approx(0.009)


def test_acceptance_model_counts_tried_levels_only():
    m = AcceptanceModel(4, prior_weight=0.0, keep=1.0)
    m.observe(depth=4, accepted=1)  # level 1 passed, level 2 failed, 3 and 4 never tried
    m.observe(depth=4, accepted=4)
    rates = m.rates()
    assert rates[0] == 1.0 and rates[1] == 0.5 and rates[2] == 1.0 and rates[3] == 1.0


class WrongDrafter:
    """Always proposes a token the target will not pick (greedy) under its budget."""

    hidden_layers = ()
    budget_cap = Budget(4, 4)

    def __init__(self, model):
        self.model = model

    def reset(self, prompt):
        pass

    def propose(self, state):
        with torch.no_grad():
            logits = self.model(input_ids=state.tokens[None]).logits[0, -1]
        wrong = int(logits.argmin())
        return DraftTree.chain([wrong] * state.budget.max_depth)

    def update(self, result):
        pass


def test_controller_falls_back_to_plain_decoding_on_a_real_loop():
    target = tiny_model("llama")
    drafter = WrongDrafter(target)
    prompt = torch.tensor([1, 2, 3])
    out = generate(target, prompt, drafter, max_new_tokens=60, eos_token_id=[])
    ref = generate(target, prompt, max_new_tokens=60, eos_token_id=[])
    assert out.tokens.tolist() == ref.tokens.tolist()
    steps = out.stats.decode_steps
    assert sum(s.drafted == 0 for s in steps[-30:]) >= 25


@pytest.mark.parametrize("arch", ARCHS)
def test_auto_budget_never_changes_greedy_output(arch):
    from draftkit.drafters.lookahead import LookaheadDrafter
    from draftkit.drafters.standalone import StandaloneDrafter

    target = tiny_model(arch)
    small = tiny_model(arch, hidden=16, layers=1, seed=1)
    for drafter in (StandaloneDrafter(small, max_depth=4, top_k=2, max_nodes=8), StandaloneDrafter(target),
                    LookaheadDrafter()):
        for seed in range(2):
            prompt = torch.randint(0, 64, (4 + 3 * seed,), generator=torch.Generator().manual_seed(seed))
            ref = generate(target, prompt, max_new_tokens=40, eos_token_id=[]).tokens.tolist()
            out = generate(target, prompt, drafter, max_new_tokens=40, eos_token_id=[], budget="auto")
            assert out.tokens.tolist() == ref, (arch, type(drafter).__name__)


@pytest.mark.slow
def test_auto_budget_keeps_sampling_exact():
    """First two sampled tokens through an auto-budgeted standalone chain follow the exact target distribution."""
    from draftkit.drafters.standalone import StandaloneDrafter

    V = 8
    target = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=3)
    small = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=4)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    with torch.no_grad():
        p1 = target(input_ids=prompt[None]).logits[0, -1].softmax(-1)
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = target(input_ids=seqs).logits[:, -1].softmax(-1)
    exact = (p1[:, None] * p2).flatten()
    drafter = StandaloneDrafter(small, max_depth=2)
    n, counts = 1500, torch.zeros(V * V)
    for i in range(n):
        out = generate(target, prompt, drafter, max_new_tokens=3, eos_token_id=[], sampling=Sampling(temperature=1.0),
                       seed=i)
        a, b = out.tokens.tolist()[:2]  # the second one went through a drafted step
        counts[a * V + b] += 1
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    assert tv < tv_bound(exact, n), tv  # a fixed 0.08 sat at the noise of 1,500 draws over 64 pairs


def _stubbed_profiles(monkeypatch, profile):
    """CostProfile.for_model returns `profile`; the list records each call's `refresh`."""
    import draftkit.verify.controller as ctl

    calls = []

    def for_model(model, context, cache=True, refresh=False, verifier=None, max_nodes=None):
        calls.append(refresh)
        return profile

    monkeypatch.setattr(ctl.CostProfile, "for_model", staticmethod(for_model))
    return calls


def test_a_profile_off_by_a_factor_is_rescaled_and_never_measured_again_mid_run(monkeypatch):
    """A profile saved while the machine was twice as slow, then drafted steps dearer still than the curve (a
    sampled tree's acceptance): the steps rescale every size (measured or not), plain steps measure the plain
    step, and no sequence pays for measuring the profile again."""
    calls = _stubbed_profiles(monkeypatch, flat(0.05, plain_s=0.02))
    policy = AutoBudget(None, Budget(4, 4), cache_profile=False)
    true = flat(0.05, plain_s=0.01)  # the machine now: half the profile's times
    for extra in (1.0, 1.6, 1.6):
        policy.start(100)
        for i in range(40):
            if i % 8 == 0:
                policy.observe(StepStats(0, 0, 0, 1, 0.0, true.plain_s), 100)
            else:
                policy.observe(StepStats(4, 4, 2, 3, 0.001, extra * true.plain_s * true.c(4)), 100)
        assert policy.scale == pytest.approx(0.5 * extra, rel=0.02)
    assert policy.verify_time(64) == pytest.approx(1.6 * true.plain_s * true.c(64), rel=0.02)  # a size never run
    assert policy.verify_time(0) == pytest.approx(0.01, rel=0.02)  # the plain steps' own
    assert calls == [False]  # measured once, when the policy first saw this context


def test_one_slow_step_moves_the_scale_by_a_bounded_factor():
    """A sequence's first drafted step that took 4.4 times the curve (a first forward's one-off work) priced every
    later step so: one step now moves the scale by at most SCALE_STEP, and a machine that really is that much
    slower is followed within a few steps."""
    from draftkit.verify.controller import SCALE_STEP

    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(4, 4), profile=profile, cache_profile=False)
    step = lambda extra: StepStats(4, 4, 2, 3, 0.001, extra * profile.plain_s * profile.c(4))  # noqa: E731
    policy.observe(step(4.4), 100)
    assert policy.scale == pytest.approx(SCALE_STEP)
    for _ in range(3):
        policy.observe(step(1.0), 100)
    assert policy.scale < 1.6
    slower = AutoBudget(None, Budget(4, 4), profile=profile, cache_profile=False)
    for _ in range(12):
        slower.observe(step(4.0), 100)
    assert slower.scale == pytest.approx(4.0, rel=0.1)


def test_plan_never_makes_a_bigger_tree_cheaper_to_verify():
    policy = AutoBudget(None, Budget(4, 8), profile=flat(0.1), cache_profile=False)
    policy.correction = {2: 1.5, 4: 0.6}  # noisy per-size corrections: 4 nodes "cheaper" than 2
    _, _, _, times = policy.plan()
    assert all(b >= a for a, b in zip(times, times[1:]))


def test_at_the_cap_only_a_level_s_own_cost_prunes_paths():
    """Drafting at the deepest budget: the path floor comes from what the last level costs (here almost nothing),
    not from the step's average cost per depth, which would cut every tree down to its first level."""
    policy = AutoBudget(None, Budget(4, 8), profile=flat(0.0), cache_profile=False)
    policy.acceptance = AcceptanceModel(4, prior_rate=0.8, prior_weight=1e9)
    for depth in (1, 4):
        policy.draft_cost.observe(depth, 0.0001 * depth)  # 0.1 ms a level against a 10 ms plain step
    budget = policy.budget(100)
    assert budget.max_depth == 4
    assert budget.min_path_prob < 0.05
