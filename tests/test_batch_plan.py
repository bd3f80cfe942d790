"""The batch planner: the lanes of one packed step get their budgets together (verify/batch_plan.py)."""
import random

import pytest
import torch

from tests.models import tiny_model
from draftkit.verify.batch_plan import BatchPlanner
from draftkit.verify.contract import Budget, DraftTree, NoDrafter
from draftkit.verify.controller import AutoBudget, CostProfile
from draftkit.verify.estimates import AcceptanceModel
from draftkit.verify.packed import generate_packed


def curve(plain_s: float, ratio_of) -> CostProfile:
    sizes = [1, 2, 4, 8, 16, 32, 64]
    return CostProfile(plain_s, sizes, [ratio_of(n) for n in sizes], context=128)


def lane(profile: CostProfile, rate: float, cap=Budget(4, 4), draft_s_per_level=0.0) -> AutoBudget:
    """A controller that has learned a pass rate per level and what a level of drafting costs."""
    policy = AutoBudget(None, cap, profile=profile, cache_profile=False)
    policy.acceptance = AcceptanceModel(cap.max_depth, prior_rate=rate, prior_weight=1e9)
    for depth in (1, 2, 3, 4):
        policy.draft_cost.observe(depth, draft_s_per_level * depth)
    return policy


def plan(policies, remaining=None, per_step=None, planner=None):
    planner = planner or BatchPlanner(policies)
    n = len(policies)
    return planner.budgets(policies, [1] * n, remaining or [64] * n, per_step or [1.0] * n)


def test_free_drafting_gets_the_whole_cap_for_every_lane():
    policies = [lane(curve(0.01, lambda n: 1.0), 0.7) for _ in range(4)]
    assert [(b.max_depth, b.max_nodes) for b in plan(policies)] == [(4, 4)] * 4


def test_rows_as_dear_as_a_plain_step_make_every_lane_plain():
    """Each row of the forward costs a plain step: a level that passes 60% of the time never pays."""
    policies = [lane(curve(0.01, lambda n: 1.0 + n), 0.6) for _ in range(4)]
    assert all(b.max_depth == 0 for b in plan(policies))


def test_a_batch_drafts_less_than_its_lanes_would_each_alone():
    """A forward that is overhead up to 8 rows, then 0.3 plain steps a row: one lane alone drafts its whole cap
    (8 nodes ride on the overhead); eight lanes' trees together would be 72 rows, and the planner gives less,
    with more committed tokens per second by the batch's own cost model than every lane at its lone choice."""
    profile = curve(0.01, lambda n: 1.0 if n <= 8 else 1.0 + 0.3 * (n - 8))
    alone = lane(profile, 0.8, cap=Budget(8, 8))
    assert alone.budget(100).max_depth == 8
    policies = [lane(profile, 0.8, cap=Budget(8, 8)) for _ in range(8)]
    planner = BatchPlanner(policies)
    budgets = plan(policies, planner=planner)
    depths = [b.max_depth for b in budgets]
    assert sum(depths) < 8 * 8
    models = planner.lane_models(policies, [64] * 8, [1.0] * 8)
    assert planner.rate(models, depths, 8) > planner.rate(models, [8] * 8, 8)


def test_a_lane_far_ahead_stops_drafting_while_the_last_one_drafts():
    """A batch ends with its last lane: the lane with 4 tokens left at 3 a step gives its nodes up to the lane
    with 60 left at 1 a step."""
    profile = curve(0.01, lambda n: 1.0 + 0.15 * n)
    policies = [lane(profile, 0.75), lane(profile, 0.75)]
    ahead, behind = plan(policies, remaining=[4, 60], per_step=[3.0, 1.0])
    assert ahead.max_depth == 0 and behind.max_depth > 0


@pytest.mark.parametrize("seed", range(20))
def test_the_plan_never_loses_to_plain_decoding_by_its_own_model(seed):
    rng = random.Random(seed)
    slope = rng.uniform(0.0, 1.0)
    profile = curve(0.01, lambda n: 1.0 + slope * n ** rng.uniform(0.5, 1.5))
    n = rng.randint(2, 8)
    policies = [lane(profile, rng.uniform(0.05, 0.95), Budget(rng.randint(1, 8), 16), rng.uniform(0, 0.004))
                for _ in range(n)]
    remaining, per_step = [rng.randint(1, 64) for _ in policies], [rng.uniform(1, 4) for _ in policies]
    planner = BatchPlanner(policies)
    models = planner.lane_models(policies, remaining, per_step)
    depths, value = planner.plan(models, n)
    assert value == pytest.approx(planner.rate(models, depths, n))
    assert value >= planner.rate(models, [0] * n, n)
    assert all(0 <= d <= m.top for d, m in zip(depths, models))


