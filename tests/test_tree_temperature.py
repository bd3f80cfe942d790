"""The greedy tree's tree_temperature (drafters/tree_search.py: EAGLE-2 / EAGLE-3 trees, and the trees P-EAGLE and
DFlash cut from per-depth distributions) and its fit (train/calibrate.py): a sharper draft confidence turns depth-1
siblings into depth, greedy output stays plain greedy's, the value travels with the draft's config."""
import json

import pytest
import torch

from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft
from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.tree_search import draft_from_depths, topk_search
from draftkit.verify.budget import Budget
from draftkit.verify.contract import DecodeState
from draftkit.models import resolve
from draftkit.train.calibrate import GRID, MIN_GAIN, calibrate, main
from draftkit.verify.decode import generate
from tests.test_eagle import PROMPTS, tiny_target

torch.set_num_threads(1)


def run_search(root: torch.Tensor, child: torch.Tensor, temperature: float):
    """topk_search to its end (depth 3, 4 nodes: the top-1 chain and one more), every frontier node's children
    drawn from the same `child` logits."""
    search = topk_search(root, depth=3, top_k=2, max_nodes=4, tree_temperature=temperature)
    request = next(search)
    try:
        while True:
            request = search.send(child.expand(len(request[0]), -1))
    except StopIteration as done:
        return done.value


def test_a_sharper_tree_temperature_trades_siblings_for_depth():
    """An under-confident draft (a long tail of 198 tokens holds most of its mass; top-1 0.04): at T = 1 the
    root's second token (p 0.013) outbids the second child of the top-1 token (0.04 x 0.02); sharpened, the
    tail's mass no longer weighs on every level and the deeper sibling wins."""
    tail = [0.0] * 198
    root, child = torch.tensor([2.0, 1.0] + tail), torch.tensor([2.0, 1.5] + tail)
    soft = run_search(root, child, 1.0).validate()
    sharp = run_search(root, child, 0.25).validate()
    level1 = lambda tree: sum(p < 0 for p in tree.parents.tolist())  # noqa: E731
    assert level1(soft) == 2 and level1(sharp) == 1
    assert len(soft) == len(sharp) == 4 and sharp.max_depth == soft.max_depth == 3  # the top-1 chain in both


def test_trees_cut_from_per_depth_distributions_read_it_too():
    """P-EAGLE and DFlash: the same under-confident draft as above, one row of logits per depth."""
    tail = [0.0] * 198
    depths = torch.tensor([[2.0, 1.0] + tail, [2.0, 1.5] + tail, [2.0, 1.5] + tail])  # (D 3, V 200)
    state = DecodeState(tokens=torch.tensor([1, 2]), prompt_len=1, budget=Budget(3, 4), greedy=True)
    level1 = lambda tree: sum(p < 0 for p in tree.parents.tolist())  # noqa: E731
    assert level1(draft_from_depths(depths, state, top_k=2).validate()) == 2
    assert level1(draft_from_depths(depths, state, top_k=2, tree_temperature=0.25).validate()) == 1


def test_greedy_output_is_plain_greedy_at_any_tree_temperature(tmp_path):
    target = tiny_target(layers=2, seed=0)
    torch.manual_seed(7)
    draft = EagleDraftModel.from_target(target)
    for t in (1.0, 0.3):
        draft.config.tree_temperature = t
        drafter = EagleDrafter(target, draft, max_depth=4, top_k=3, max_nodes=10)
        assert drafter.tree_temperature == t
        for prompt in PROMPTS:
            ref = generate(target, prompt, max_new_tokens=12, eos_token_id=[]).tokens.tolist()
            assert generate(target, prompt, drafter, max_new_tokens=12, eos_token_id=[],
                            budget="fixed").tokens.tolist() == ref
    draft.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["tree_temperature"] == 0.3
    assert EagleDrafter.from_pretrained(str(tmp_path), target).tree_temperature == 0.3


