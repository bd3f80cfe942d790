"""The drafts' attention window at decoding (EagleConfig / DFlashConfig `attention_window`): with a cache, keys more
than the window back are hidden, so a one-layer draft over a long context gives what it gives over the window's
positions alone; decoding stays lossless; training (no cache) is untouched."""
from __future__ import annotations

import pytest
import torch

from draftkit.drafters.dflash import ContextCache, DFlashDrafter, make_dflash_draft
from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.eagle_reference import make_draft
from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
from draftkit.verify.cache import KVBuffer
from tests.parallel_common import assert_greedy_equal, tiny_target

torch.set_num_threads(1)
LAYERS, H, W, T = [1, 2, 3], 32, 6, 15  # window 6 over a context of 15 positions


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=4, hidden=H, seed=0)


def eagle3_last_output(draft, feats, embeds, window: int, cached: bool) -> torch.Tensor:
    """The draft's output at the last of T positions: through a cache (the first T - 1 in one forward, then the
    last), or from scratch."""
    draft.config.attention_window = window
    if not cached:
        return draft(feats[None], embeds[None])[0, -1]
    cache = KVBuffer(1, capacity=32)
    draft(feats[None, :-1], embeds[None, :-1], cache=cache)
    cache.commit([list(range(T - 1))])
    return draft(feats[None, -1:], embeds[None, -1:], cache=cache)[0, -1]


def test_eagle3_window_equals_the_window_alone(target):
    torch.manual_seed(0)
    draft = make_draft(target, LAYERS, "reference").eval()
    feats, embeds = torch.randn(T, 3 * H), torch.randn(T, H)
    with torch.no_grad():
        windowed = eagle3_last_output(draft, feats, embeds, W, cached=True)
        draft.config.attention_window = 0
        alone = draft(feats[None, T - W:], embeds[None, T - W:], position_ids=torch.arange(T - W, T)[None])[0, -1]
        torch.testing.assert_close(windowed, alone, atol=1e-5, rtol=1e-5)
        full = eagle3_last_output(draft, feats, embeds, 0, cached=True)
        assert not torch.allclose(full, alone, atol=1e-3)  # the window is what made them equal
        # without a cache (training) the window does nothing
        torch.testing.assert_close(eagle3_last_output(draft, feats, embeds, W, cached=False), full, atol=1e-5,
                                   rtol=1e-5)


def test_dflash_window_hides_the_far_context(target):
    torch.manual_seed(1)
    draft = make_dflash_draft(target, block_size=4, mask_token_id=5, draft_layers=1, target_layers=[1, 3]).eval()
    feats, embeds = torch.randn(1, T, 2 * H), torch.randn(1, 4, H)
    block = torch.arange(T, T + 4)[None]

    def block_out(window, start):
        draft.config.attention_window = window
        return draft(embeds, block, feats[:, start:], torch.arange(start, T)[None], ContextCache(1))

    with torch.no_grad():
        torch.testing.assert_close(block_out(W, 0), block_out(0, T - W + 1), atol=1e-5, rtol=1e-5)
        assert not torch.allclose(block_out(0, 0), block_out(0, T - W + 1), atol=1e-3)


@pytest.mark.parametrize("kind", ["eagle3", "peagle", "dflash"])
def test_windowed_drafts_stay_lossless(target, kind):
    torch.manual_seed(2)
    if kind == "dflash":
        draft = make_dflash_draft(target, block_size=4, mask_token_id=5, draft_layers=2, target_layers=[1, 3])
        drafter_class = DFlashDrafter
    elif kind == "peagle":
        draft, drafter_class = make_peagle_draft(target, LAYERS, mask_token_id=5, draft_layers=2), PEagleDrafter
    else:
        draft, drafter_class = make_draft(target, LAYERS, "reference", draft_layers=2), EagleDrafter
    draft.config.attention_window = 4  # far shorter than the prompts and outputs: the window is in play
    drafter = drafter_class(target, draft, max_depth=3, max_nodes=6, top_k=2)
    prompts = [torch.arange(20) % 7 + 30, torch.tensor([3, 17, 42, 8, 8, 61, 0, 9, 12, 30, 5, 5, 2])]
    assert_greedy_equal(target, drafter, "fixed", (9, 17), prompts)


@pytest.mark.parametrize("kind", ["eagle-tree", "peagle-tree", "dflash-tree"])
def test_windowed_lanes_draft_what_each_lane_drafts_alone(target, kind, monkeypatch):
    """Batched lanes (ragged rows of one cache) hide the same far keys as a lane alone: the same trees and caches."""
    from tests.test_lanes import assert_lanes_match_alone

    def make():
        torch.manual_seed(3)
        if kind == "dflash-tree":
            draft = make_dflash_draft(target, block_size=6, mask_token_id=5, draft_layers=2, target_layers=[1, 3])
        elif kind == "peagle-tree":
            draft = make_peagle_draft(target, LAYERS, mask_token_id=5, draft_layers=2)
        else:
            draft = make_draft(target, LAYERS, "reference", draft_layers=2)
        draft.config.attention_window = 5
        return draft
    assert_lanes_match_alone(target, kind, monkeypatch, make)


@pytest.mark.parametrize("field, value", [("attention_window", -1), ("tree_temperature", 0.0),
                                          ("feature_layers", [9]), ("draft_vocab_size", -2)])
def test_eagle_config_refuses_a_bad_field_by_name(target, field, value):
    config = make_draft(target, LAYERS).config
    setattr(config, field, value)
    with pytest.raises(ValueError, match=field):
        type(make_draft(target, LAYERS))(config)


@pytest.mark.parametrize("kind", ["eagle", "dflash"])
@pytest.mark.parametrize("edit, message", [({"attention_window": -5}, "attention_window must be >= 0"),
                                           ({"attention_widow": 5}, "unexpected keyword argument 'attention_widow'")])
def test_a_bad_config_file_is_named_with_its_folder(target, tmp_path, kind, edit, message):
    """A hand-edited config.json (a bad value, a misspelt field) is a one-line error that names the file."""
    import json

    from draftkit.drafters.dflash_formats import load_dflash_draft
    from draftkit.drafters.formats import load_eagle_draft

    if kind == "dflash":
        make_dflash_draft(target, block_size=6, mask_token_id=5, target_layers=[1, 3]).save_pretrained(str(tmp_path))
    else:
        make_draft(target, LAYERS).save_pretrained(str(tmp_path))
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, **edit}))
    with pytest.raises(ValueError, match=rf"^{tmp_path}/config.json: .*{message}"):
        (load_dflash_draft if kind == "dflash" else load_eagle_draft)(str(tmp_path), target)


def test_a_window_on_a_draft_that_cannot_apply_it_is_refused(target):
    from draftkit.drafters.eagle import EagleConfig, EagleDraftModel

    config = EagleConfig.from_target(target)  # draftkit's own layout: no windowed attention
    config.attention_window = 8
    with pytest.raises(ValueError, match="attention_window applies to reference-layout drafts"):
        EagleDraftModel(config)