def test_the_forward_model_learns_what_the_steps_measured():
    """Steps all of one size rescale the profile's curve; steps of several sizes fit the forward's own line,
    which then prices sizes never run."""
    policies = [lane(curve(0.01, lambda n: 1.0 + 0.1 * n), 0.5) for _ in range(2)]
    planner = BatchPlanner(policies)
    for _ in range(30):
        planner.observe(9, 3 * planner._modeled(9))
    assert planner.forward_s(9) == pytest.approx(3 * planner._modeled(9), rel=0.01)
    planner = BatchPlanner(policies)
    for q in [8, 20, 14, 30, 9, 26] * 3:
        planner.observe(q, 0.022 + 0.0006 * q)  # what an 8-lane forward on two CPU cores measured
    assert planner.forward_s(72) == pytest.approx(0.022 + 0.0006 * 72, rel=0.01)


def test_only_lanes_all_under_the_controller_are_planned():
    auto = AutoBudget(None, Budget(4, 4), profile=curve(0.01, lambda n: 1.0), cache_profile=False)
    from draftkit.verify.budget import FixedBudget

    assert BatchPlanner.over([auto]) is None
    assert BatchPlanner.over([auto, FixedBudget(Budget(2, 2))]) is None
    assert isinstance(BatchPlanner.over([auto, auto]), BatchPlanner)


class Oracle:
    """Proposes the target's own greedy continuation: every node passes, so lanes finish unevenly only by
    what the planner gives them."""

    def __init__(self, model, max_depth=4):
        self.model, self.budget_cap = model, Budget(max_depth, max_depth)

    def reset(self, prompt):
        pass

    def propose(self, state):
        depth = min(state.budget.max_depth, state.budget.max_nodes)
        ids, out = state.tokens[None], []
        for _ in range(depth):
            nxt = self.model(ids).logits[0, -1].argmax()
            out.append(int(nxt))
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
        return DraftTree.chain(out, device=state.tokens.device) if out else DraftTree.empty(state.tokens.device)

    def update(self, result):
        pass


def test_planned_batches_decode_exactly_what_plain_batches_decode():
    torch.manual_seed(0)
    model = tiny_model("llama")
    prompts = [torch.randint(0, 60, (n,)) for n in (5, 9, 7)]
    plain = generate_packed(model, prompts, [NoDrafter() for _ in prompts],
                            max_new_tokens=12, eos_token_id=[], logprobs=False)
    drafted = generate_packed(model, prompts, [Oracle(model) for _ in prompts], max_new_tokens=12, eos_token_id=[],
                              logprobs=False)
    assert [o.tokens.tolist() for o in drafted.outputs] == [o.tokens.tolist() for o in plain.outputs]
    assert any(s.drafted for o in drafted.outputs for s in o.stats.decode_steps)


def test_idle_lanes_of_a_batch_probe_about_as_often_as_one_sequence():
    """Eight idle lanes each probing every 16 steps made a batch probe every other step (DFlash at batch 8: 13%
    of plain batched decoding in probes and their catch-ups); in a batch of n a lane waits up to n times longer,
    and alone again it waits no longer than one sequence's cap."""
    import draftkit.verify.controller as ctl

    profile = curve(0.01, lambda n: 1.0 + n)  # rows as dear as a plain step: every lane idles
    policies = [lane(profile, 0.05) for _ in range(8)]
    planner = BatchPlanner(policies)
    probes = 0
    for _ in range(400):
        probes += sum(b.max_depth > 0 for b in planner.budgets(policies, [1] * 8, [64] * 8, [1.0] * 8))
    assert probes <= 400 * 8 / (ctl.PROBE_WAIT_MAX * 8) + 8 * 5  # the doubling waits on the way up included
    alone = policies[0]
    given = [alone.budget(100).max_depth for _ in range(3 * ctl.PROBE_WAIT_MAX)]
    assert any(given)  # back to one sequence's waits


def test_lanes_whose_siblings_never_pass_draft_their_chains():
    """Tree drafters whose first children pass as often as their whole trees (siblings add nothing) and whose
    rows cost: each lane's 16-node tree would make the shared forward dear, so the plan gives chains."""
    profile = curve(0.01, lambda n: 1.0 + 0.05 * n)
    policies = []
    for _ in range(4):
        policy = lane(profile, 0.7, cap=Budget(4, 16), draft_s_per_level=0.0002)
        policy.chain_acceptance = AcceptanceModel(4, prior_rate=0.7, prior_weight=1e9)
        for _ in range(8):  # the tree's first children seen: the chain is offered
            policy.chain_acceptance.observe(4, 3)
        policies.append(policy)
    budgets = plan(policies)
    assert all(0 < b.max_depth == b.max_nodes for b in budgets)
    for policy in policies:  # with the chain not yet measured, the same lanes draft trees (or nothing)
        policy.chain_acceptance = AcceptanceModel(4)
    assert all(b.max_nodes > b.max_depth or b.max_depth == 0 for b in plan(policies))