def test_a_dflash_draft_keeps_plain_greedy_and_its_fitted_temperature(tmp_path):
    target = tiny_target(layers=4, seed=0)
    torch.manual_seed(1)
    draft = make_dflash_draft(target, block_size=5, mask_token_id=5, draft_layers=1, target_layers=[1, 3])
    best, fit = calibrate(target, draft, torch.arange(200) % 37 + 5, prompts=2, new_tokens=8, prompt_len=16)
    assert draft.config.tree_temperature == best and len(fit["tau_by_temperature"]) == len(GRID)
    draft.config.tree_temperature = 0.3
    drafter = DFlashDrafter(target, draft, max_depth=4, max_nodes=10, top_k=3)
    assert drafter.tree_temperature == 0.3
    for prompt in PROMPTS:
        ref = generate(target, prompt, max_new_tokens=12, eos_token_id=[]).tokens.tolist()
        assert generate(target, prompt, drafter, max_new_tokens=12, eos_token_id=[],
                        budget="fixed").tokens.tolist() == ref
    draft.save_pretrained(str(tmp_path))
    assert DFlashDrafter.from_pretrained(str(tmp_path), target).tree_temperature == 0.3
    draft.config.tree_temperature = 0.0
    with pytest.raises(ValueError, match="tree_temperature must be > 0"):
        draft.config.check()


def test_the_fit_keeps_the_temperature_that_commits_most():
    target = tiny_target(layers=2, seed=0)
    torch.manual_seed(7)
    draft = EagleDraftModel.from_target(target)
    stream = torch.arange(200) % 37 + 5
    best, fit = calibrate(target, draft, stream, prompts=2, new_tokens=8, prompt_len=16)
    taus = {float(t): v for t, v in fit["tau_by_temperature"].items()}
    assert set(taus) == set(GRID) and draft.config.tree_temperature == best
    top = max(taus.values())
    assert fit["prompts"] == 2 and (taus[best] == top if top >= taus[1.0] * (1 + MIN_GAIN) else best == 1.0)


def test_calibrate_refuses_what_it_cannot_fit_before_any_model_loads(tmp_path, capsys):
    for name in ("medusa", "draft"):
        with pytest.raises(SystemExit) as e:
            main([resolve(None, name), "--dry-run"])
        assert e.value.code == 2 and "not a draftkit EAGLE or DFlash draft" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--dry-run"])
    assert "holds no config.json" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["peagle", "dflash"])
def test_the_parallel_drafters_hand_their_tree_temperature_to_the_tree(kind, monkeypatch):
    from draftkit.drafters import dflash_lanes, eagle_lanes
    from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft

    target = tiny_target(layers=4, seed=0)
    torch.manual_seed(1)
    if kind == "dflash":
        draft, module, cls = make_dflash_draft(target, 5, 5, 1, [1, 3]), dflash_lanes, DFlashDrafter
    else:
        draft, module, cls = make_peagle_draft(target, [1, 2, 3], mask_token_id=5), eagle_lanes, PEagleDrafter
    draft.config.tree_temperature = 0.35
    seen, real = [], module.draft_from_depths
    monkeypatch.setattr(module, "draft_from_depths", lambda *a: seen.append(a[-1]) or real(*a))
    generate(target, PROMPTS[0], cls(target, draft, max_depth=3, max_nodes=6, top_k=2), max_new_tokens=6,
             eos_token_id=[], budget="fixed")
    assert seen and set(seen) == {0.35}


@pytest.mark.parametrize("taus, fitted", [({1.0: 2.00, 0.5: 2.10, 0.25: 2.05}, 0.5),   # 5% more: sharpened
                                          ({1.0: 2.00, 0.5: 2.01, 0.25: 1.90}, 1.0),   # 0.5% more: noise, kept
                                          ({1.0: 2.00, 0.7: 2.10, 0.5: 2.10}, 0.7)])   # a tie: the milder one
def test_the_fit_sharpens_only_for_a_real_gain(taus, fitted, monkeypatch):
    from types import SimpleNamespace

    from draftkit.train import decode_eval

    target = tiny_target(layers=2, seed=0)
    draft = EagleDraftModel.from_target(target)
    monkeypatch.setattr(decode_eval, "decode_stats",
                        lambda t, drafter, *a: SimpleNamespace(tau=taus[drafter.tree_temperature]))
    best, _ = calibrate(target, draft, torch.arange(200) % 37 + 5, prompts=2, prompt_len=16, grid=tuple(taus))
    assert best == fitted == draft.config.tree_temperature
