"""The cost-aware budget controller across steps and sequences: when it measures the plain step, how an idle
drafter probes and backs off, what a new sequence starts from, and pass rates kept per outlook (the choices of
one step, and that the output never changes, are tests/test_controller.py)."""
import copy

import pytest

from draftkit.verify.contract import Budget
from draftkit.verify.controller import AutoBudget
from draftkit.verify.estimates import AcceptanceModel
from draftkit.verify.stats import StepStats
from tests.test_controller import feed, flat

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


def test_levels_below_a_draft_that_passed_to_its_end_age():
    """Levels a fully passed draft did not reach keep older text's evidence; each such step ages it, so the prior
    (the level above's rate) comes back: suffix on a quote kept drafting 3 levels, all passing, while levels 4-6
    held the 0.24 of quotes that had ended there. A step stopped by the text ages nothing."""
    model = AcceptanceModel(6)
    for _ in range(30):
        model.observe(depth=6, accepted=3)  # earlier quotes: levels 4-6 failed
    model.carry_over(4)  # a new sequence
    before, evidence = model.rates()[3], (model.reached[3].value, model.passed[3].value)
    stopped = copy.deepcopy(model)
    for _ in range(15):
        model.observe(depth=3, accepted=3)
        stopped.observe(depth=3, accepted=2)
    assert model.rates()[3] > before + 0.08 and model.rates()[:3] == pytest.approx([0.99] * 3, abs=0.01)
    assert (stopped.reached[3].value, stopped.passed[3].value) == evidence


def idle_drafter_probes(profile, steps: int = 300, passes_from: int | None = None) -> tuple[list, AutoBudget]:
    """(depth, nodes) given per step to a tree drafter (cap 8 levels x 32 nodes: 4 nodes a level) whose drafts
    never pass, or from step `passes_from` on always pass to their last level."""
    policy = AutoBudget(None, Budget(8, 32), profile=profile, cache_profile=False)
    given = []
    for i in range(steps):
        b = policy.budget(100)
        given.append((b.max_depth, b.max_nodes))
        if b.max_depth:
            hit = b.max_depth if passes_from is not None and i >= passes_from else 0
            policy.observe(StepStats(b.max_nodes, b.max_depth, hit, 1 + hit, 0.0002,
                                     profile.plain_s * profile.c(b.max_nodes), budget_depth=b.max_depth,
                                     budget_nodes=b.max_nodes, first_accepted=hit), 100)
        else:
            policy.observe(StepStats(0, 0, 0, 1, 0.0, profile.plain_s), 100)
    return given, policy


def test_an_idle_drafter_probes_with_one_level_of_two_nodes_where_a_second_node_is_free():
    """A drafter that stopped paying is probed now and then with the cheapest draft that can tell whether it pays
    again: one level, two nodes where the verify curve is flat (a GPU's; a probe at the cap cost up to 5% of plain
    decoding)."""
    import draftkit.verify.controller as ctl

    given, _ = idle_drafter_probes(flat(0.0, plain_s=0.01))
    late = [g for g in given[100:] if g[0]]
    assert late and all(g == (1, ctl.PROBE_NODES) for g in late)
    assert len(late) <= 200 // ctl.PROBE_WAIT_MAX + 1


def test_where_a_second_node_is_dear_a_probe_drafts_one_and_a_passing_one_revives_the_tree():
    """SmolLM2 on a 2-core CPU: one node verifies at a plain step's cost, two at 1.31 of it; an idle drafter's
    probes (which mostly fail) draft the first candidate alone. Observed as the tree's first level (and its first
    child), probes that pass bring drafting back."""
    from draftkit.verify.cost_profile import CostProfile

    sizes = [1, 2, 4, 8, 16, 32, 64]
    cpu = CostProfile(0.035, sizes, [1.0, 1.31, 1.51, 2.34, 3.09, 4.5, 7.0], context=128)
    given, _ = idle_drafter_probes(cpu)
    late = [g for g in given[100:] if g[0]]
    assert late and all(g == (1, 1) for g in late)
    given, policy = idle_drafter_probes(cpu, steps=400, passes_from=300)
    assert all(g == (1, 1) for g in given[100:300] if g[0])
    assert sum(d > 2 for d, _ in given[360:]) > 30  # drafting deep again (its chain first: the probes were first
    # children, and the tree's rates keep 200 failures' memory)
    assert policy.acceptance.rates()[0] > 0.1 and policy.chain_acceptance.rates()[0] > 0.9


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


