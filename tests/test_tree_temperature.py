"""The greedy EAGLE-2 tree's tree_temperature (drafters/tree_search.py) and its fit (train/calibrate.py): a sharper
draft confidence turns depth-1 siblings into depth, greedy output stays plain greedy's, the value travels with
the draft's config."""
import json

import pytest
import torch

from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.tree_search import topk_search
from draftkit.models import resolve
from draftkit.train.calibrate import GRID, calibrate, main
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


def test_the_fit_keeps_the_temperature_that_commits_most():
    target = tiny_target(layers=2, seed=0)
    torch.manual_seed(7)
    draft = EagleDraftModel.from_target(target)
    stream = torch.arange(200) % 37 + 5
    best, fit = calibrate(target, draft, stream, prompts=2, new_tokens=8, prompt_len=16)
    taus = {float(t): v for t, v in fit["tau_by_temperature"].items()}
    assert set(taus) == set(GRID) and draft.config.tree_temperature == best
    assert taus[best] == max(taus.values()) and fit["prompts"] == 2


def test_calibrate_refuses_what_it_cannot_fit_before_any_model_loads(tmp_path, capsys):
    for name, says in (("medusa", "not a draftkit EAGLE draft"), ("peagle", "does not read tree_temperature")):
        with pytest.raises(SystemExit) as e:
            main([resolve(None, name), "--dry-run"])
        assert e.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--dry-run"])
    assert "holds no config.json" in capsys.readouterr().err
