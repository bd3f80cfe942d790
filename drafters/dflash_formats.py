"""DFlash checkpoint layouts: draftkit's folder, z-lab's / vLLM's `dflash` folder and vllm-project/speculators'.

draftkit-dflash  config.json {kind: "dflash", ...DFlashConfig} + model.safetensors (drafters/dflash.py names)
dflash (z-lab, vLLM `method: "dflash"`, SGLang `DFLASH`; read in vLLM's models/qwen3_dflash.py):
    config: architectures ["DFlashDraftModel"], a Qwen3 config of the draft layers (num_hidden_layers = draft
    layers), block_size, num_target_layers, dflash_config {mask_token_id, target_layer_ids (z-lab ids: output
    of layer id = hidden_states[id + 1])}; we also write vLLM's top-level eagle_aux_hidden_state_layer_ids
    (hidden_states indices, the same layers), which vLLM reads first.
    weights: fc.weight [H, nH], hidden_norm.weight, norm.weight, layers.{i}.self_attn.{q,k,v,o}_proj.weight,
    layers.{i}.self_attn.{q,k}_norm.weight, layers.{i}.{input,post_attention}_layernorm.weight,
    layers.{i}.mlp.{gate,up,down}_proj.weight; no embed_tokens / lm_head / d2t (the target's are used).
speculators (vllm-project/speculators models/dflash): speculators_model_type "dflash", architectures
    ["DFlashSpeculator"], transformer_layer_config (Qwen3), draft_vocab_size, block_size,
    aux_hidden_state_layer_ids (hidden_states indices), mask_token_id, sample_from_anchor false,
    speculators_config; weights as above plus lm_head.weight and embed_tokens.weight (the target's; its model
    builds both and requires lm_head).
"""
from __future__ import annotations

import torch

from draftkit.drafters.dflash import KIND, DFlashConfig, DFlashDraft
from draftkit.drafters.eagle import _target_name, naming_config, target_shape
from draftkit.drafters.exporters import _llama_export_fields
from draftkit.drafters.formats import (ExportRefused, decoding_from, decoding_settings, read_config, read_weights,
                                      write_config, write_weights)

DFLASH_FORMATS = ("vllm", "speculators")
ARCHITECTURE = "DFlashDraftModel"


def is_dflash(cfg: dict) -> bool:
    return (cfg.get("kind") == KIND or cfg.get("speculators_model_type") == "dflash" or "dflash_config" in cfg
            or ARCHITECTURE in (cfg.get("architectures") or []))


def _layer_config(src: dict, draft_layers: int, vocab: int) -> dict:
    from types import SimpleNamespace

    from draftkit.drafters.reference_config import llama_layer_config

    lc = llama_layer_config(SimpleNamespace(**{**src, "vocab_size": vocab}))
    lc["num_hidden_layers"] = int(draft_layers)
    return lc


def load_dflash_draft(path: str, target=None) -> DFlashDraft:
    """A DFlash draft from any of the three layouts (module docstring); `target` fills what a public folder
    omits (its layer count, vocabulary) and is checked against the draft."""
    path = str(path)
    cfg = read_config(path)
    if not is_dflash(cfg):
        raise ValueError(f"{path} is not a DFlash draft (no dflash_config, speculators type or kind dflash)")
    state = read_weights(path)
    if cfg.get("kind") == KIND:
        with naming_config(path):
            draft = DFlashDraft(DFlashConfig(**cfg))
        draft = draft.load_weights(state, path)
    else:
        draft = _import_public(path, cfg, state, target)
    if target is not None:
        draft.check_target(target)
    return draft


