"""Export draftkit drafters to the folders the serving engines load (vLLM, SGLang, speculators, the original
Medusa repository); the layouts are documented in drafters/formats.py, which reads them back."""
from __future__ import annotations

import os
import shutil

import torch

from draftkit.drafters.eagle import _target_name
from draftkit.drafters.reference_config import LAYOUT
from draftkit.drafters.formats import (TOKEN_MAP, ExportRefused, decoding_settings, detect, engine_layer_name,
                                      write_config, write_weights)

EAGLE_FORMATS = ("vllm", "sglang", "speculators")
FORMATS = ("vllm", "sglang", "speculators", "medusa-original")


def _llama_export_fields(draft, dtype: torch.dtype) -> dict:
    lc = draft.layer_config
    rope = dict(lc.rope_parameters or {})
    theta = float(rope.pop("rope_theta", 10000.0))
    scaling = None if rope.get("rope_type", "default") == "default" else rope
    return {
        "model_type": "llama", "hidden_size": lc.hidden_size, "intermediate_size": lc.intermediate_size,
        "num_hidden_layers": lc.num_hidden_layers, "num_attention_heads": lc.num_attention_heads,
        "num_key_value_heads": lc.num_key_value_heads, "head_dim": lc.head_dim, "hidden_act": lc.hidden_act,
        "rms_norm_eps": lc.rms_norm_eps, "rope_theta": theta, "rope_scaling": scaling,
        "max_position_embeddings": lc.max_position_embeddings, "vocab_size": draft.config.vocab_size,
        "tie_word_embeddings": False, "attention_bias": bool(lc.attention_bias), "mlp_bias": bool(lc.mlp_bias),
        "initializer_range": lc.initializer_range, "torch_dtype": str(dtype).replace("torch.", ""),
    }


def _draftkit_meta(draft, fmt: str) -> dict:
    c = draft.config
    return {"format": fmt, "target_name": c.target_name, "num_target_layers": c.num_target_layers,
            "feature_layers": list(c.feature_layers), **decoding_settings(c)}


