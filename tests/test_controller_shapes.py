"""The controller's two shapes for a tree drafter (verify/controller.py): its tree, or its chain of first children,
chosen by what each shape's drafted steps realized; simulated steps, no model."""
import random

from draftkit.verify.contract import Budget, DraftTree
from draftkit.verify.controller import AutoBudget
from draftkit.verify.stats import StepStats
from tests.test_controller import flat


def next_budget(policy, given: list, now: list, plain_s: float):
    """The policy's next budget, recorded in `given`; a plain step is run here (None returned)."""
    b = policy.budget(100)
    given.append(b)
    if b.max_depth:
        return b
    now[0] += plain_s
    policy.observe(StepStats(0, 0, 0, 1, 0.0, plain_s), 100)
    return None


def shaped_steps(policy, steps: int, first_pass: float, tree_pass: float, per_node: float, seed: int = 0,
                 overhead: float = 0.0):
    """Run a tree drafter's controller on simulated steps: each level passes with `tree_pass` when a tree was
    drafted (some sibling passed), and its first child alone with `first_pass`; a chain passes `first_pass`.
    Verifying costs plain_s * (1 + per_node * nodes); every step also takes `overhead` seconds that no step
    reports (the loop's own time). Returns the budgets given."""
    rng, plain_s, given, now = random.Random(seed), policy.profile.plain_s, [], [0.0]
    policy.clock = lambda: now[0]  # simulated time: each step takes what it reports
    for _ in range(steps):
        b = next_budget(policy, given, now, plain_s)
        if b is None:
            continue
        chain = b.max_nodes == b.max_depth
        accepted = first = 0
        for _ in range(b.max_depth):
            hit_first = rng.random() < first_pass
            if not (hit_first or (not chain and rng.random() < (tree_pass - first_pass) / (1 - first_pass))):
                break
            accepted += 1
            first += first == accepted - 1 and hit_first
        step = StepStats(b.max_nodes, b.max_depth, accepted, accepted + 1, 0.0002 * b.max_depth,
                         plain_s * (1 + per_node * b.max_nodes), budget_depth=b.max_depth, budget_nodes=b.max_nodes,
                         first_accepted=first)
        now[0] += step.draft_s + step.verify_s + overhead
        policy.observe(step, 100)
    return given