def _import_public(path: str, cfg: dict, state: dict, target) -> DFlashDraft:
    spec = cfg.get("speculators_model_type") == "dflash"
    src = dict(cfg.get("transformer_layer_config") or {}) if spec else dict(cfg)
    dcfg = cfg.get("dflash_config") or {}
    meta = cfg.get("draftkit") or {}
    hidden, vocab = int(src["hidden_size"]), int(src.get("vocab_size") or 0)
    if spec:
        layers_ids = list(cfg.get("aux_hidden_state_layer_ids") or [])
        mask, block = cfg.get("mask_token_id"), cfg.get("block_size")
        if cfg.get("sample_from_anchor"):
            raise ValueError(f"{path}: sample_from_anchor drafts (DSpark-style) are not supported; DFlash's anchor "
                             "is the root")
    else:
        top = cfg.get("eagle_aux_hidden_state_layer_ids")
        layers_ids = list(top) if top else [int(i) + 1 for i in dcfg.get("target_layer_ids") or []]
        mask, block = dcfg.get("mask_token_id"), cfg.get("block_size") or dcfg.get("block_size")
    num_layers = cfg.get("num_target_layers") or meta.get("num_target_layers")
    if target is not None:
        t_hidden, t_vocab, t_layers = target_shape(target)
        if hidden != t_hidden or (vocab and vocab != t_vocab) or (num_layers and int(num_layers) != t_layers):
            raise ValueError(f"DFlash draft mismatch: {path} (hidden size {hidden}, vocabulary {vocab}, "
                             f"{num_layers} target layers) does not fit the target {_target_name(target)} "
                             f"(hidden size {t_hidden}, vocabulary {t_vocab}, {t_layers} layers)")
        num_layers, vocab = t_layers, vocab or t_vocab
    if not num_layers or mask is None or not block or not layers_ids:
        raise ValueError(f"{path}: a DFlash draft needs its target layer count (pass the target), mask_token_id, "
                         "block_size and the target layer ids in its config")
    state = {k[len("model."):] if k.startswith("model.") else k: v for k, v in state.items()}
    for key in ("embed_tokens.weight", "lm_head.weight", "d2t", "t2d"):  # the target's own: never ours
        w = state.pop(key, None)
        if key == "lm_head.weight" and w is not None and w.shape[0] != vocab:
            raise ValueError(f"{path}: a reduced draft vocabulary ({w.shape[0]} of {vocab}) is not supported")
    draft_layers = int(src.get("num_hidden_layers") or 1)
    config = DFlashConfig(hidden, vocab, int(num_layers), [int(k) for k in layers_ids], int(block), int(mask),
                          meta.get("target_name") or (cfg.get("speculators_config") or {}).get("verifier", {}).get(
                              "name_or_path", "") or f"the target of {path}",
                          _layer_config(src, draft_layers, vocab), **decoding_from(meta))
    return DFlashDraft(config).load_weights(state, path)


def export_dflash(draft: DFlashDraft, fmt: str, out: str, target=None, dtype: torch.dtype = torch.float16,
                  target_name: str = "", target_architectures: list[str] | None = None) -> str:
    """Write `draft` as `fmt` (vllm: z-lab's layout; speculators: needs `target` for lm_head / embed_tokens)."""
    if fmt == "sglang":
        raise ExportRefused("SGLang's DFLASH loads z-lab's layout, which --format vllm writes; use --format vllm")
    if fmt not in DFLASH_FORMATS:
        raise ExportRefused(f"format {fmt!r} cannot hold a DFlash draft; choose one of {', '.join(DFLASH_FORMATS)}")
    c = draft.config
    layer = _qwen3_fields(draft, dtype)
    ids = [int(k) for k in c.target_layers]
    meta = {"format": fmt, "target_name": target_name or c.target_name, "num_target_layers": c.num_target_layers,
            **decoding_settings(c)}
    state = dict(draft.state_dict())
    if fmt == "vllm":
        cfg = {"architectures": [ARCHITECTURE], **layer, "block_size": c.block_size,
               "num_target_layers": c.num_target_layers,
               "dflash_config": {"mask_token_id": c.mask_token_id, "target_layer_ids": [k - 1 for k in ids]},
               "eagle_aux_hidden_state_layer_ids": ids, "draftkit": meta}
    else:
        if target is None:
            raise ExportRefused("the speculators DFlash format holds the target's lm_head and embed_tokens: pass "
                                "--target")
        state["lm_head.weight"] = target.get_output_embeddings().weight.detach()
        state["embed_tokens.weight"] = target.get_input_embeddings().weight.detach()
        tl = {k: v for k, v in layer.items() if k != "torch_dtype"}
        cfg = {"speculators_model_type": "dflash", "architectures": ["DFlashSpeculator"],
               "transformer_layer_config": tl, "draft_vocab_size": c.vocab_size, "block_size": c.block_size,
               "aux_hidden_state_layer_ids": ids, "mask_token_id": c.mask_token_id, "sample_from_anchor": False,
               "speculators_config": {
                   "algorithm": "dflash",
                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.block_size - 1,
                                         "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                   "default_proposal_method": "greedy",
                   "verifier": {"name_or_path": meta["target_name"],
                                "architectures": list(target_architectures or ["LlamaForCausalLM"])}},
               "torch_dtype": layer["torch_dtype"], "draftkit": meta}
    write_weights(state, out, dtype)
    write_config(cfg, out)
    return (f"DFlash draft ({c.draft_layers} layer(s), block {c.block_size}, fused layers {ids}, mask token "
            f"{c.mask_token_id}) as {fmt}")


def _qwen3_fields(draft: DFlashDraft, dtype: torch.dtype) -> dict:
    """The draft layers' config as Qwen3 fields (q_norm / k_norm per head: what Qwen3 layers hold)."""
    fields = _llama_export_fields(draft, dtype)
    fields.update(model_type="qwen3", num_hidden_layers=draft.config.draft_layers)
    fields.pop("mlp_bias", None)
    return fields


__all__ = ["DFLASH_FORMATS", "export_dflash", "is_dflash", "load_dflash_draft"]
