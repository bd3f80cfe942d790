"""The controller's two shapes for a tree drafter (verify/controller.py): its tree, or its chain of first children,
chosen by what each shape's drafted steps realized; simulated steps, no model."""
import random

from draftkit.verify.contract import Budget, DraftTree
from draftkit.verify.controller import AutoBudget
from draftkit.verify.stats import StepStats
from tests.test_controller import flat


def shaped_steps(policy, steps: int, first_pass: float, tree_pass: float, per_node: float, seed: int = 0,
                 overhead: float = 0.0):
    """Run a tree drafter's controller on simulated steps: each level passes with `tree_pass` when a tree was
    drafted (some sibling passed), and its first child alone with `first_pass`; a chain passes `first_pass`.
    Verifying costs plain_s * (1 + per_node * nodes); every step also takes `overhead` seconds that no step
    reports (the loop's own time). Returns the budgets given."""
    rng, plain_s, given, now = random.Random(seed), policy.profile.plain_s, [], [0.0]
    policy.clock = lambda: now[0]  # simulated time: each step takes what it reports
    for _ in range(steps):
        b = policy.budget(100)
        given.append(b)
        if not b.max_depth:
            now[0] += plain_s
            policy.observe(StepStats(0, 0, 0, 1, 0.0, plain_s), 100)
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
    most steps."""
    policy = AutoBudget(None, Budget(4, 16), profile=flat(0.05), cache_profile=False)
    given = shaped_steps(policy, 400, first_pass=0.7, tree_pass=0.8, per_node=0.05, overhead=0.04)[100:]
    best, chain, gains, times = policy.plan(chain=True)
    tree_best, _, tree_gains, tree_times = policy.plan(chain=False)
    assert gains[best] / times[best] > tree_gains[tree_best] / tree_times[tree_best]  # the model: the chain
    assert sum(b.max_nodes > b.max_depth for b in given) > 0.75 * len(given)  # the steps: the tree


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
