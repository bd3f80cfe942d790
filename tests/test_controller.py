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


def test_the_plain_step_is_measured_even_while_drafting_seems_to_pay():
    """Drafted steps pay a cost the profile does not hold (here 1.6x its curve: say a sampled tree's acceptance),
    plain steps do not. Inferring the plain time from the drafted steps' scale would make plain decoding look
    1.6x slower and keep a losing drafter drafting; the policy measures a plain step instead, then idles."""
    import draftkit.verify.controller as ctl

    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(1, 8), profile=profile, cache_profile=False)
    policy.acceptance = AcceptanceModel(1, prior_rate=0.5, prior_weight=1e9)  # 1.5 tokens a drafted step
    given = []
    for _ in range(200):
        b = policy.budget(100)
        given.append(b.max_depth)
        if b.max_depth:  # 1.6 x c(8) = 2.24 plain steps for 1.5 tokens: a loss
            policy.observe(StepStats(8, 1, 1, 2, 0.0005, 1.6 * profile.plain_s * profile.c(8)), 100)
        else:
            policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s), 100)
    assert given[:ctl.PLAIN_FIRST + 1] == [1] * ctl.PLAIN_FIRST + [0]  # the first plain step, as promised
    assert policy.plain_s == pytest.approx(profile.plain_s)
    assert sum(given[50:]) / 150 < 0.1  # then only the occasional probe drafts


def test_a_drafter_that_pays_is_interrupted_only_to_measure_the_plain_step():
    import draftkit.verify.controller as ctl

    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(1, 8), profile=profile, cache_profile=False)
    policy.acceptance = AcceptanceModel(1, prior_rate=0.95, prior_weight=1e9)
    given = []
    for _ in range(300):
        b = policy.budget(100)
        given.append(b.max_depth)
        verify = profile.plain_s * profile.c(8) if b.max_depth else profile.plain_s
        policy.observe(StepStats(8 if b.max_depth else 0, b.max_depth, b.max_depth, 2, 0.0005, verify,
                                 budget_depth=b.max_depth, budget_nodes=b.max_nodes), 100)
    plain = [i for i, d in enumerate(given) if d == 0]
    assert plain[0] == ctl.PLAIN_FIRST and len(plain) <= 2 + 300 // ctl.PLAIN_EVERY


def test_a_lane_s_share_of_a_batch_step_is_not_taken_for_a_plain_step():
    """In a batch of 4, a lane that drafted nothing is charged 1 row of the forward: a quarter of a plain step.
    Taken as its plain step, it would make the lane's own drafting look four times dearer than it is."""
    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(1, 8), profile=profile, cache_profile=False)
    policy.start(100)
    policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s / 4, lanes=4), 100)
    assert policy.plain_s is None
    # the batch's last lane, alone at the end, still attends over every lane's entries: not a plain step either
    policy.observe(StepStats(0, 0, 0, 1, 0.0, 3 * profile.plain_s, lanes=1), 100)
    assert policy.plain_s is None
    policy.start(100)  # a single sequence
    policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s, lanes=1), 100)
    assert policy.plain_s == pytest.approx(profile.plain_s)


def test_levels_never_tried_are_no_better_than_the_level_above():
    """A drafter that passes level 1 one step in five and was never tried deeper: the deeper levels take level
    1's rate as their prior, so a deep budget promises about 1.25 tokens, not the 1.8 that a fixed 0.8 prior gave."""
    m = AcceptanceModel(8)
    for i in range(100):
        m.observe(depth=1, accepted=int(i % 5 == 0))
    rates = m.rates()
    assert rates[0] == pytest.approx(0.2, abs=0.03)
    assert all(b <= a + 1e-12 for a, b in zip(rates, rates[1:]))
    assert 1 + sum(m.reach()) < 1.3
    fresh = AcceptanceModel(8).rates()
    assert fresh == pytest.approx([0.8] * 8)  # a new drafter still starts optimistic


def test_the_prior_fades_with_the_evidence():
    """A drafter whose level 1 passes 2% of the time is estimated near 2% once it has been tried a few hundred
    times: a prior that kept its weight (2 against at most 33 remembered steps) held the estimate at 4.6% or more,
    enough to keep an n-gram drafter drafting a node a step at a loss under sampling."""
    m = AcceptanceModel(4)
    for i in range(300):
        m.observe(depth=1, accepted=int(i % 50 == 0))
    assert m.rates()[0] < 0.03
    few = AcceptanceModel(4)
    few.observe(depth=1, accepted=0)
    assert few.rates()[0] > 0.5  # one failure does not yet outweigh the optimistic prior