def test_delivery_is_what_priced_steps_accepted_per_token_promised():
    """`AcceptanceModel.delivery`: 1 with no evidence or when steps accept what was promised; steps that accept
    nothing lower it within a few steps (the short memory) while the long memory has barely moved; a lucky run
    after a steady history raises it only as far as the long memory moves; always within DELIVERY_RANGE; a new text
    keeps at most DELIVERY_CARRY steps of the long memory."""
    from draftkit.verify.estimates import DELIVERY_CARRY, DELIVERY_RANGE

    m = AcceptanceModel(4)
    assert m.delivery() == 1.0
    for _ in range(60):
        m.settle(2.0, 2.0)
    assert m.delivery() == pytest.approx(1.0)
    for _ in range(4):
        m.settle(2.0, 0.0)
    long, short = (d.ratio() for d in m.deliveries)
    assert m.delivery() == short < 0.65 and long > 0.85
    lucky = AcceptanceModel(4)
    for _ in range(60):
        lucky.settle(2.0, 2.0)
    for _ in range(5):
        lucky.settle(2.0, 6.0)
    long, short = (d.ratio() for d in lucky.deliveries)
    assert lucky.delivery() == long < short
    for promised, delivered, bound in ((2.0, 0.0, DELIVERY_RANGE[0]), (1.0, 3.0, DELIVERY_RANGE[1])):
        m = AcceptanceModel(4)
        for _ in range(200):
            m.settle(promised, delivered)
        assert m.delivery() == bound
    m.carry_over(4.0)
    assert m.deliveries[0].steps.value == pytest.approx(DELIVERY_CARRY)


def test_observed_reach_leaves_the_optimistic_prior_out():
    """What a step settles against: the rates the observations alone give (a level never seen takes the level
    above's; level 1, the prior): after ten failures at level 1, nothing, where `reach` still holds the prior's
    share."""
    assert AcceptanceModel(3).observed_reach() == pytest.approx([0.8, 0.64, 0.512])
    m = AcceptanceModel(4)
    for _ in range(10):
        m.observe(depth=1, accepted=0)
    assert m.observed_reach() == [0.0] * 4 and m.reach()[0] > 0.1


@pytest.mark.parametrize("cap", [Budget(4, 4), Budget(4, 8), Budget(8, 8)])
def test_a_silent_text_after_a_quoting_one_is_drafted_only_a_few_steps(cap):
    """A drafter whose every level passed on one text (a quote) and nothing on the next: the new text starts from
    a few observations of passing levels, and the levels below the first are never tried again, so their rates
    still promise a deep draft. What the steps then deliver against that promise cuts the price within a few
    steps: 11-16 drafted steps of 60 on the silent text, against 26-29 with the rates alone."""
    policy = AutoBudget(None, cap, profile=flat(0.06), cache_profile=False)
    drafted = []
    for passing in (True, False):
        policy.start(100)
        drafted.append(0)
        for _ in range(60):
            b = policy.budget(100)
            if not b.max_depth:
                policy.observe(StepStats(0, 0, 0, 1, 0.0, 0.01), 100)
                continue
            got = b.max_depth if passing else 0
            policy.observe(StepStats(b.max_nodes, b.max_depth, got, got + 1, 0.0002 * b.max_depth,
                                     0.01 * (1 + 0.06 * b.max_nodes), budget_depth=b.max_depth,
                                     budget_nodes=b.max_nodes, first_accepted=got), 100)
            drafted[-1] += 1
    assert drafted[0] >= 55 and drafted[1] <= 20, drafted
