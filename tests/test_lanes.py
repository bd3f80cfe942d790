"""The drafters of a batch's lanes drafting together (drafters/lanes.py: EAGLE, P-EAGLE and standalone;
drafters/dflash_lanes.py: DFlash; drafters/medusa_lanes.py: Medusa): the same trees and draft caches as alone,
lossless batches, and each drafter back on its own after its batch."""
import pytest
import torch

from tests.models import tiny_model
from tests.test_eagle import _exact_joint, oracle_draft, tiny_target
from tests.test_medusa import random_heads
from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft
from draftkit.drafters.dflash_lanes import DFlashLanes
from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.eagle_lanes import PEagleLanes
from draftkit.drafters.lanes import DraftLanes
from draftkit.drafters.medusa import MedusaDrafter
from draftkit.drafters.medusa_tree import build_tree_choices, default_accuracies
from draftkit.drafters.medusa_lanes import MedusaLanes
from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.verify.accept import Sampling
from draftkit.verify.contract import Budget, NoDrafter
from draftkit.verify.lanes import lane_groups
from draftkit.verify.budget import FixedBudget
from draftkit.verify.decode import generate
from draftkit.verify.packed import generate_packed

torch.set_num_threads(1)

PROMPTS = [torch.tensor([5]), torch.tensor([3, 17, 42, 8, 8, 61, 0, 9]), torch.arange(20) % 7 + 30,
           torch.tensor([11, 2, 2, 40])]
KINDS = ["eagle-tree", "eagle-chain", "eagle3-tree", "standalone-tree", "standalone-chain", "dflash-tree",
         "dflash-chain", "peagle-tree", "peagle-chain", "medusa-tree", "medusa-chain"]
CLASSES = {"standalone": StandaloneDrafter, "dflash": DFlashDrafter, "peagle": PEagleDrafter, "medusa": MedusaDrafter}


@pytest.fixture(scope="module")
def target2():
    return tiny_target(layers=4, seed=0)  # four layers: a reference EAGLE-3 (P-EAGLE) draft reads three of them


def lanes_of(kind: str, target, n: int, draft=None, **flags) -> list:
    """n drafters of one draft model (a random one unless given) for the lanes of a batch."""
    flags = {"max_depth": 4, "max_nodes": 10, "top_k": 1 if kind.endswith("chain") else 3, **flags}
    torch.manual_seed(7)
    if kind.startswith("standalone"):
        first = StandaloneDrafter(draft if draft is not None else tiny_model("llama", seed=5), **flags)
    elif kind.startswith("peagle"):
        first = PEagleDrafter(target, draft if draft is not None else make_peagle_draft(target, [1, 2, 3], 5), **flags)
    elif kind.startswith("medusa"):  # heads of three levels; a chain: rank 0 at every level
        paths = [(0,) * d for d in range(1, 4)] if kind.endswith("chain") else build_tree_choices(
            default_accuracies(3), flags["max_nodes"])
        first = MedusaDrafter(target, draft if draft is not None else random_heads(target), paths)
    elif kind.startswith("dflash"):
        draft = draft if draft is not None else make_dflash_draft(target, block_size=6, mask_token_id=5)
        first = DFlashDrafter(target, draft, **flags)
    else:
        layers = [0, 1, -1] if kind.startswith("eagle3") else None
        first = EagleDrafter(target, draft if draft is not None else EagleDraftModel.from_target(target, layers),
                             **flags)
    return [first] + [first.lane() for _ in range(n - 1)]


def record_trees(monkeypatch, cls, grouped: bool) -> dict:
    """Every tree proposed, per drafter, in order: host tokens and parents, and EAGLE's outputs at the root and
    at every node it ran this step (its bank), which a wrong position or mask moves even where no token flips."""
    seen: dict[int, list] = {}

    def keep(d, tree):
        bank = getattr(d, "bank", None)
        bank = bank.clone() if bank is not None and len(tree) else None
        seen.setdefault(id(d), []).append((tree.host_tokens, tree.host_parents, bank))
    if grouped:
        group_cls = {DFlashDrafter: DFlashLanes, PEagleDrafter: PEagleLanes, MedusaDrafter: MedusaLanes}.get(
            cls, DraftLanes)
        original = group_cls.propose

        def propose(self, states):
            out = original(self, states)
            for d, st, tree in zip(self.drafters, states, out):
                if st is not None:
                    keep(d, tree)
            return out
        monkeypatch.setattr(group_cls, "propose", propose)
    else:
        monkeypatch.setattr(cls, "draft_lanes", None)
        original = cls.propose

        def propose(self, state):
            out = original(self, state)
            keep(self, out)
            return out
        monkeypatch.setattr(cls, "propose", propose)
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_lanes_draft_the_trees_and_caches_each_lane_drafts_alone(target2, kind, monkeypatch):
    """Every tree each lane proposes, and the draft's cached keys (a wrong position or mask moves them even where
    it flips no token), equal what the lane's drafter computes alone."""
    assert_lanes_match_alone(target2, kind, monkeypatch)


