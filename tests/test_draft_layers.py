"""EAGLE-3 and P-EAGLE drafts of more than one decoder layer (drafters/eagle_reference.py `later_layers`):
lossless decoding, the incremental P-EAGLE forward against a recomputation, growing a trained draft without
changing its outputs (`deepen`), the engines' layer names on export and import, and the training flag."""
from __future__ import annotations

import json

import pytest
import torch

from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.eagle_reference import deepen, make_draft
from draftkit.drafters.exporters import export_eagle
from draftkit.drafters.formats import ExportRefused, load_eagle_draft, weight_shapes
from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
from draftkit.verify.decode import generate
from tests.parallel_common import PROMPTS, assert_greedy_equal, tiny_target

torch.set_num_threads(1)
LAYERS = [1, 2, 3]
H = 32


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=4, hidden=H, seed=0)


def peagle(target, layers=3, seed=1):
    torch.manual_seed(seed)
    return make_peagle_draft(target, LAYERS, mask_token_id=5, draft_ids=torch.arange(0, 64, 2), draft_layers=layers)


@pytest.mark.parametrize("top_k", [1, 3])
def test_deep_peagle_greedy_matches_plain(target, top_k):
    drafter = PEagleDrafter(target, peagle(target), max_depth=4, max_nodes=10, top_k=top_k)
    assert drafter.alone.cache.layers and len(drafter.alone.cache.layers) == 3
    assert_greedy_equal(target, drafter, "fixed")


def test_deep_eagle3_greedy_matches_plain(target):
    torch.manual_seed(2)
    draft = make_draft(target, LAYERS, "reference", draft_layers=2)
    assert len(draft.later_layers) == 1
    assert_greedy_equal(target, EagleDrafter(target, draft, max_depth=3, max_nodes=8, top_k=2), "auto")


def test_deep_peagle_step_equals_a_recomputation(target):
    """Each step's per-depth logits (the committed pairs read from every layer's cache, the placeholders appended)
    equal one draft forward from scratch over the committed pairs and the placeholders."""
    draft = peagle(target).eval()
    drafter = PEagleDrafter(target, draft, max_depth=4, max_nodes=4, top_k=1)
    seen, logits_of = [], drafter.alone.logits
    propose = drafter.propose

    def record(state):
        seen.append([state.tokens.clone(), None])
        return propose(state)

    def logits(out):
        result = logits_of(out)
        if seen and seen[-1][1] is None and out.shape[0] == 4:
            seen[-1][1] = result
        return result
    drafter.propose, drafter.alone.logits = record, logits
    generate(target, PROMPTS[2], drafter=drafter, max_new_tokens=16, eos_token_id=[], budget="fixed")
    embed, head = target.get_input_embeddings(), target.get_output_embeddings()
    checked = 0
    with torch.no_grad():
        for tokens, got in seen:
            if got is None or tokens.numel() < 3:
                continue
            hs = target(input_ids=tokens[None, :-1], output_hidden_states=True).hidden_states
            feats = torch.cat([torch.cat([hs[k] for k in LAYERS], -1)[0], draft.placeholders(3)])
            ids = torch.cat([tokens[1:], torch.full((3,), 5)])
            out = draft(feats[None], embed(ids)[None])[0, -4:]
            torch.testing.assert_close(got, draft.logits(out, head), atol=1e-4, rtol=1e-4)
            checked += 1
    assert checked >= 3


def test_deepen_keeps_the_outputs_until_trained(target):
    torch.manual_seed(4)
    base = make_draft(target, LAYERS, "reference")
    deeper = deepen(base, 3)
    assert deeper.layer_config.num_hidden_layers == 3 and len(deeper.later_layers) == 2
    x, e = torch.randn(1, 6, 3 * H), torch.randn(1, 6, H)
    with torch.no_grad():
        torch.testing.assert_close(deeper(x, e), base(x, e))
        deeper.later_layers[1].mlp.down_proj.weight.normal_()  # the check can fail: a live layer changes them
        assert not torch.allclose(deeper(x, e), base(x, e))
    with pytest.raises(ValueError, match="cannot be cut"):
        deepen(deeper, 2)


def test_eagle12_drafts_keep_one_layer(target):
    with pytest.raises(ValueError, match="exactly one"):
        make_draft(target, [], "reference", draft_layers=2)
    with pytest.raises(ValueError, match="more than one draft layer needs layout: reference"):
        make_draft(target, LAYERS, "draftkit", draft_layers=2)


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_export_names_the_engines_layers_and_round_trips(tmp_path, target, fmt):
    draft = peagle(target)
    export_eagle(draft, fmt, str(tmp_path), torch.float32, target_name="t")
    cfg = json.loads((tmp_path / "config.json").read_text())
    layer_cfg = cfg["transformer_layer_config"] if fmt == "speculators" else cfg
    assert layer_cfg["num_hidden_layers"] == 3
    names = set(weight_shapes(str(tmp_path)))
    # vllm/model_executor/models/llama_eagle3.py builds layers.0 (2H inputs) .. layers.{n-1} (H inputs)
    assert {"layers.1.self_attn.q_proj.weight", "layers.2.mlp.down_proj.weight"} <= names
    assert not any(n.startswith("later_layers") for n in names)
    assert weight_shapes(str(tmp_path))["layers.1.self_attn.q_proj.weight"][1] == H
    back = load_eagle_draft(str(tmp_path), target)
    assert back.layer_config.num_hidden_layers == 3
    for name, tensor in draft.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name].to(tensor.dtype), tensor, msg=name)


def test_sglang_refuses_a_deep_draft(tmp_path, target):
    torch.manual_seed(5)
    with pytest.raises(ExportRefused, match="one draft layer"):
        export_eagle(make_draft(target, LAYERS, "reference", draft_layers=2), "sglang", str(tmp_path))


def test_import_refuses_missing_layer_weights(tmp_path, target):
    from safetensors.torch import load_file, save_file

    export_eagle(peagle(target), "vllm", str(tmp_path), torch.float32)
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file({k: v for k, v in state.items() if not k.startswith("layers.2.")}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="says 3 draft layers, the weights hold layers \\[0, 1\\]"):
        load_eagle_draft(str(tmp_path), target)


def test_training_flag_is_checked():
    from draftkit.train.config import TrainError
    from draftkit.train.eagle import EagleTrainConfig

    with pytest.raises(TrainError, match="draft_layers"):
        EagleTrainConfig(draft_layers=2, layout="draftkit", feature_layers=[1, 2, 3])
    with pytest.raises(TrainError, match="draft_layers"):
        EagleTrainConfig(draft_layers=0)
