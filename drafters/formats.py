"""Drafter checkpoint formats: detect a folder's layout, import it as a draftkit drafter, export to
the folders vLLM, SGLang, vllm-project/speculators and FasterDecoding/Medusa load as they are.

EAGLE (imports into drafters/eagle_reference.py's reference-exact drafts):
    eagle3        midlayer.* + fc [H, 3H] + norm + lm_head [Vd, H] + d2t/t2d: SafeAILab EAGLE-3
                  (config LlamaForCausalLM + draft_vocab_size), SpecForge and our vllm/sglang export
                  (LlamaForCausalLMEagle3). Fused layers: top-level eagle_aux_hidden_state_layer_ids
                  (vLLM: id k = the residual stream entering layer k = hidden_states[k]), else
                  eagle_config.eagle_aux_hidden_state_layer_ids (SGLang: id j = output of layer j =
                  hidden_states[j + 1]), else the default (2, L // 2, L - 3) all engines share.
    speculators   speculators_model_type "eagle3": transformer_layer_config + layers.0.* weights;
                  norm_before_residual absent means true (what vLLM assumes).
    eagle1        fc [H, 2H] (+ fc.bias: SafeAILab's original, SGLang's zero bias) + layers.0.*
                  without input_layernorm (+ embed_tokens.weight, ignored): SafeAILab EAGLE-1,
                  our vllm (LlamaForCausalLM) and sglang (LlamaForCausalLMEagle) exports.
Medusa (imports into drafters.medusa.MedusaHeads):
    medusa-vllm      config model_type "medusa"; blocks.{k}.layers.{l}.weight/.bias, lm_heads.{k}.weight
                     (original_lm_head: lm_heads.0 only); biases only with medusa_fc_bias, as vLLM loads.
    medusa-original  FasterDecoding: config medusa_num_heads / medusa_num_layers; medusa_lm_head.safetensors
                     (or .pt) with {k}.{l}.linear.weight/.bias and {k}.{L}.weight (absent: the base LM head).

A checkpoint made for another target (hidden size, vocabulary, layer count) is a one-line ValueError
naming both. Export refusals (a format that cannot hold the drafter) are ExportRefused.
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch

from draftkit.drafters.eagle import EagleConfig, EagleDraftModel, _target_name, naming_config, target_shape
from draftkit.drafters.eagle_reference import build_draft
from draftkit.drafters.reference_config import LAYOUT, check_feature_layers, engine_layers, llama_layer_config
from draftkit.verify.contract import DraftMismatch

CONFIG = "config.json"
TOKEN_MAP = "hot_token_ids.pt"  # EAGLE-1/2 draft vocabulary for SGLang's --speculative-token-map


class ExportRefused(ValueError):
    """The requested format cannot hold this drafter (one-line reason)."""


# draftkit's own decoding settings of a draft (EagleConfig / DFlashConfig fields no engine reads): an export keeps
# them in its "draftkit" block, so that the folder loaded back drafts exactly as its source did
DECODING_FIELDS = ("tree_temperature", "attention_window")


def decoding_settings(config) -> dict:
    """The draft config's DECODING_FIELDS, for an export's "draftkit" block."""
    return {k: getattr(config, k) for k in DECODING_FIELDS}


def decoding_from(meta: dict) -> dict:
    """The DECODING_FIELDS an export's "draftkit" block holds (none in a folder from elsewhere: the defaults)."""
    return {k: meta[k] for k in DECODING_FIELDS if k in meta}


# ----------------------------------------------------------------------------- files


def read_config(path: str) -> dict:
    p = os.path.join(path, CONFIG)
    if not os.path.exists(p):
        raise FileNotFoundError(f"{path} holds no {CONFIG}")
    with open(p) as fh:
        return json.load(fh)