def export_eagle(draft, fmt: str, out: str, dtype: torch.dtype = torch.float16, target_name: str = "",
                 speculative_tokens: int = 3, target_architectures: list[str] | None = None) -> str:
    """Write `draft` (reference layout) as `fmt`; returns a one-line description of what was written."""
    c = draft.config
    if getattr(c, "layout", "draftkit") != LAYOUT:
        raise ExportRefused("this EAGLE draft uses draftkit's own layout (fc with bias -> a full decoder layer with "
                            "its input norm -> a final norm), which no engine computes; retrain it with "
                            "`--layout reference` (train/eagle.py) to export it")
    if fmt not in EAGLE_FORMATS:
        raise ExportRefused(f"format {fmt!r} cannot hold an EAGLE draft; choose one of {', '.join(EAGLE_FORMATS)}")
    state = dict(draft.state_dict())
    llama = _llama_export_fields(draft, dtype)
    meta = _draftkit_meta(draft, fmt)
    name = target_name or c.target_name
    parallel = c.mask_token_id is not None  # P-EAGLE: EAGLE-3 + mask_hidden + the placeholder token
    if parallel and fmt == "sglang":
        raise ExportRefused("SGLang has no parallel drafting for EAGLE-3 drafts; export P-EAGLE with --format vllm "
                            "(vLLM eagle3 with parallel_drafting) or speculators")
    if fmt == "sglang" and draft.layer_config.num_hidden_layers > 1:
        raise ExportRefused(f"SGLang's EAGLE-3 runs one draft layer, this draft has "
                            f"{draft.layer_config.num_hidden_layers}; export it with --format vllm or speculators")
    # layers after the first: draftkit's later_layers.i are the engines' layers.(i + 1)
    state = {engine_layer_name(k): v for k, v in state.items()}
    if len(c.feature_layers) == 3:  # EAGLE-3
        ids = [int(k) for k in c.feature_layers]  # hidden_states[k] = the residual stream entering layer k
        if fmt == "sglang" and c.norm_before_residual:
            raise ExportRefused("this EAGLE-3 draft has norm_before_residual, which SGLang does not compute; "
                                "export it with --format vllm or speculators")
        vocab_fields = {"vocab_size": c.vocab_size, "draft_vocab_size": draft.draft_vocab}
        if fmt == "speculators":
            layer = {**llama}
            layer.pop("torch_dtype")
            algorithm = "peagle" if parallel else "eagle3"
            cfg = {
                "speculators_model_type": algorithm,
                "architectures": ["PEagleSpeculator" if parallel else "Eagle3Speculator"],
                "speculators_config": {
                    "algorithm": algorithm,
                    "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                          "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                    "default_proposal_method": "greedy",
                    "verifier": {"name_or_path": name,
                                 "architectures": list(target_architectures or ["LlamaForCausalLM"])},
                },
                "transformer_layer_config": layer, "draft_vocab_size": draft.draft_vocab,
                "norm_before_residual": bool(c.norm_before_residual), "eagle_aux_hidden_state_layer_ids": ids,
                "torch_dtype": llama["torch_dtype"], "draftkit": meta,
            }
            if parallel:  # speculators' peagle config; vLLM maps it to pard_token
                cfg["mask_token_id"] = int(c.mask_token_id)
            state = {("layers.0." + k[len("midlayer."):]) if k.startswith("midlayer.") else k: v
                     for k, v in state.items()}
        else:
            cfg = {"architectures": ["LlamaForCausalLMEagle3"], **llama, **vocab_fields,
                   # vLLM reads the top-level ids (id k = the residual stream entering layer k); SGLang reads
                   # eagle_config's and captures the output of layer id, hence k - 1 there: the same states
                   "eagle_aux_hidden_state_layer_ids": ids,
                   "eagle_config": {"eagle_aux_hidden_state_layer_ids": [k - 1 for k in ids],
                                    "use_aux_hidden_state": True},
                   "draftkit": meta}
            if c.norm_before_residual:
                cfg["norm_before_residual"] = True
            if parallel:  # vLLM's parallel drafting reads pard_token, else ptd_token_id (the same id here)
                cfg["pard_token"] = cfg["ptd_token_id"] = int(c.mask_token_id)
        write_weights(state, out, dtype)
        write_config(cfg, out)
        if parallel:
            return (f"P-EAGLE draft ({draft.draft_vocab} of {c.vocab_size} tokens, fused layers {ids}, mask token "
                    f"{c.mask_token_id}) as {fmt}")
        return f"EAGLE-3 draft ({draft.draft_vocab} of {c.vocab_size} tokens, fused layers {ids}) as {fmt}"
    # EAGLE-1/2
    if fmt == "speculators":
        raise ExportRefused("vLLM reads only EAGLE-3 drafts in the speculators format; use --format vllm for EAGLE-1/2")
    state.pop("d2t", None)
    state.pop("t2d", None)
    note = ""
    if draft.reduced and fmt == "sglang":  # SGLang's FR-Spec token map: the LM head restricted to these ids
        os.makedirs(out, exist_ok=True)
        torch.save(draft.vocab_ids().cpu(), os.path.join(out, TOKEN_MAP))
        note = f"; its draft vocabulary ({draft.draft_vocab} ids) is {TOKEN_MAP}: pass --speculative-token-map"
    elif draft.reduced:
        note = f"; its reduced draft vocabulary ({draft.draft_vocab}) does not travel: vLLM uses the full LM head"
    if fmt == "vllm":
        if "fc.bias" in state:
            raise ExportRefused("this EAGLE-1 draft's fc has a bias, which vLLM's EAGLE-1 does not compute; "
                                "export it with --format sglang")
        cfg = {"architectures": ["LlamaForCausalLM"], **llama, "draftkit": meta}
    else:
        state.setdefault("fc.bias", torch.zeros(c.hidden_size))  # SGLang builds fc with a bias
        cfg = {"architectures": ["LlamaForCausalLMEagle"], **llama, "draftkit": meta}
    write_weights(state, out, dtype)
    write_config(cfg, out)
    return f"EAGLE-1/2 draft as {fmt}{note}"


