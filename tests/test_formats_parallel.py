"""Export of the one-forward drafters (P-EAGLE, DFlash) to the layouts the engines load: the config keys and
tensor names the engines' loaders read (written below from reading their code; each block names the file),
and round trips (export, re-import, the same trees and outputs)."""
from __future__ import annotations

import json

import pytest
import torch

from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft
from draftkit.drafters.dflash_formats import export_dflash, load_dflash_draft
from draftkit.drafters.exporters import export_eagle
from draftkit.drafters.formats import ExportRefused, detect, load_eagle_draft, weight_shapes
from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
from draftkit.verify.decode import generate
from tests.parallel_common import PROMPTS, tiny_target

torch.set_num_threads(1)
H, L = 32, 4


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=L, hidden=H, seed=0)


@pytest.fixture(scope="module")
def peagle(target):
    torch.manual_seed(1)
    return make_peagle_draft(target, [1, 2, 3], mask_token_id=5, draft_ids=torch.arange(0, 64, 2))


@pytest.fixture(scope="module")
def dflash(target):
    torch.manual_seed(1)
    return make_dflash_draft(target, block_size=5, mask_token_id=5, draft_layers=2, target_layers=[1, 3])


def config(path) -> dict:
    return json.loads((path / "config.json").read_text())


def trees_and_outputs(target, drafter, n: int = 14) -> list:
    """The first proposed tree (tokens, parents) and the greedy output of every prompt."""
    seen = []
    propose = drafter.propose

    def record(state):
        tree = propose(state)
        if len(tree) and len(seen) < len(PROMPTS):
            seen.append((tree.tokens.tolist(), tree.parents.tolist()))
        return tree
    drafter.propose = record
    outs = [generate(target, p, drafter=drafter, max_new_tokens=n, eos_token_id=[], budget="fixed").tokens.tolist()
            for p in PROMPTS]
    return seen + outs


# ---- P-EAGLE --------------------------------------------------------------------------------------------

def test_peagle_vllm_layout(tmp_path, peagle):
    export_eagle(peagle, "vllm", str(tmp_path), torch.float32, target_name="t")
    cfg, names = config(tmp_path), set(weight_shapes(str(tmp_path)))
    # vllm/v1/spec_decode/llm_base_proposer.py (_init_parallel_drafting_params) and
    # vllm/v1/worker/gpu/spec_decode/peagle speculator: the placeholder token is pard_token, else ptd_token_id
    assert cfg["pard_token"] == cfg["ptd_token_id"] == 5
    # vllm/model_executor/models/llama_eagle3.py: the EAGLE-3 folder (architectures, draft_vocab_size, the
    # aux layer ids read by eagle3_utils.get_eagle3_aux_layers_from_config) ...
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 32
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3] and "bias" not in cfg
    # ... whose load_weights copies mask_hidden (viewed (1, 3H)) when parallel_drafting is on, drops t2d,
    # renames d2t and midlayer. -> layers.0., and reads fc / norm / lm_head
    expected = {"mask_hidden", "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
                *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
                *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
                *(f"midlayer.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm"))}
    assert names == expected
    shapes = weight_shapes(str(tmp_path))
    assert shapes["mask_hidden"] == (1, 1, 3 * H) and shapes["fc.weight"] == (H, 3 * H)
    assert shapes["midlayer.self_attn.q_proj.weight"][1] == 2 * H and shapes["lm_head.weight"] == (32, H)


def test_peagle_speculators_layout(tmp_path, peagle):
    export_eagle(peagle, "speculators", str(tmp_path), torch.float32, target_name="t")
    cfg = config(tmp_path)
    # vllm-project/speculators src/speculators/models/peagle/config.py: type "peagle", PEagleSpeculator,
    # mask_token_id (vLLM's transformers_utils/configs/speculators/algos.py update_peagle maps it to pard_token)
    assert cfg["speculators_model_type"] == "peagle" and cfg["architectures"] == ["PEagleSpeculator"]
    assert cfg["mask_token_id"] == 5 and cfg["speculators_config"]["algorithm"] == "peagle"
    assert cfg["norm_before_residual"] is False  # absent would mean true to vLLM
    names = set(weight_shapes(str(tmp_path)))
    assert "mask_hidden" in names and "layers.0.hidden_norm.weight" in names and not any("midlayer" in n for n in names)


def test_peagle_sglang_is_refused(tmp_path, peagle):
    with pytest.raises(ExportRefused, match="SGLang has no parallel drafting"):
        export_eagle(peagle, "sglang", str(tmp_path))


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_peagle_round_trip(tmp_path, target, peagle, fmt):
    export_eagle(peagle, fmt, str(tmp_path), torch.float32, target_name="t")
    back = load_eagle_draft(str(tmp_path), target)
    assert back.config.mask_token_id == 5 and torch.equal(back.mask_hidden, peagle.mask_hidden)
    flags = dict(max_depth=4, max_nodes=8, top_k=2)
    assert trees_and_outputs(target, PEagleDrafter(target, back, **flags)) == \
        trees_and_outputs(target, PEagleDrafter(target, peagle, **flags))