def read_weights(path: str, names: tuple[str, ...] = ("model.safetensors", "pytorch_model.bin")) -> dict:
    """All tensors of a folder: the first of `names` present, or a sharded *.index.json."""
    from safetensors.torch import load_file

    for name in names:
        p = os.path.join(path, name)
        if os.path.exists(p):
            return load_file(p) if name.endswith(".safetensors") else torch.load(p, map_location="cpu",
                                                                               weights_only=True)
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        p = os.path.join(path, index)
        if os.path.exists(p):
            with open(p) as fh:
                shards = sorted(set(json.load(fh)["weight_map"].values()))
            state = {}
            for s in shards:
                state.update(read_weights(path, (s,)))
            return state
    raise FileNotFoundError(f"{path} holds no weights ({', '.join(names)} or a sharded index)")


def write_weights(state: dict, path: str, dtype: torch.dtype, name: str = "model.safetensors") -> None:
    """safetensors with floats cast to `dtype`, integer / bool tensors kept."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    save_file({k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous() for k, v in state.items()},
              os.path.join(path, name), metadata={"format": "pt"})


def write_config(cfg: dict, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG), "w") as fh:
        json.dump(cfg, fh, indent=2)


def _strip(state: dict, prefix: str) -> dict:
    return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}


# ----------------------------------------------------------------------------- detection


def detect(path: str) -> str:
    """draftkit-eagle, draftkit-eagle-reference, draftkit-medusa, eagle3, speculators, eagle1,
    medusa-vllm, medusa-original, draftkit-dflash, dflash (z-lab / vLLM), speculators-dflash or standalone
    (a plain Hugging Face causal LM). P-EAGLE folders are EAGLE-3 ones (eagle3, speculators, draftkit's)."""
    cfg = read_config(path)
    if cfg.get("kind") == "dflash":
        return "draftkit-dflash"
    if cfg.get("speculators_model_type") == "dflash":
        return "speculators-dflash"
    if "dflash_config" in cfg or "DFlashDraftModel" in (cfg.get("architectures") or []):
        return "dflash"
    if cfg.get("kind") == "eagle":
        return "draftkit-eagle" if cfg.get("layout", "draftkit") == "draftkit" else "draftkit-eagle-reference"
    if cfg.get("model_type") == "draftkit-medusa":
        return "draftkit-medusa"
    if "speculators_model_type" in cfg:
        return "speculators"
    archs = cfg.get("architectures") or []
    if cfg.get("model_type") == "medusa" or ("MedusaModel" in archs and "medusa_num_heads" not in cfg):
        return "medusa-vllm"
    if "medusa_num_heads" in cfg or any(os.path.exists(os.path.join(path, f)) for f in
                                        ("medusa_lm_head.safetensors", "medusa_lm_head.pt")):
        return "medusa-original"
    if "LlamaForCausalLMEagle3" in archs or "draft_vocab_size" in cfg:
        return "eagle3"
    if "LlamaForCausalLMEagle" in archs:
        return "eagle1"
    shapes = weight_shapes(path)
    if any(k.startswith("midlayer.") for k in shapes):
        return "eagle3"
    fc = shapes.get("fc.weight")
    if fc is not None and any(k.startswith("layers.0.") for k in shapes):
        return "eagle3" if fc[1] == 3 * fc[0] else "eagle1"
    return "standalone"


def weight_shapes(path: str) -> dict:
    """{key: shape} of a folder's weights without reading them (safetensors headers, a memory-mapped .bin)."""
    from safetensors import safe_open

    files = []
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        p = os.path.join(path, index)
        if os.path.exists(p):
            with open(p) as fh:
                files = sorted(set(json.load(fh)["weight_map"].values()))
    files = files or [f for f in ("model.safetensors", "pytorch_model.bin")
                      if os.path.exists(os.path.join(path, f))][:1]
    shapes = {}
    for f in files:
        p = os.path.join(path, f)
        if f.endswith(".safetensors"):
            with safe_open(p, framework="pt") as fh:
                shapes.update({k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()})
        else:
            try:
                state = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError:  # an old (non-zip) pickle cannot be memory-mapped
                state = torch.load(p, map_location="cpu", weights_only=True)
            shapes.update({k: tuple(v.shape) for k, v in state.items()})
    return shapes


# ----------------------------------------------------------------------------- EAGLE import


def _made_for(cfg: dict, path: str) -> str:
    meta = cfg.get("draftkit") or {}
    spec = (cfg.get("speculators_config") or {}).get("verifier") or {}
    return (meta.get("target_name") or spec.get("name_or_path") or cfg.get("base_model_name_or_path")
            or cfg.get("_name_or_path") or f"the target of {path}")


def _mismatch(path, made, made_shape, target) -> ValueError:
    hidden, vocab, layers = target_shape(target)
    name = _target_name(target) or type(target).__name__
    return ValueError(f"EAGLE draft mismatch: {path} was made for {made} ({made_shape}) but the target {name} has "
                      f"hidden size {hidden}, vocabulary {vocab}, {layers} layers; use a draft trained for this target")


def _aux_layers(cfg: dict, num_layers: int) -> list[int]:
    """Our hidden_states indices of the three fused target layers (see the module docstring)."""
    top = cfg.get("eagle_aux_hidden_state_layer_ids")
    sglang = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if top:  # the engines concatenate the captured states in layer order
        return sorted(int(k) for k in top)
    if sglang:
        return sorted(int(j) + 1 for j in sglang)
    return engine_layers(num_layers)


def load_eagle_draft(path: str, target=None):
    """An EAGLE draft from any supported folder (see the module docstring); `target` supplies what a
    public checkpoint omits (its layer count, default fused layers) and is checked against it."""
    path = str(path)
    cfg = read_config(path)
    fmt = detect(path)
    if fmt == "draftkit-eagle":
        draft = EagleDraftModel.from_pretrained(path)
    elif fmt == "draftkit-eagle-reference":
        with naming_config(path):
            draft = build_draft(EagleConfig(**cfg))
        draft = draft.load_weights(read_weights(path), path)
    elif fmt in ("eagle3", "speculators", "eagle1"):
        draft = _import_public_eagle(path, cfg, fmt, target)
    else:
        raise ValueError(f"{path} is not an EAGLE draft (detected {fmt}); EAGLE loads draftkit folders, SafeAILab "
                         "EAGLE-1/EAGLE-3, SpecForge, speculators and vLLM/SGLang EAGLE folders")
    if target is not None:
        draft.check_target(target)
    return draft


def _import_public_eagle(path: str, cfg: dict, fmt: str, target):
    state = _strip(read_weights(path), "model.")
    layer_src = dict(cfg.get("transformer_layer_config") or {}) if fmt == "speculators" else dict(cfg)
    if fmt == "speculators":
        if cfg.get("speculators_model_type") not in ("eagle3", "peagle"):
            raise ValueError(f"{path}: speculators type {cfg.get('speculators_model_type')!r} is not supported "
                             "here (EAGLE loads eagle3 and peagle; dflash loads with the dflash drafter)")
        fmt = "eagle3"
    for flag in ("norm_before_fc", "fc_norm", "norm_output", "add_para_norm"):
        if cfg.get(flag) or layer_src.get(flag):
            raise ValueError(f"{path}: {flag} is set; only the reference EAGLE computation is supported")
    meta = cfg.get("draftkit") or {}
    hidden = int(layer_src["hidden_size"])
    vocab = int(layer_src.get("vocab_size") or 0)
    th = cfg.get("target_hidden_size") or layer_src.get("target_hidden_size")
    made = _made_for(cfg, path)
    if th and int(th) != hidden:
        raise ValueError(f"{path}: a draft with hidden size {hidden} over a target of hidden size {th} is not "
                         "supported (draftkit drafts share the target's hidden size)")
    if target is not None:
        t_hidden, t_vocab, t_layers = target_shape(target)
        if hidden != t_hidden or (vocab and vocab != t_vocab):
            raise _mismatch(path, made, f"hidden size {hidden}, vocabulary {vocab}", target)
        if meta.get("num_target_layers") and int(meta["num_target_layers"]) != t_layers:  # our own exports say
            raise _mismatch(path, made, f"hidden size {hidden}, vocabulary {vocab}, {meta['num_target_layers']} layers",
                            target)
        num_layers = t_layers
        vocab = vocab or t_vocab
    elif meta.get("num_target_layers"):
        num_layers = int(meta["num_target_layers"])
    else:
        raise ValueError(f"{path}: pass the target (its layer count is not in this checkpoint)")
    layer_config = llama_layer_config(SimpleNamespace(**{**layer_src, "vocab_size": vocab}))
    if fmt == "eagle3":
        state = {_draft_layer_name(k): v for k, v in state.items()}
        layer_config["num_hidden_layers"] = _eagle3_layers(state, layer_src, path)
    layer_config["attention_bias"] = bool(layer_src.get("attention_bias", False))
    layer_config["mlp_bias"] = bool(layer_src.get("mlp_bias", False))
    for k in ("embed_tokens.weight", "lm_head.weight") if fmt == "eagle1" else ("embed_tokens.weight",):
        w = state.pop(k, None)
        if w is not None and target is not None and k == "embed_tokens.weight" \
                and tuple(w.shape) != tuple(target.get_input_embeddings().weight.shape):
            raise _mismatch(path, made, f"embedding {tuple(w.shape)}", target)
    bias = state.pop("fc.bias", None)
    has_bias = bias is not None and bool(bias.abs().max() > 0)
    if fmt == "eagle3":
        feats = _aux_layers(cfg, num_layers)
        if not all(1 <= k <= num_layers - 1 for k in feats) and target is not None:
            raise _mismatch(path, made, f"fused layers {feats} of a deeper target", target)
        check_feature_layers(feats, num_layers)
        if has_bias:
            raise ValueError(f"{path}: EAGLE-3 fc has a non-zero bias, which vLLM and SGLang do not compute")
        if "lm_head.weight" not in state:  # SGLang then takes the target's head (full vocabulary)
            if target is None or cfg.get("draft_vocab_size") not in (None, vocab):
                raise ValueError(f"{path}: no lm_head.weight (pass the target to use its LM head)")
            state["lm_head.weight"] = target.get_output_embeddings().weight.detach().float().cpu()
        draft_vocab = int(cfg.get("draft_vocab_size") or state["lm_head.weight"].shape[0])
        if "d2t" not in state:
            if draft_vocab < vocab:
                raise ValueError(f"{path}: a draft vocabulary of {draft_vocab} < {vocab} needs d2t")
            state["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
        if "t2d" not in state:
            t2d = torch.zeros(vocab, dtype=torch.bool)
            t2d[torch.arange(draft_vocab) + state["d2t"].long()] = True
            state["t2d"] = t2d
        state["d2t"], state["t2d"] = state["d2t"].long(), state["t2d"].bool()
        norm_before = cfg.get("norm_before_residual", True) if "speculators_model_type" in cfg \
            else cfg.get("norm_before_residual", False)
        config = EagleConfig(hidden, vocab, num_layers, feats, made, layer_config, layout=LAYOUT,
                             draft_vocab_size=draft_vocab if draft_vocab < vocab else 0,
                             norm_before_residual=bool(norm_before), mask_token_id=_parallel_token(cfg, state, path),
                             **decoding_from(meta))
        if config.mask_token_id is not None:  # vLLM views it as (1, 3H); speculators saves (1, 1, 3H)
            state["mask_hidden"] = state["mask_hidden"].reshape(1, 1, -1)
    else:
        if int(layer_src.get("num_hidden_layers", 1)) != 1:
            raise ValueError(f"{path}: EAGLE-1 drafts with {layer_src.get('num_hidden_layers')} layers are not "
                             "supported")
        if any(k.startswith("layers.0.input_layernorm") for k in state):
            raise ValueError(f"{path}: layer 0 has an input_layernorm, which the reference EAGLE-1 does not have")
        if has_bias:
            state["fc.bias"] = bias
        hot = os.path.join(path, TOKEN_MAP)  # a draft vocabulary as SGLang's token map (our sglang export)
        ids = torch.as_tensor(torch.load(hot, weights_only=True)).long().unique() if os.path.exists(hot) else None
        if ids is not None and ids.numel() < vocab:
            from draftkit.drafters.reference_config import vocab_mapping

            state["d2t"], state["t2d"] = vocab_mapping(ids, vocab)
        reduced = ids is not None and ids.numel() < vocab
        config = EagleConfig(hidden, vocab, num_layers, [num_layers], made, layer_config, layout=LAYOUT,
                             fc_bias=has_bias, draft_vocab_size=int(ids.numel()) if reduced else 0,
                             **decoding_from(meta))
    return build_draft(config).load_weights(state, path)


def engine_layer_name(key: str) -> str:
    """later_layers.i.* (the draft's decoder layers after its first) as the engines name them: layers.(i + 1).*"""
    if not key.startswith("later_layers."):
        return key
    index, rest = key[len("later_layers."):].split(".", 1)
    return f"layers.{int(index) + 1}.{rest}"


def _draft_layer_name(key: str) -> str:
    """An EAGLE-3 weight's name in the engines' layout (layers.0 = the fusing first layer, SafeAILab's midlayer;
    layers.k = plain layers after it) as the draft names it (midlayer, later_layers.(k - 1))."""
    if not key.startswith("layers."):
        return key
    index, rest = key[len("layers."):].split(".", 1)
    return f"midlayer.{rest}" if index == "0" else f"later_layers.{int(index) - 1}.{rest}"


def _eagle3_layers(state: dict, layer_src: dict, path: str) -> int:
    """The draft's decoder layers: its weights' (the first plus later_layers), which must be what the config's
    num_hidden_layers says (a folder missing a layer's weights would otherwise draft with fewer layers)."""
    later = {int(k.split(".")[1]) for k in state if k.startswith("later_layers.")}
    layers = 1 + (max(later) + 1 if later else 0)
    said = int(layer_src.get("num_hidden_layers") or 1)
    if later != set(range(layers - 1)) or said != layers:
        raise ValueError(f"{path}: config.json says {said} draft layers, the weights hold layers "
                         f"{sorted({0} | {k + 1 for k in later})}")
    return layers


def _parallel_token(cfg: dict, state: dict, path: str) -> int | None:
    """P-EAGLE's placeholder token (speculators mask_token_id, vLLM pard_token / ptd_token_id), or None for a
    plain EAGLE-3 draft; a token without mask_hidden (or the reverse) is a one-line error."""
    token = next((cfg[k] for k in ("mask_token_id", "pard_token", "ptd_token_id") if cfg.get(k) is not None), None)
    if (token is None) != ("mask_hidden" not in state):
        have = "a placeholder token but no mask_hidden" if token is not None else "mask_hidden but no placeholder token"
        raise ValueError(f"{path}: a parallel-drafting (P-EAGLE) draft needs both mask_hidden and pard_token / "
                         f"ptd_token_id / mask_token_id; it has {have}")
    return None if token is None else int(token)


# ----------------------------------------------------------------------------- Medusa import


def _medusa_counts(cfg: dict) -> tuple[int | None, int | None]:
    """(heads, layers per head) the way vLLM's MedusaConfig reads them: any key with num+heads / num+layers."""
    heads = layers = None
    for k, v in cfg.items():
        if "num" in k and "heads" in k and "attention" not in k:
            heads = int(v)
        elif "num" in k and "layers" in k:
            layers = int(v)
    return heads, layers


def load_medusa_heads(path: str, target):
    """MedusaHeads from vLLM's or FasterDecoding's Medusa layout, checked against `target`."""
    from draftkit.drafters.medusa import MedusaHeads

    path = str(path)
    cfg = read_config(path)
    fmt = detect(path)
    made = _made_for(cfg, path)
    t_vocab, t_hidden = target.get_output_embeddings().weight.shape
    name = _target_name(target) or type(target).__name__
    if fmt == "medusa-vllm":
        state = _strip(read_weights(path), "medusa_heads.")
        num_heads, num_layers = _medusa_counts(cfg)
        trunc = cfg.get("truncated_vocab_size")
        if "token_map" in state or (trunc and int(trunc) < int(cfg.get("vocab_size", trunc))):
            raise ValueError(f"{path}: truncated-vocabulary Medusa (token_map) is not supported")
        use_bias = bool(cfg.get("medusa_fc_bias", False))  # vLLM skips bias tensors without it
        blocks = {f"blocks.{k}.{l}.linear.{p}": state.get(f"blocks.{k}.layers.{l}.{p}")
                  for k in range(num_heads) for l in range(num_layers) for p in ("weight", "bias")}
        if cfg.get("original_lm_head"):
            heads_w = [state["lm_heads.0.weight"]] * num_heads
        else:
            heads_w = [state.get(f"lm_heads.{k}.weight") for k in range(num_heads)]
    elif fmt == "medusa-original":
        names = ("medusa_lm_head.safetensors", "medusa_lm_head.pt", "model.safetensors", "pytorch_model.bin")
        state = _strip(_strip(read_weights(path, names), "medusa_head."), "base_model.")
        num_heads, num_layers = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
        use_bias = True
        blocks = {}
        for k in range(num_heads):
            for l in range(num_layers):
                for p in ("weight", "bias"):  # [ResBlock] * L: one block repeated, saved once or L times
                    blocks[f"blocks.{k}.{l}.linear.{p}"] = state.get(f"{k}.{l}.linear.{p}",
                                                                     state.get(f"{k}.0.linear.{p}"))
        heads_w = [state.get(f"{k}.{num_layers}.weight") for k in range(num_heads)]
    else:
        raise ValueError(f"{path} is not a Medusa checkpoint (detected {fmt})")
    if num_heads is None or num_layers is None:
        raise ValueError(f"{path}: config has no head / layer counts")
    missing = [k for k, v in blocks.items() if v is None and (k.endswith("weight") or use_bias)]
    if missing:
        raise ValueError(f"{path}: Medusa weights missing: {missing[:4]}")
    hidden = int(cfg.get("hidden_size") or (next(iter(blocks.values())).shape[1] if num_layers else t_hidden))
    shared = all(w is None for w in heads_w)
    if not shared and any(w is None for w in heads_w):
        raise ValueError(f"{path}: some Medusa heads have an LM head and some do not")
    vocab = int(cfg.get("vocab_size") or (t_vocab if shared else heads_w[0].shape[0]))
    if (hidden, vocab) != (t_hidden, t_vocab):
        raise DraftMismatch(f"Medusa heads at {path} were trained for target {made} (hidden size {hidden}, vocabulary "
                         f"{vocab}); this target {name} has hidden size {t_hidden} and vocabulary {t_vocab}")
    if not shared and all(w is heads_w[0] for w in heads_w) and torch.equal(  # compared in the file's dtype
            heads_w[0], target.get_output_embeddings().weight.detach().cpu().to(heads_w[0].dtype)):
        shared = True  # vLLM's original_lm_head: a copy of the target's own head
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers, share_lm_head=shared)
    own = {}
    for k, v in blocks.items():
        if v is None or (k.endswith("bias") and not use_bias):
            v = torch.zeros(hidden)
        own[k] = v.float()
    if not shared:
        own.update({f"proj.{k}.weight": w.float() for k, w in enumerate(heads_w)})
    heads.load_state_dict(own, strict=True)
    return heads


__all__ = ["CONFIG", "ExportRefused", "TOKEN_MAP", "detect", "load_eagle_draft", "load_medusa_heads", "read_config",
           "read_weights", "weight_shapes", "write_config", "write_weights"]
