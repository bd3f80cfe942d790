"""The hybrid drafter (drafters/hybrid.py, drafters/tree_merge.py): greedy equality for pairs of
members, merged trees that verify each distinct path once, a member that is always wrong losing its
nodes and being probed again, and the calibration it learns from. Sampling: tests/test_hybrid_sampling.py."""
from __future__ import annotations

import itertools

import pytest
import torch

from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.hybrid import HybridDrafter
from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads
from draftkit.drafters.registry import settings_for
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.drafters.tree_merge import merge_trees
from draftkit.verify.contract import Budget, DecodeState, DraftTree
from draftkit.verify.decode import generate as _generate
from tests.models import tiny_model

torch.set_num_threads(1)


def generate(*args, **kwargs):
    return _generate(*args, **{"budget": "fixed", **kwargs})


# ---- greedy: every pair of shipped members ------------------------------------------------------
MEMBERS = ("suffix", "lookahead", "eagle", "eagle3", "medusa", "standalone")


def member(name: str, target):
    """A tiny member of each kind for a (vocab 64, hidden 32, 2 layers) target."""
    if name == "suffix":
        return SuffixDrafter(max_depth=6, max_nodes=8)
    if name == "lookahead":
        return LookaheadDrafter(max_depth=4, max_nodes=16)
    if name in ("eagle", "eagle3"):
        torch.manual_seed(7)
        draft = EagleDraftModel.from_target(target, [0, 1, 2] if name == "eagle3" else None, init_from_target=True)
        return EagleDrafter(target, draft, max_depth=4, max_nodes=8, top_k=2)
    if name == "medusa":
        torch.manual_seed(8)
        heads = MedusaHeads(32, 64, num_heads=2)
        heads.init_from_lm_head(target.get_output_embeddings())
        return MedusaDrafter(target, heads, [(0,), (1,), (0, 0), (0, 1), (1, 0)])
    return StandaloneDrafter(tiny_model("llama", hidden=16, layers=1, seed=1), max_depth=3, top_k=2, max_nodes=6)


PROMPTS = [torch.tensor([3, 9, 4, 3, 9, 4, 3, 9, 11, 12, 3, 9]),
           torch.randint(0, 64, (10,), generator=torch.Generator().manual_seed(4))]


def greedy_pair(a: str, b: str, n: int = 24):
    target = tiny_model("llama", seed=2)
    for prompt in PROMPTS:
        ref = generate(target, prompt, max_new_tokens=n, eos_token_id=[]).tokens.tolist()
        hybrid = HybridDrafter([(a, member(a, target)), (b, member(b, target))])
        for _ in range(2):  # the second request starts with what the first calibrated
            out = generate(target, prompt, hybrid, max_new_tokens=n, eos_token_id=[])
            assert out.tokens.tolist() == ref, (a, b, prompt.tolist())