def assert_lanes_match_alone(target2, kind, monkeypatch, make=lambda: None):
    """The check above; `make()` gives the draft model (None: lanes_of's random one)."""
    trees, keys = {}, {}
    cls = CLASSES.get(kind.split("-")[0], EagleDrafter)
    for grouped in (False, True):
        with monkeypatch.context() as m:
            seen = record_trees(m, cls, grouped)
            drafters = lanes_of(kind, target2, len(PROMPTS), make())
            generate_packed(target2, PROMPTS, drafters, max_new_tokens=13, eos_token_id=[], budget="fixed")
            trees[grouped] = [seen[id(d)] for d in drafters]
            if not kind.startswith("medusa"):  # Medusa keeps no draft cache
                keys[grouped] = [cached_keys(d.cache, r if grouped else 0) for r, d in enumerate(drafters)]
    for alone, together in zip(trees[False], trees[True]):
        assert [t[:2] for t in together] == [t[:2] for t in alone]
        for (_, _, a), (_, _, b) in zip(alone, together):
            assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-5))
    assert sum(len(t) for lane in trees[True] for t, _, _ in lane) > 0
    for a, b in zip(keys.get(False, []), keys.get(True, [])):
        n = min(a.shape[-2], b.shape[-2])  # a group commits the last step's kept entries when it next drafts
        assert n > 5
        assert torch.allclose(a[..., :n, :], b[..., :n, :], atol=1e-5)


def cached_keys(cache, row: int) -> torch.Tensor:
    """(layers, heads, n, D) the keys the draft cached for lane `row`: its committed entries."""
    n = cache.lengths[row]
    if hasattr(cache, "layers"):  # KVBuffer (EAGLE, standalone)
        return torch.stack([layer.keys[row, :, :n] for layer in cache.layers])
    return torch.stack([k[row, :, :n] for k in cache.k])  # DFlash's ContextCache


@pytest.mark.parametrize("budget", ["fixed", "auto"])
@pytest.mark.parametrize("kind", ["eagle-tree", "eagle-chain", "standalone-tree", "dflash-tree", "peagle-tree",
                                  "medusa-tree"])
def test_batched_lanes_decode_what_plain_batches_decode(budget, kind):
    """Oracle drafts (accepted deep; DFlash and P-EAGLE: random ones): every batch's output is plain batched
    decoding's, at lengths that end mid-draft."""
    target = tiny_target(layers=4 if kind.startswith("peagle") else 1, seed=3, logit_scale=20.0)
    draft = {"standalone": target}.get(kind.split("-")[0]) if not kind.startswith("eagle") else oracle_draft(target)
    drafters = lanes_of(kind, target, len(PROMPTS), draft=draft, max_depth=5, max_nodes=16)
    assert len(lane_groups(drafters)) == 1
    for n in (2, 9, 23):
        plain = generate_packed(target, PROMPTS, [NoDrafter() for _ in PROMPTS], n, eos_token_id=[], logprobs=False)
        out = generate_packed(target, PROMPTS, drafters, n, eos_token_id=[], budget=budget, logprobs=False)
        assert [o.tokens.tolist() for o in out.outputs] == [o.tokens.tolist() for o in plain.outputs]
    # the controller may find drafting does not pay for a model this small; random drafts seldom pass
    if budget == "fixed" and kind.split("-")[0] in ("eagle", "standalone"):
        assert any(s.accepted >= 2 for o in out.outputs for s in o.stats.decode_steps)


@pytest.mark.parametrize("kind", ["eagle-tree", "standalone-tree", "dflash-tree", "peagle-tree"])
def test_lanes_that_finished_leave_the_others_drafting_together(target2, kind):
    """The first lane ends at its first token (its EOS), before it ever drafts: the group drafts without it,
    every output still plain decoding's."""
    drafters = lanes_of(kind, target2, len(PROMPTS))
    eos = int(generate(target2, PROMPTS[0], max_new_tokens=1, eos_token_id=[]).tokens[0])
    plain = generate_packed(target2, PROMPTS, [NoDrafter() for _ in PROMPTS], 15, eos_token_id=[eos], logprobs=False)
    out = generate_packed(target2, PROMPTS, drafters, 15, eos_token_id=[eos], budget="fixed", logprobs=False)
    assert [o.tokens.tolist() for o in out.outputs] == [o.tokens.tolist() for o in plain.outputs]
    lengths = [len(o.tokens) for o in out.outputs]
    assert lengths[0] == 1 and max(lengths) > 4