def test_a_tree_whose_siblings_never_pass_is_drafted_as_its_chain():
    """Sampling-like: the first child passes 70% of the time and the other siblings add nothing, each node costs
    5% of a plain step: the chain (4 nodes for 4 levels) beats the 16-node tree, and the controller drafts it,
    with runs of the tree now and then (its rates measured again)."""
    import draftkit.verify.controller as ctl

    policy = AutoBudget(None, Budget(4, 16), profile=flat(0.05), cache_profile=False)
    given = shaped_steps(policy, 400, first_pass=0.7, tree_pass=0.7, per_node=0.05)[100:]
    chains = [b for b in given if b.max_depth and b.max_nodes == b.max_depth]
    trees = [b for b in given if b.max_nodes > b.max_depth]
    assert len(chains) > 0.8 * len(given)
    assert 0 < len(trees) <= ctl.EXPLORE_RUN * (len(given) // ctl.CHAIN_EXPLORE + 1)


def test_a_tree_whose_siblings_pass_stays_a_tree():
    """Greedy-like: the tree passes 90% of its levels, its first children alone 50%: the tree pays for its nodes."""
    policy = AutoBudget(None, Budget(4, 16), profile=flat(0.02), cache_profile=False)
    given = shaped_steps(policy, 300, first_pass=0.5, tree_pass=0.9, per_node=0.02)[100:]
    assert sum(b.max_nodes > b.max_depth for b in given) > 0.75 * len(given)  # the rest: runs of the chain


def test_the_shape_is_chosen_by_what_each_realized_not_by_the_model():
    """Each step also pays time no step reports (four plain steps' worth): the model, blind to it, puts the chain
    (fewer tokens a step, so more steps) ahead; what the steps realized puts the tree ahead, and the tree drafts
    most steps (the median of five simulated runs: one run's share moves with its luck, 0.51-0.84 of the steps in
    these five; the model's choice, the chain, would leave the tree its exploring runs, about 0.15)."""
    shares = []
    for seed in range(5):
        policy = AutoBudget(None, Budget(4, 16), profile=flat(0.05), cache_profile=False)
        given = shaped_steps(policy, 400, first_pass=0.7, tree_pass=0.8, per_node=0.05, overhead=0.04, seed=seed)
        given = given[100:]
        best, chain, gains, times = policy.plan(chain=True)
        tree_best, _, tree_gains, tree_times = policy.plan(chain=False)
        assert gains[best] / times[best] > tree_gains[tree_best] / tree_times[tree_best]  # the model: the chain
        shares.append(sum(b.max_nodes > b.max_depth for b in given) / len(given))
    assert sorted(shares)[2] > 0.6, shares  # the steps: the tree


def test_a_chain_drafter_has_one_shape():
    policy = AutoBudget(None, Budget(4, 4), profile=flat(0.05), cache_profile=False)
    given = shaped_steps(policy, 100, first_pass=0.7, tree_pass=0.7, per_node=0.05)
    assert policy.shapes() == [False] and all(b.max_nodes == b.max_depth for b in given)


def test_first_children_counts_the_accepted_path_through_first_children():
    # root's children 0, 1; node 0's: 2, 3; node 2's: 4, 5 (the first child listed first)
    tree = DraftTree.from_lists([10, 11, 12, 13, 14, 15], [-1, -1, 0, 0, 2, 2]).validate()
    assert tree.first_children([0, 2, 4]) == 3
    assert tree.first_children([0, 2, 5]) == 2
    assert tree.first_children([0, 3]) == 1
    assert tree.first_children([1, 3]) == 0 and tree.first_children([]) == 0


def jump_steps(policy, steps: int, pass_rate: float, deep_rate: float, first_rate: float | None = None,
               seed: int = 0):
    """Simulated steps on a curve that jumps at 4 nodes (1.05 plain steps up to 3 nodes, 1.6 from 4: a CPU BLAS's
    small products); level 1 passes `pass_rate` in a tree and `first_rate` by its first child (a chain's chance;
    default: the same), every deeper level `deep_rate`."""
    from draftkit.verify.cost_profile import CostProfile

    rng, now, given = random.Random(seed), [0.0], []
    policy.clock = lambda: now[0]
    cost = lambda n: 1.05 if n <= 3 else 1.6  # noqa: E731
    plain_s = policy.profile.plain_s
    for _ in range(steps):
        b = next_budget(policy, given, now, plain_s)
        if b is None:
            continue
        first = pass_rate if first_rate is None else first_rate
        by_first = rng.random() < first  # level 1 by the first child; a tree's siblings may pass where it fails
        accepted = int(by_first or b.max_nodes > b.max_depth and rng.random() < (pass_rate - first) / (1 - first))
        while 0 < accepted < b.max_depth and rng.random() < deep_rate:
            accepted += 1
        step = StepStats(b.max_nodes, b.max_depth, accepted, accepted + 1, 0.0004 * b.max_depth,
                         plain_s * cost(b.max_nodes), budget_depth=b.max_depth, budget_nodes=b.max_nodes,
                         first_accepted=accepted if by_first else 0)
        now[0] += step.draft_s + step.verify_s
        policy.observe(step, 100)
    assert isinstance(policy.profile, CostProfile)
    return given


def test_a_new_text_that_passes_deep_is_drafted_deep_though_the_tree_would_cost_a_jump():
    """A tree drafter (2 nodes a level) learned on one text that level 2 seldom passes and that its siblings pay
    (level 1: 60% by the tree, 30% by its first child); the next sequence passes
    every level 97% of the time. Its tree at depth 2 (4 nodes) costs the curve's jump, so the tree alone stays at
    depth 1 and never measures level 2; the model's faster shape for a new sequence's first steps (the chain,
    2 nodes at depth 2) measures it, and the sequence drafts deep."""
    from draftkit.verify.cost_profile import CostProfile

    sizes = list(range(1, 17)) + [32, 64]
    profile = CostProfile(0.01, sizes, [1.05 if n <= 3 else 1.6 for n in sizes], context=128)
    policy = AutoBudget(None, Budget(12, 24), profile=profile, cache_profile=False)
    jump_steps(policy, 300, pass_rate=0.6, first_rate=0.3, deep_rate=0.1)
    assert not policy._realized_prefers_chain()  # its siblings paid on that text: the tree is the shape
    policy.start(100)
    given = jump_steps(policy, 80, pass_rate=0.97, deep_rate=0.97, seed=1)
    assert sum(b.max_depth for b in given[-30:]) / 30 >= 4