def test_an_idle_drafter_probes_with_one_level_of_two_nodes():
    """A drafter that stopped paying (cap 8 levels x 32 nodes: 4 nodes a level) is probed now and then with the
    cheapest draft that can tell whether it pays again: one level, two nodes (a probe at the cap cost up to 5% of
    plain decoding)."""
    import draftkit.verify.controller as ctl

    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(8, 32), profile=profile, cache_profile=False)
    given = []
    for _ in range(300):
        b = policy.budget(100)
        given.append((b.max_depth, b.max_nodes))
        if b.max_depth:  # level 1 never passes
            policy.observe(StepStats(b.max_nodes, b.max_depth, 0, 1, 0.0002, profile.plain_s * profile.c(b.max_nodes)),
                           100)
        else:
            policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s), 100)
    late = [g for g in given[100:] if g[0]]
    assert late and all(g == (1, ctl.PROBE_NODES) for g in late)
    assert len(late) <= 200 // ctl.PROBE_WAIT_MAX + 1


def test_a_probe_s_catch_up_does_not_make_drafting_look_dearer():
    """A probe after idle steps also runs every idle token through the draft (EAGLE's catch-up): its drafting
    time bounds a steady step's from above. It may lower the fitted cost, never raise it; a drafted step that
    is not a probe still can."""
    profile = flat(0.0, plain_s=0.01)
    policy = AutoBudget(None, Budget(1, 2), profile=profile, cache_profile=False)
    policy.acceptance = AcceptanceModel(1, prior_rate=0.05, prior_weight=1e9)  # never pays: idles, probes
    policy.draft_cost.observe(1, 0.001)
    probes = 0
    for _ in range(200):
        b = policy.budget(100)
        if b.max_depth:
            probes += 1
            policy.observe(StepStats(b.max_nodes, 1, 0, 1, 0.02, profile.plain_s, budget_depth=1,
                                     budget_nodes=b.max_nodes), 100)  # 20x the steady cost
        else:
            policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s), 100)
    assert probes >= 5 and policy.draft_cost(1) == pytest.approx(0.001)
    policy.observe(StepStats(2, 1, 0, 1, 0.02, profile.plain_s), 100)  # not a probe: a dearer drafter now
    assert policy.draft_cost(1) > 0.002


def test_an_idle_drafter_plans_again_only_after_a_drafted_step(monkeypatch):
    """While the plan says depth 0 nothing it rests on changes until a probe drafts: the idle steps reuse it (each
    plan costs a silent drafter about 1% of a plain step in Python), and the step after a probe plans afresh."""
    profile = flat(0.0, plain_s=0.01)
    policy = AutoBudget(None, Budget(1, 2), profile=profile, cache_profile=False)
    policy.acceptance = AcceptanceModel(1, prior_rate=0.05, prior_weight=1e9)  # never pays: idles, probes
    policy.draft_cost.observe(1, 0.001)
    plans, plan = [], policy.plan
    monkeypatch.setattr(policy, "plan", lambda *a, **k: plans.append(1) or plan(*a, **k))
    probes = 0
    for _ in range(100):
        b = policy.budget(100)
        probes += bool(b.max_depth)
        policy.observe(StepStats(b.max_nodes, b.max_depth, 0, 1, 0.001 if b.max_depth else 0.0, profile.plain_s,
                                 budget_depth=b.max_depth, budget_nodes=b.max_nodes), 100)
    assert probes >= 3 and len(plans) == probes + 1  # the first step, then once after each probe


def test_a_new_sequence_starts_from_a_few_observations_and_probes_at_once():
    """What a drafter passed on earlier requests says little about the next text (suffix on a real chat model:
    nothing on chat, most of a summary): a policy that learned to idle starts a new sequence from at most CARRY
    observations a level, its rate kept, and probes on its first idle step; a passing probe then lets it draft
    deep within a few steps."""
    import draftkit.verify.controller as ctl

    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(4, 4), profile=profile, cache_profile=False)
    feed(policy, 300, depth=4, accepted=0, draft_s=0.0002, verify_s=0.012)
    before = policy.acceptance.rates()[0]
    assert policy.acceptance.reached[0].value > ctl.CARRY and before < 0.1
    policy.start(50)
    assert policy.acceptance.reached[0].value == pytest.approx(ctl.CARRY)
    assert before < policy.acceptance.rates()[0] < policy.acceptance.prior_rate
    given = []
    for _ in range(8):  # the new text: whatever is drafted passes
        b = policy.budget(100)
        given.append(b.max_depth)
        if b.max_depth:
            policy.observe(StepStats(b.max_nodes, b.max_depth, b.max_depth, b.max_depth + 1, 0.0002,
                                     profile.plain_s * profile.c(b.max_nodes), budget_depth=b.max_depth,
                                     budget_nodes=b.max_nodes), 100)
        else:
            policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s), 100)
    assert given[0] >= 1  # it drafts (or probes) at once
    assert max(given) == 4, given