def export_medusa(path: str, fmt: str, out: str, target, dtype: torch.dtype = torch.float16) -> str:
    """A draftkit (or imported) Medusa folder as vLLM's layout or FasterDecoding's original one."""
    from draftkit.drafters.medusa import MedusaDrafter, has_adapter

    if fmt == "sglang":
        raise ExportRefused("SGLang has no Medusa algorithm; export Medusa with --format vllm or medusa-original")
    if fmt not in ("vllm", "medusa-original"):
        raise ExportRefused(f"format {fmt!r} cannot hold Medusa heads; choose vllm or medusa-original")
    drafter = MedusaDrafter.from_pretrained(path, target, check_adapter=False, dtype=torch.float32)
    heads = drafter.heads
    n, L = heads.num_heads, heads.num_layers
    state = heads.state_dict()
    target_head = target.get_output_embeddings().weight.detach()
    name = _target_name(target) or str(getattr(target, "name_or_path", ""))
    meta = {"format": fmt, "target_name": name}
    if fmt == "vllm":
        w = {}
        for k in range(n):
            for l in range(L):
                w[f"blocks.{k}.layers.{l}.weight"] = state[f"blocks.{k}.{l}.linear.weight"]
                w[f"blocks.{k}.layers.{l}.bias"] = state[f"blocks.{k}.{l}.linear.bias"]
            if not heads.share_lm_head:
                w[f"lm_heads.{k}.weight"] = state[f"proj.{k}.weight"]
        if heads.share_lm_head:
            w["lm_heads.0.weight"] = target_head
        # no key may contain both "num" and "heads" (or "layers") but the two vLLM reads
        cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": heads.hidden_size,
               "vocab_size": heads.vocab_size, "num_heads": n, "num_hidden_layers": L, "medusa_fc_bias": True,
               "original_lm_head": bool(heads.share_lm_head), "torch_dtype": str(dtype).replace("torch.", ""),
               "draftkit": meta}
        write_weights(w, out, dtype)
    else:
        w = {}
        for k in range(n):
            if L > 1 and any(not torch.equal(state[f"blocks.{k}.0.linear.{p}"], state[f"blocks.{k}.{l}.linear.{p}"])
                             for l in range(1, L) for p in ("weight", "bias")):
                raise ExportRefused(f"head {k} has {L} different residual blocks; FasterDecoding's Medusa repeats one "
                                    "block per head ([ResBlock] * layers), so it cannot hold them")
            for l in range(L):
                w[f"{k}.{l}.linear.weight"] = state[f"blocks.{k}.{l}.linear.weight"]
                w[f"{k}.{l}.linear.bias"] = state[f"blocks.{k}.{l}.linear.bias"]
            if not heads.share_lm_head:  # absent: the original code keeps its copy of the base LM head
                w[f"{k}.{L}.weight"] = state[f"proj.{k}.weight"]
        cfg = {"medusa_num_heads": n, "medusa_num_layers": L, "base_model_name_or_path": name,
               "hidden_size": heads.hidden_size, "vocab_size": heads.vocab_size, "draftkit": meta}
        write_weights(w, out, dtype, "medusa_lm_head.safetensors")
        torch.save({k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in w.items()},
                   os.path.join(out, "medusa_lm_head.pt"))
    write_config(cfg, out)
    tree = os.path.join(path, "tree.json")
    if os.path.exists(tree):
        shutil.copy(tree, os.path.join(out, "tree.json"))
    note = "; it holds a Medusa-2 LoRA adapter: serve it with the LoRA-merged target" if has_adapter(path) else ""
    head = "shared" if heads.share_lm_head else "own"
    return f"Medusa heads ({n} heads, {L} layer(s), {head} LM head) as {fmt}{note}"


def export_standalone(path: str, fmt: str, out: str, target_path: str, dtype: torch.dtype = torch.float16) -> str:
    """A plain Hugging Face causal LM folder, after checking it shares the target's vocabulary."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if fmt not in ("vllm", "sglang"):
        raise ExportRefused(f"format {fmt!r} cannot hold a standalone draft model; choose vllm or sglang")

    def vocab_of(p):
        c = AutoConfig.from_pretrained(p)
        c = c.get_text_config() if hasattr(c, "get_text_config") else c
        return int(c.vocab_size)

    def tokenizer_of(p):
        try:
            return AutoTokenizer.from_pretrained(p)
        except Exception:  # noqa: BLE001 - a folder without a tokenizer
            return None

    dv, tv = vocab_of(path), vocab_of(target_path)
    if dv != tv:
        raise ExportRefused(f"vocabulary mismatch: the draft {path} has {dv} tokens, the target {target_path} {tv}; "
                            "a standalone draft must use the target's tokenizer")
    dtok, ttok = tokenizer_of(path), tokenizer_of(target_path)
    if dtok is not None and ttok is not None and dtok.get_vocab() != ttok.get_vocab():
        raise ExportRefused(f"tokenizer mismatch: {path} and {target_path} map tokens to different ids")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    model.save_pretrained(out)
    tokenizer = dtok if dtok is not None else ttok
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return f"standalone draft ({type(model).__name__}, vocabulary {dv}) as a plain Hugging Face folder for {fmt}"


def kind_of(path: str) -> str:
    """eagle, medusa, dflash or standalone."""
    fmt = detect(path)
    if "dflash" in fmt:
        return "dflash"
    if "eagle" in fmt or fmt == "speculators":
        return "eagle"
    if "medusa" in fmt:
        return "medusa"
    return "standalone"


__all__ = ["EAGLE_FORMATS", "FORMATS", "export_eagle", "export_medusa", "export_standalone", "kind_of"]