@pytest.mark.parametrize("a, b", [("suffix", "eagle"), ("lookahead", "medusa"), ("standalone", "eagle3")])
def test_greedy_equals_plain_decoding(a, b):
    greedy_pair(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("a, b", list(itertools.combinations(MEMBERS, 2)))
def test_greedy_equals_plain_decoding_every_pair(a, b):
    greedy_pair(a, b, n=40)


def test_auto_budget_and_registry_build():
    """Through make_drafter-style settings and the cost-aware controller: still plain greedy decoding."""
    target = tiny_model("llama", seed=2)
    s = settings_for("hybrid", members="suffix,lookahead", max_depth=6, max_nodes=12)
    hybrid = HybridDrafter([("suffix", SuffixDrafter()), ("lookahead", LookaheadDrafter())], s.max_depth, s.max_nodes)
    ref = generate(target, PROMPTS[0], max_new_tokens=30, eos_token_id=[]).tokens.tolist()
    out = _generate(target, PROMPTS[0], hybrid, max_new_tokens=30, eos_token_id=[], budget="auto")
    assert out.tokens.tolist() == ref
    assert hybrid.hidden_layers == ()
    with pytest.raises(ValueError, match="two or more"):
        settings_for("hybrid", members="suffix,suffix")
    with pytest.raises(ValueError, match="not drafters it can merge"):
        settings_for("hybrid", members="suffix,hybrid")


def test_hidden_layers_are_the_union_of_the_members():
    target = tiny_model("llama", seed=2)
    eagle3, medusa = member("eagle3", target), member("medusa", target)
    hybrid = HybridDrafter([("eagle3", eagle3), ("medusa", medusa), ("suffix", SuffixDrafter())])
    assert set(hybrid.hidden_layers) == set(eagle3.hidden_layers) | set(medusa.hidden_layers)
    assert len(hybrid.hidden_layers) == len(set(hybrid.hidden_layers))


def test_on_your_own_model_the_hybrid_leaves_out_the_shipped_drafts_made_for_another(caplog):
    """A target of its own shape beside the shipped family's drafts: the default hybrid keeps the members that fit,
    saying in one line which it left out and why; members the user named, or a draft the user gave, that do not fit
    are an error naming the member (never silently swapped)."""
    import draftkit as dk
    from draftkit.models import resolve
    from draftkit.verify.contract import DraftMismatch

    target = tiny_model("qwen2", seed=4)
    with caplog.at_level("WARNING", logger="draftkit"):
        hybrid = dk.make_drafter("hybrid", target)
    assert [m.name for m in hybrid.members] == ["suffix", "lookahead"]
    assert any("leaves out eagle: EAGLE draft mismatch" in r.getMessage() for r in caplog.records)
    prompt = torch.arange(20) % 9
    assert generate(target, prompt, hybrid, max_new_tokens=12, eos_token_id=[]).tokens.tolist() == \
        generate(target, prompt, None, max_new_tokens=12, eos_token_id=[]).tokens.tolist()
    with pytest.raises(DraftMismatch, match="made for zoo/target"):
        dk.make_drafter("hybrid", target, path={"eagle": resolve(None, "eagle")})
    with pytest.raises(DraftMismatch, match="^hybrid member eagle: EAGLE draft mismatch"):
        dk.make_drafter("hybrid", target, members="suffix,eagle")


# ---- merging ------------------------------------------------------------------------------------
def test_merged_tree_holds_each_distinct_path_once():
    a = DraftTree.from_lists([5, 6, 7, 8], [-1, 0, 1, 0])  # 5-6-7 and 5-8
    b = DraftTree.from_lists([5, 6, 9, 4], [-1, 0, 1, -1])  # 5-6-9 and 4
    merged = merge_trees([a.validate(), b.validate()], lambda m, d, r: 0.5, 0.0, 64).validate()
    paths = set()
    for i in range(len(merged)):
        path, j = [], i
        while j >= 0:
            path.append(merged.host_tokens[j])
            j = merged.host_parents[j]
        paths.add(tuple(reversed(path)))
    assert paths == {(5,), (5, 6), (5, 6, 7), (5, 8), (5, 6, 9), (4,)}
    assert len(merged) == len(paths)  # every distinct path once: 6 nodes where the members proposed 8
    shared = [i for i, d in enumerate(merged.extra.draws) if {x.member for x in d} == {0, 1}]
    assert sorted(merged.host_tokens[i] for i in shared) == [5, 6]  # proposed by both, verified once


def test_floor_and_cap_keep_the_likeliest_nodes():
    chain = DraftTree.chain([1, 2, 3, 4]).validate()
    other = DraftTree.chain([7, 8]).validate()
    chance = lambda m, d, r: 0.9 if m == 0 else 0.3  # noqa: E731
    merged = merge_trees([chain, other], chance, 0.5, 64)
    assert merged.host_tokens == [1, 2, 3, 4]  # 0.9^4 = 0.66 clears the floor; 0.3 does not
    merged = merge_trees([chain, other], chance, 0.0, 3)
    assert merged.host_tokens == [1, 2, 3]
    probe = merge_trees([chain, other], chance, 0.5, 64, keep_all={1})
    assert sorted(probe.host_tokens) == [1, 2, 3, 4, 7, 8]


class Wrong:
    """A member that always proposes a token the target does not pick next (it knows the plain output)."""

    hidden_layers = ()
    budget_cap = Budget(3, 3)

    def __init__(self, reference):
        self.reference, self.asked = reference, 0

    def reset(self, prompt):
        self.prompt_len = prompt.numel()

    def propose(self, state):
        self.asked += 1
        done = state.tokens.numel() - self.prompt_len
        return DraftTree.chain([(t + 1) % 64 for t in self.reference[done:done + 3]] or [0])

    def update(self, result):
        pass


def test_a_member_that_is_always_wrong_gets_no_nodes_and_is_skipped():
    target = tiny_model("llama", seed=2)
    prompt = PROMPTS[1]
    ref = generate(target, prompt, max_new_tokens=80, eos_token_id=[]).tokens.tolist()
    wrong = Wrong(ref)
    hybrid = HybridDrafter([("wrong", wrong), ("suffix", SuffixDrafter())], probe_every=4)
    trees = []
    propose = hybrid.propose
    hybrid.propose = lambda state: trees.append(propose(state)) or trees[-1]
    out = generate(target, prompt, hybrid, max_new_tokens=80, eos_token_id=[])
    assert out.tokens.tolist() == ref
    from_wrong = [sum(d.member == 0 for draws in t.extra.draws for d in draws) for t in trees]
    assert sum(from_wrong[:3]) > 0  # it was tried
    later = from_wrong[8:]
    assert later and sum(n > 0 for n in later) <= len(later) // 4  # then only the odd probe
    assert wrong.asked < len(trees) // 2  # skipped, not merely cut: its drafting cost is saved
    assert hybrid.member_accepted["wrong"] == 0 and hybrid.member_accepted["suffix"] > 0


def test_a_member_skipped_on_earlier_texts_is_probed_at_a_new_ones_first_step():
    # a member that paid nothing on the last requests may pay on the next (suffix: idle on chat, then a summary
    # that quotes its passage): a new sequence probes it at once instead of after its doubled wait
    hybrid = HybridDrafter([("a", SuffixDrafter()), ("b", SuffixDrafter())], probe_every=4)
    first = hybrid.members[0]
    first.skipping, first.wait, first.idle = True, 16, 3  # backed off on the last texts, 13 steps to go
    assert first not in hybrid._asked(0.0)
    hybrid.reset(PROMPTS[0])
    asked = hybrid._asked(0.0)
    assert first in asked and first.probe and first.wait == 4


class Fixed:
    """Always the same chain."""

    def __init__(self, tokens):
        self.tokens = tokens

    def reset(self, prompt):
        pass

    def propose(self, state):
        return DraftTree.chain(self.tokens[:state.budget.max_depth])

    def update(self, result):
        pass


@pytest.mark.parametrize("greedy", [True, False])
def test_the_merged_tree_keeps_the_budgets_depth_whatever_the_steps_floor(greedy):
    """The step's floor (Budget.min_path_prob: the controller's price of one more level) is the members' to apply;
    the merge cuts at `min_chance` only, so a budget of depth 4 keeps the members' four levels however high the
    floor, and `min_chance` above a level's calibrated reach (the prior's 0.5 a level) cuts it."""
    def tokens(floor, min_chance=0.01):
        hybrid = HybridDrafter([("a", Fixed([1, 2, 3, 4])), ("b", Fixed([5, 6]))], min_chance=min_chance, skip=False)
        state = DecodeState(torch.tensor([0, 9]), 1, Budget(4, 8, min_path_prob=floor), greedy=greedy)
        return sorted(hybrid.propose(state).host_tokens)
    for floor in (0.0, 0.1, 0.2, 0.4):
        assert tokens(floor) == [1, 2, 3, 4, 5, 6], floor
    assert tokens(0.0, min_chance=0.2) == [1, 2, 5, 6]  # reach 0.5, 0.25 kept; 0.125 and below cut


def calibrate(hybrid, *rates, seen=100.0):
    """Member i's first-ranked draws passed rates[i] of `seen` tries at every level."""
    for i, rate in enumerate(rates):
        for d in range(len(hybrid.calibration.reached[i])):
            hybrid.calibration.reached[i][d][0], hybrid.calibration.passed[i][d][0] = seen, rate * seen


class FixedTree(Fixed):
    """Always the same tree (tokens, parents)."""

    def __init__(self, tokens, parents):
        self.tokens, self.parents = tokens, parents

    def propose(self, state):
        return DraftTree.from_lists(self.tokens, self.parents, state.tokens.device)


def test_a_sampled_merged_tree_is_cut_at_min_chance_alone():
    """Under sampling each member pruned its own tree at the step's floor with its own q: the merge cuts at
    `min_chance` only. a's rank-1 sibling at depth 2 (token 8; calibrated reach 0.9 * 0.25 = 0.225) stays under a
    step's floor of 0.3, and goes when min_chance is above its reach."""
    def tokens(min_chance):
        hybrid = HybridDrafter([("a", FixedTree([1, 2, 3, 8], [-1, 0, 1, 0])), ("b", Fixed([5, 6]))],
                               min_chance=min_chance, skip=False)
        calibrate(hybrid, 0.9, seen=1000.0)  # a's first-ranked draws pass 9 times in 10 at every level
        state = DecodeState(torch.tensor([0, 9]), 1, Budget(4, 8, min_path_prob=0.3), greedy=False)
        return set(hybrid.propose(state).host_tokens)
    assert {1, 2, 3, 8} <= tokens(0.01)
    assert 8 not in tokens(0.25) and {1, 2, 3} <= tokens(0.25)


def test_members_learn_as_if_alone():
    """Suffix learns the output; EAGLE keeps getting its hidden states, so both still draft after a cut."""
    target = tiny_model("llama", seed=2)
    eagle = member("eagle", target)
    hybrid = HybridDrafter([("suffix", SuffixDrafter()), ("eagle", eagle)], max_nodes=4)
    out = generate(target, PROMPTS[1], hybrid, max_new_tokens=20, eos_token_id=[])
    suffix = hybrid.members[0].drafter
    assert suffix.tokens == PROMPTS[1].tolist() + out.tokens.tolist()[:-1] or \
        suffix.tokens == PROMPTS[1].tolist() + out.tokens.tolist()
    state = DecodeState(out.sequence, PROMPTS[1].numel(), Budget(3, 4), greedy=True)
    assert len(eagle.propose(state)) > 0


# ---- learning: the calibration ----------------------------------------------------------------
def test_a_first_ranked_draw_below_depth_one_starts_from_the_chance_above_it():
    """A member whose first-ranked chain passed at depths 1-3 and was never drafted deeper: depth 4 and beyond take
    depth 3's chance, not the flat prior (which kept suffix's deep quotes under the floor); later ranks keep the
    prior / (1 + r), the chance never rises with rank, and a member's evidence leaves the other's untouched."""
    from draftkit.drafters.hybrid import RANKS, Calibration

    cal = Calibration(members=2, depth=8)
    for _ in range(30):
        for d in (1, 2, 3):
            cal.observe(0, d, 0, accepted=True)
    deep = [cal.chance(0, d, 0) for d in range(1, 9)]
    assert deep[2] > 0.9 and all(abs(c - deep[2]) < 1e-9 for c in deep[3:]), deep
    assert cal.chance(1, 5, 0) == 0.5  # the other member: the prior all the way down
    assert all(abs(cal.chance(0, 5, r) - 0.5 / (1 + min(r, RANKS - 1))) < 1e-9 for r in range(1, 6))
    for d in range(1, 9):
        assert all(cal.chance(0, d, r + 1) <= cal.chance(0, d, r) for r in range(RANKS))
    for _ in range(30):
        cal.observe(0, 4, 0, accepted=False)  # depth 4 tried and failed: deeper levels follow it down
    assert cal.chance(0, 4, 0) < 0.1 and cal.chance(0, 6, 0) < 0.1


def test_a_new_sequence_carries_the_calibration_over_as_a_few_observations():
    """At each new sequence (reset) the calibration keeps each cell's rate but at most CARRY observations of
    evidence, as the controller does: a member that failed on 30 chat steps and then passes on a quoting prompt is
    back above half within four steps, where the full memory (about 33 observations) held it under a quarter."""
    from draftkit.drafters.hybrid import Calibration
    from draftkit.drafters.suffix import SuffixDrafter
    from draftkit.verify.controller import CARRY

    hybrid = HybridDrafter([("suffix", SuffixDrafter()), ("lookahead", LookaheadDrafter())])
    cal = hybrid.calibration
    for _ in range(30):
        cal.observe(0, 2, 0, accepted=False)
    cal.observe(0, 2, 0, accepted=True)
    before = cal.chance(0, 2, 0)
    kept = Calibration(members=2, depth=cal.depth)  # the same evidence, not carried over
    kept.reached, kept.passed = [[list(r) for r in m] for m in cal.reached], [[list(p) for p in m] for m in cal.passed]
    hybrid.reset(torch.tensor([1, 2, 3]))
    assert abs(cal.reached[0][1][0] - CARRY) < 1e-9 and cal.chance(0, 2, 0) > before  # the prior's share back
    assert abs(cal.passed[0][1][0] / cal.reached[0][1][0] - kept.passed[0][1][0] / kept.reached[0][1][0]) < 1e-9
    for _ in range(4):
        cal.observe(0, 2, 0, accepted=True)
        kept.observe(0, 2, 0, accepted=True)
    assert cal.chance(0, 2, 0) > 0.5 > 0.25 > kept.chance(0, 2, 0)
    assert cal.chance(1, 2, 0) == kept.chance(1, 2, 0) == 0.5  # no evidence: untouched


def test_the_default_members_take_a_given_eagle3_draft():
    """members auto: suffix and EAGLE-2, or EAGLE-3 when its draft is given (as on a real target whose shipped draft
    is EAGLE-3); compare.py then accepts --eagle3 beside --drafters hybrid instead of calling the flag unused."""
    import draftkit as dk
    from draftkit.eval import cli
    from draftkit.models import resolve

    target = dk.load_model()
    assert [m.name for m in dk.make_drafter("hybrid", target).members] == ["suffix", "eagle"]
    given = dk.make_drafter("hybrid", target, path={"eagle3": resolve(None, "eagle3")})
    assert [m.name for m in given.members] == ["suffix", "eagle3"]
    args = cli.parse_args(["--drafters", "hybrid", "--eagle3", resolve(None, "eagle3")])
    cli.check_flags(args)
    cli.check_drafters(args, cli.drafter_choices())  # no "--eagle3 is given but ... has no eagle3"


def test_outlook_is_its_members_highest():
    """A hybrid tells the controller the highest outlook among its members (contract.Drafter.outlook): suffix inside
    a quote lifts the merged tree's; members without one (lookahead) count as 0, and none at all gives 0."""
    passage = torch.arange(100, 120)
    suffix = SuffixDrafter(use_global=False)
    hybrid = HybridDrafter([("lookahead", LookaheadDrafter()), ("suffix", suffix)])
    hybrid.reset(torch.cat([passage, passage[:9]]))  # the prompt ends quoting its own first 9 tokens
    assert suffix.outlook() == 4 and hybrid.outlook() == 4
    hybrid.reset(torch.tensor([1, 2, 3]))
    assert hybrid.outlook() == suffix.outlook() == 1
    assert HybridDrafter([("a", LookaheadDrafter()), ("b", LookaheadDrafter())]).outlook() == 0