def test_rows_layout_prices_a_step_by_its_widest_lane():
    """In the rows layout (a KV row per lane) a step costs f(lanes * width): a lane's nodes are free up to the
    widest lane's rows. A lane that passes 90% a level drafts its cap; one that passes 30% gets nodes only because
    the other lane widened the step anyway, and the plan's rate is the best over every width."""
    profile = curve(0.01, lambda n: 1.0 + 0.1 * n)
    policies = [lane(profile, 0.9, cap=Budget(4, 4)), lane(profile, 0.3, cap=Budget(4, 4))]
    planner = BatchPlanner(policies, rows=True)
    budgets = plan(policies, planner=planner)
    assert [b.max_depth for b in budgets] == [4, 4]
    models = planner.lane_models(policies, [64] * 2, [1.0] * 2)
    best, rate, width = planner.plan_rows(models, [1, 1])
    assert width == 5 and rate >= max(planner.rate_rows(models, [a, b], [1, 1]) for a in range(5) for b in range(5))
    packed = plan(policies, planner=BatchPlanner(policies))  # packed: every node is a row of its own
    assert packed[1].max_depth < 4


@pytest.mark.parametrize("rows", [False, True])
def test_a_plan_inside_the_drafting_margin_steps_plain(rows):
    """As for one sequence (controller.DRAFT_MARGIN): lanes whose best plan beats all-plain by about 1% by the
    model step plain; by about 10%, they draft."""
    from draftkit.verify.controller import DRAFT_MARGIN

    def budgets(rate):  # 4 rows of forward cost 1.15 plain steps, 8 rows 1.35
        policies = [lane(curve(0.01, lambda n: 1.0 + 0.2 * n / 4), rate, cap=Budget(1, 1)) for _ in range(4)]
        planner = BatchPlanner(policies, rows=rows)
        models = planner.lane_models(policies, [64] * 4, [1.0] * 4)
        gain = planner.rate(models, [1] * 4, 4) / planner.rate(models, [0] * 4, 4) - 1
        return gain, [b.max_depth for b in plan(policies, planner=planner)]

    gain, depths = budgets(0.20)
    assert 0 < gain < DRAFT_MARGIN and depths == [0] * 4, (gain, depths)
    gain, depths = budgets(0.35)
    assert gain > DRAFT_MARGIN and depths == [1] * 4, (gain, depths)


def test_the_all_plain_step_is_priced_by_what_plain_steps_measured():
    """A line fitted over drafting steps of many rows overstates the all-plain step: extrapolated, drafting looks
    better than plain; priced by the plain steps' own time, the lanes step plain (and draft again once what the
    plain steps measure makes drafting pay)."""
    def planned(plain_s):
        policies = [lane(curve(0.01, lambda n: 1.0 + 0.1 * n), 0.8, cap=Budget(2, 2), draft_s_per_level=0.005)
                    for _ in range(4)]
        planner = BatchPlanner(policies, rows=True)
        for q in [8, 12, 16, 20] * 3:  # drafting steps: 50 ms + 2 ms a row (4 lanes of width 2-5)
            planner.observe(q, 0.050 + 0.002 * q)
        if plain_s is not None:
            planner.observe(4, plain_s, drafted=False)  # the plain step: 4 lanes of one row
        return [b.max_depth for b in plan(policies, planner=planner)]

    assert all(d > 0 for d in planned(None))  # the line's 58 ms plain step: drafting looks better
    assert planned(0.040) == [0] * 4  # measured 40 ms: plain is better
    assert all(d > 0 for d in planned(0.070))  # measured 70 ms: drafting pays again


def test_each_lane_is_priced_by_its_own_drafters_outlook():
    """Lanes whose controllers learned that steps of outlook 4 pass every level and steps of outlook 1 none: in one
    batch the lane whose drafter says 4 (inside a quote) drafts its cap, the lane whose drafter says 1 steps plain."""
    profile = curve(0.01, lambda n: 1.0 + 0.1 * n)
    outlooks = [4, 1]
    policies = []
    for i in range(2):
        policy = AutoBudget(None, Budget(4, 4), profile=profile, cache_profile=False,
                            outlook=lambda i=i: outlooks[i])
        for look, rate in ((4, 0.95), (1, 0.02)):  # what each outlook's steps passed
            policy._look(look)
            policy.acceptance = AcceptanceModel(4, prior_rate=rate, prior_weight=1e9)
        policy._look(0)
        policies.append(policy)
    budgets = plan(policies)
    assert [b.max_depth for b in budgets] == [4, 0]
    outlooks.reverse()
    assert [b.max_depth for b in plan(policies)] == [0, 4]