def test_a_passing_probe_is_followed_by_another_and_a_failing_one_backs_off():
    """An idle drafter's probe that pays (two tokens for about a step) is what the text does now: the next step probes again, so a run of
    passing probes feeds the acceptance model step by step (backed off, suffix idled 16 steps between two passing
    probes of a summary it then drafted 16 levels deep). A failing probe backs off as before."""
    profile = flat(0.05, plain_s=0.01)
    policy = AutoBudget(None, Budget(4, 4), profile=profile, cache_profile=False)
    policy.acceptance = AcceptanceModel(4, prior_rate=0.01, prior_weight=1e9)  # the plan always idles

    def run(steps, passes):
        probes = []
        for i in range(steps):
            b = policy.budget(100)
            if b.max_depth:
                probes.append(i)
                ok = passes(len(probes))
                policy.observe(StepStats(b.max_nodes, 1, int(ok), 1 + int(ok), 0.0002, profile.plain_s,
                                         budget_depth=1, budget_nodes=b.max_nodes), 100)
            else:
                policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s), 100)
        return probes

    failing = run(200, lambda k: False)
    assert all(b - a > 1 for a, b in zip(failing, failing[1:]))  # never two probes in a row
    assert failing[-1] - failing[-2] >= 16  # backed off
    passing = run(40, lambda k: True)
    assert len(passing) >= 20 and passing[-5:] == list(range(35, 40))  # once one passed: a probe every step
    after = run(100, lambda k: False)
    assert len(after) <= 5  # the first failure: back to the back-off it had reached


def test_pass_rates_are_kept_per_outlook():
    """A drafter that tells before each step how far its draft should pass (contract.Drafter.outlook: suffix's match
    length) is priced by what steps of that outlook passed: inside a quote (outlook 4, every level passes) the
    budget is the deepest from the quote's first step, while between quotes (outlook 1, nothing passes) it idles;
    with one set of rates for both, a quote's first steps are priced by the chat's failures."""
    def turns(policy, outlook):
        for _ in range(3):  # quotes and chat in turns, each long enough to learn it
            outlook[0] = 4
            feed_priced(policy, 12, accepted=8)
            outlook[0] = 1
            feed_priced(policy, 40, accepted=0)
        outlook[0] = 4

    seen = [1]
    policy = AutoBudget(None, Budget(8, 8), profile=flat(0.2), cache_profile=False, outlook=lambda: seen[0])
    turns(policy, seen)
    assert sum(d == 0 for d, _ in policy.choices[-20:]) >= 17  # chat: plain steps (and a rare probe)
    assert policy.budget(100).max_depth == 8  # a quote's first step drafts deep at once
    blind = AutoBudget(None, Budget(8, 8), profile=flat(0.2), cache_profile=False)  # one set of rates for both
    turns(blind, [1])
    assert blind.budget(100).max_depth == 0
    assert policy.outlook == 4 and set(policy._by_outlook) == {0, 1}  # (0: before the first step)
    policy.start(100)  # a new sequence carries every outlook's evidence over
    assert policy._by_outlook[1][0].reached[0].value == pytest.approx(4.0)


def feed_priced(policy, steps, accepted, draft_s=0.0004):
    """Steps whose verification costs what the profile says (flat(0.2): 20% of a plain step a node)."""
    for _ in range(steps):
        b = policy.budget(100)
        drafted = b.max_nodes if b.max_depth else 0
        got = min(accepted, b.max_depth)
        policy.observe(StepStats(drafted, b.max_depth, got, got + 1, draft_s if drafted else 0.0,
                                 0.01 * (1 + 0.2 * drafted), budget_depth=b.max_depth, budget_nodes=b.max_nodes,
                                 first_accepted=got), 100)