def test_peagle_without_mask_hidden_is_refused(tmp_path, peagle):
    from safetensors.torch import load_file, save_file

    export_eagle(peagle, "vllm", str(tmp_path), torch.float32)
    state = load_file(str(tmp_path / "model.safetensors"))
    state.pop("mask_hidden")
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="needs both mask_hidden"):
        load_eagle_draft(str(tmp_path))


# ---- DFlash ---------------------------------------------------------------------------------------------

def test_dflash_vllm_layout(tmp_path, dflash):
    export_dflash(dflash, "vllm", str(tmp_path), dtype=torch.float32, target_name="t")
    cfg, shapes = config(tmp_path), weight_shapes(str(tmp_path))
    # vllm/model_executor/models/registry.py: "DFlashDraftModel" -> qwen3_dflash.DFlashQwen3ForCausalLM
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    # vllm/v1/spec_decode/llm_base_proposer.py reads dflash_config.mask_token_id; z-lab dflash/model.py reads
    # block_size, num_target_layers, dflash_config.target_layer_ids (hidden_states[id + 1]); vLLM's
    # eagle3_utils.get_eagle3_aux_layers_from_config reads eagle_aux_hidden_state_layer_ids first, else those + 1
    assert cfg["dflash_config"] == {"mask_token_id": 5, "target_layer_ids": [0, 2]}
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3] and cfg["block_size"] == 5
    assert cfg["num_target_layers"] == L and cfg["num_hidden_layers"] == 2
    # qwen3_dflash.py: no is_causal / dflash_config.causal / sliding layer_types, so every layer is non-causal
    assert "is_causal" not in cfg and "layer_types" not in cfg and "causal" not in cfg["dflash_config"]
    # qwen3_dflash.py DFlashQwen3Model / load_weights: layers.{i}.self_attn.{q,k,v,o}_proj (q/k/v stacked into
    # qkv_proj), q_norm, k_norm, mlp.{gate,up,down}_proj, input / post_attention layernorms, fc, hidden_norm,
    # norm; embed_tokens / lm_head optional (the target's are shared), no mask_hidden (an assert)
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        expected |= {f"layers.{i}.self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {f"layers.{i}.self_attn.{n}_norm.weight" for n in "qk"}
        expected |= {f"layers.{i}.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        expected |= {f"layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")}
    assert set(shapes) == expected
    # fc input: target_hidden_size * the number of aux layers (_get_dflash_fc_input_size); per-head norms
    assert shapes["fc.weight"] == (H, 2 * H) and shapes["layers.0.self_attn.q_norm.weight"] == (cfg["head_dim"],)
    assert detect(str(tmp_path)) == "dflash"


def test_dflash_speculators_layout(tmp_path, target, dflash):
    export_dflash(dflash, "speculators", str(tmp_path), target, torch.float32, target_name="t")
    cfg, names = config(tmp_path), set(weight_shapes(str(tmp_path)))
    # vllm-project/speculators src/speculators/models/dflash/config.py and core.py (DFlashDraftModel: lm_head is
    # required on load, embed_tokens optional; aux_hidden_state_layer_ids are hidden_states indices, as
    # convert/dflash/converter.py maps z-lab's ids to id + 1)
    assert cfg["speculators_model_type"] == "dflash" and cfg["architectures"] == ["DFlashSpeculator"]
    assert cfg["aux_hidden_state_layer_ids"] == [1, 3] and cfg["mask_token_id"] == 5 and cfg["block_size"] == 5
    assert cfg["sample_from_anchor"] is False and cfg["draft_vocab_size"] == 64
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 2
    assert {"lm_head.weight", "embed_tokens.weight", "fc.weight", "layers.1.self_attn.k_norm.weight"} <= names


@pytest.mark.parametrize("fmt", ["vllm", "speculators"])
def test_dflash_round_trip(tmp_path, target, dflash, fmt):
    export_dflash(dflash, fmt, str(tmp_path), target, torch.float32, target_name="t")
    back = load_dflash_draft(str(tmp_path), target)
    assert back.config.target_layers == [1, 3] and back.config.block_size == 5
    flags = dict(max_depth=4, max_nodes=8, top_k=2)
    assert trees_and_outputs(target, DFlashDrafter(target, back, **flags)) == \
        trees_and_outputs(target, DFlashDrafter(target, dflash, **flags))


def test_dflash_draftkit_folder_round_trip(tmp_path, target, dflash):
    dflash.save_pretrained(str(tmp_path), dtype=torch.float32)
    assert detect(str(tmp_path)) == "draftkit-dflash"
    back = DFlashDrafter.from_pretrained(str(tmp_path), target)
    assert trees_and_outputs(target, back) == trees_and_outputs(target, DFlashDrafter(target, dflash))


def test_dflash_export_refusals(tmp_path, dflash):
    with pytest.raises(ExportRefused, match="--format vllm"):
        export_dflash(dflash, "sglang", str(tmp_path))
    with pytest.raises(ExportRefused, match="pass --target"):
        export_dflash(dflash, "speculators", str(tmp_path))


def test_dflash_for_another_target_is_refused(tmp_path, dflash):
    export_dflash(dflash, "vllm", str(tmp_path), dtype=torch.float32)
    with pytest.raises(ValueError, match="does not fit the target"):
        load_dflash_draft(str(tmp_path), tiny_target(layers=6, hidden=H))