@pytest.mark.parametrize("kind", ["eagle-tree", "standalone-tree", "dflash-tree", "peagle-tree"])
def test_a_drafter_decodes_alone_after_its_batch(target2, kind):
    drafters = lanes_of(kind, target2, 3)
    generate_packed(target2, PROMPTS[:3], drafters, max_new_tokens=9, eos_token_id=[], budget="fixed")
    assert drafters[1].cache is drafters[0].cache  # one buffer for the batch
    ref = generate(target2, PROMPTS[1], max_new_tokens=11, eos_token_id=[])
    out = generate(target2, PROMPTS[1], drafters[1], max_new_tokens=11, eos_token_id=[], budget="fixed")
    assert out.tokens.tolist() == ref.tokens.tolist()
    own = drafters[1].alone.cache
    assert drafters[1].cache is own and len(drafters[1].cache.lengths) == 1


def test_only_drafters_of_one_draft_and_settings_draft_together(target2):
    torch.manual_seed(7)
    a, b = EagleDraftModel.from_target(target2), EagleDraftModel.from_target(target2)
    assert lane_groups([EagleDrafter(target2, a), EagleDrafter(target2, b)]) == []
    assert lane_groups([EagleDrafter(target2, a, top_k=2), EagleDrafter(target2, a, top_k=3)]) == []
    assert lane_groups([StandaloneDrafter(tiny_model(seed=1)), StandaloneDrafter(tiny_model(seed=1))]) == []
    flash = [make_dflash_draft(target2, block_size=5, mask_token_id=5) for _ in range(2)]
    assert lane_groups([DFlashDrafter(target2, flash[0]), DFlashDrafter(target2, flash[1])]) == []
    assert len(lane_groups([DFlashDrafter(target2, flash[0]), DFlashDrafter(target2, flash[0])])) == 1
    eagles, drafts = lanes_of("eagle-tree", target2, 3, draft=a), lanes_of("standalone-tree", target2, 2)
    groups = lane_groups([eagles[0], NoDrafter(), drafts[0], eagles[1], eagles[2], drafts[1]])
    assert sorted(idx for idx, _ in groups) == [[0, 3, 4], [2, 5]]


# P-EAGLE's lanes are EAGLE's (drafters/eagle_lanes.py): slow; its sampling alone is in tests/test_peagle.py
@pytest.mark.parametrize("kind", ["eagle-tree", "standalone-tree", "dflash-tree", pytest.param("peagle-tree", marks=pytest.mark.slow),
                                  "medusa-tree"])
def test_sampled_lanes_are_lossless(kind):
    """Four lanes of one prompt, sampled at temperature 1: the 2nd and 3rd tokens of every lane (decided by one
    depth-2 tree drafted with the other lanes' in one forward per level) follow the target's exact joint."""
    target = tiny_target(layers=4 if kind.startswith("peagle") else 1, vocab=16, seed=0, logit_scale=90.0)
    prompt = torch.tensor([3, 7, 1, 12, 5])
    exact = _exact_joint(target, prompt)
    draft = {"standalone": target}.get(kind.split("-")[0]) if not kind.startswith("eagle") else oracle_draft(target)
    drafters = lanes_of(kind, target, 4, draft=draft, max_depth=3, top_k=4, max_nodes=8)
    n, counts = 500, torch.zeros(16, 16)
    for s in range(n):
        out = generate_packed(target, [prompt] * 4, drafters, 4, sampling=Sampling(temperature=1.0), eos_token_id=[],
                              seed=s, budget="fixed", logprobs=False)
        for o in out.outputs:
            counts[o.tokens[1], o.tokens[2]] += 1
    tv = 0.5 * (counts / counts.sum() - exact).abs().sum().item()
    assert tv < 0.07, tv


def test_seeded_sampled_lanes_reproduce(target2):
    drafters = lanes_of("eagle-tree", target2, 3)

    def run(seed):
        out = generate_packed(target2, PROMPTS[:3], drafters, 12, sampling=Sampling(0.8), eos_token_id=[], seed=seed,
                              budget="fixed", logprobs=False)
        return [o.tokens.tolist() for o in out.outputs]
    assert run(3) == run(3) and run(3) != run(4)


def test_medusa_lanes_run_their_heads_once_a_step_and_only_the_heads_their_trees_need(target2, monkeypatch):
    from draftkit.drafters.medusa import MedusaHeads

    calls = []
    original = MedusaHeads.forward
    monkeypatch.setattr(MedusaHeads, "forward", lambda self, h, n=None: calls.append((h.shape[0], n)) or original(
        self, h, n))
    drafters = lanes_of("medusa-tree", target2, len(PROMPTS))
    out = generate_packed(target2, PROMPTS, drafters, 9, eos_token_id=[], budget="fixed", logprobs=False)
    steps = len(out.outputs[0].stats.decode_steps)
    assert 1 <= len(calls) <= steps and calls[0][0] == len(PROMPTS)  # one call for every drafting lane
    calls.clear()  # a depth-1 tree runs one head of three
    lone = lanes_of("medusa-tree", target2, 1)[0]
    generate(target2, PROMPTS[1], lone, max_new_tokens=6, eos_token_id=[], budget=FixedBudget(Budget(1, 4)))
    assert calls and all(n == 1 for _, n in calls)
