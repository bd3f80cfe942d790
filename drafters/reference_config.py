"""The reference EAGLE drafts' configuration (drafters/eagle_reference.py builds the drafts): the Llama layer
config taken from a target, the EagleConfig of a reference draft and its checks, and the reduced draft vocabulary
(d2t / t2d offsets, the most frequent training tokens)."""
from __future__ import annotations

from typing import Sequence

import torch
from transformers import LlamaConfig

from draftkit.drafters.eagle import EagleConfig, _target_name, _text_config, normalize_layers, target_shape

LAYOUT = "reference"



def _rope_parameters(cfg) -> dict:
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_theta") is not None:
        return dict(rope)
    theta = getattr(cfg, "rope_theta", None) or 10000.0
    scaling = getattr(cfg, "rope_scaling", None)
    return {**(dict(scaling) if isinstance(scaling, dict) else {"rope_type": "default"}), "rope_theta": float(theta)}


class _Fields:
    """A config's fields by attribute, with a per-layer field (Gemma 4's head_dim, which the config refuses to
    read globally) read as its default, the value every layer without an override has."""

    def __init__(self, cfg):
        self.cfg, self.defaults = cfg, None

    def __getattr__(self, name):
        try:
            return getattr(self.cfg, name)
        except RuntimeError:  # transformers' AmbiguousGlobalPerLayerAttributeError
            self.defaults = self.defaults or self.cfg.to_dict()
            return self.defaults.get(name)


def llama_layer_config(target_or_config) -> dict:
    """A one-layer Llama config dict with the target's sizes, rotary settings and max positions."""
    cfg = _Fields(_text_config(target_or_config) if hasattr(target_or_config, "config") else target_or_config)
    hidden = int(cfg.hidden_size)
    heads = int(cfg.num_attention_heads)
    vocab = (target_or_config.get_output_embeddings().weight.shape[0] if hasattr(target_or_config, "config")
             else int(cfg.vocab_size))
    return {
        "model_type": "llama", "vocab_size": int(vocab), "hidden_size": hidden,
        "intermediate_size": int(getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None)
                                 or 4 * hidden),
        "num_hidden_layers": 1, "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(cfg, "head_dim", None) or hidden // heads),
        "hidden_act": str(getattr(cfg, "hidden_act", "silu") if getattr(cfg, "hidden_act", None) in
                          ("silu", "gelu", "relu", "gelu_new", "gelu_pytorch_tanh") else "silu"),
        "max_position_embeddings": int(getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions")),
        "rms_norm_eps": float(getattr(cfg, "rms_norm_eps", None) or getattr(cfg, "layer_norm_epsilon", None) or 1e-6),
        "rope_parameters": _rope_parameters(cfg), "attention_bias": False, "mlp_bias": False,
        "tie_word_embeddings": False, "initializer_range": float(getattr(cfg, "initializer_range", 0.02) or 0.02),
    }


def llama_config(layer_config: dict) -> LlamaConfig:
    """The draft's LlamaConfig: its layer sizes; num_hidden_layers is its decoder layers (the cache's layers)."""
    conf = {k: v for k, v in layer_config.items() if k != "model_type"}
    conf.update(num_hidden_layers=int(layer_config.get("num_hidden_layers", 1)), use_cache=True)
    cfg = LlamaConfig(**conf)
    cfg._attn_implementation = "sdpa"  # what AutoModel picks on this machine, as for draftkit's layout
    return cfg


def vocab_mapping(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) for draft ids given as target ids: d2t int64 OFFSETS (target id = i + d2t[i]) over
    the ids sorted ascending, t2d bool [vocab_size] (True for target ids in the draft vocabulary)."""
    ids = torch.as_tensor(draft_ids, dtype=torch.long).flatten().unique()  # sorted, no repeats
    if ids.numel() < 1 or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size}) and be non-empty")
    d2t = ids - torch.arange(ids.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[ids] = True
    return d2t, t2d


def frequent_tokens(token_stream: torch.Tensor, vocab_size: int, n: int) -> torch.Tensor:
    """The n most frequent target ids of the training tokens (ties: lower id), sorted ascending."""
    counts = torch.bincount(token_stream.flatten().long(), minlength=vocab_size)[:vocab_size].double()
    counts -= torch.arange(vocab_size, dtype=torch.double) * 1e-9  # deterministic tie break
    return counts.topk(min(n, vocab_size)).indices.sort().values


def reference_config(target, feature_layers: Sequence[int] | None = None, draft_vocab_size: int = 0,
                     draft_layers: int = 1) -> EagleConfig:
    hidden, vocab, layers = target_shape(target)
    feats = normalize_layers(feature_layers, layers)
    check_feature_layers(feats, layers)
    check_draft_layers(draft_layers, feats)
    layer_config = {**llama_layer_config(target), "num_hidden_layers": int(draft_layers)}
    return EagleConfig(hidden, vocab, layers, feats, _target_name(target), layer_config,
                       layout=LAYOUT, draft_vocab_size=int(draft_vocab_size if 0 < draft_vocab_size < vocab else 0))


def engine_layers(num_layers: int) -> list[int]:
    """The three layers vLLM and SGLang fuse when a draft's config names none: (2, L//2, L-3), repeats and all."""
    n = int(num_layers)
    return [2, n // 2, n - 3]


def three_layers(num_layers: int) -> list[int]:
    """The three hidden states an EAGLE-3 (or DFlash) draft fuses when a recipe says `auto`: the engines' default;
    under 7 layers, where its layers collide, spread over 1..L-1 (exports name their layers, so engines agree)."""
    n = int(num_layers)
    if n < 4:
        raise ValueError(f"three fused layers need a target of 4 or more layers (1..L-1 distinct), this one has {n}")
    low, mid, high = engine_layers(n)
    return [low, mid, high] if low < mid < high else [1, n // 2, n - 1]


def check_draft_layers(draft_layers: int, feats: list[int]) -> None:
    """EAGLE-1/2 drafts have one decoder layer (what every engine computes); EAGLE-3 / P-EAGLE any number >= 1."""
    if draft_layers < 1 or (len(feats) == 1 and draft_layers != 1):
        raise ValueError(f"a reference {'EAGLE-1/2' if len(feats) == 1 else 'EAGLE-3'} draft has "
                         f"{'exactly one' if len(feats) == 1 else '1 or more'} decoder layers, got {draft_layers}")


def check_feature_layers(feats: list[int], num_layers: int) -> None:
    """EAGLE-1/2: the final-norm output (index num_layers). EAGLE-3: three residual streams entering
    layers 1 .. L-1 (what vLLM captures as layer id k; SGLang calls it k - 1)."""
    if len(feats) == 1:
        if feats != [num_layers]:
            raise ValueError(f"a reference EAGLE-1/2 draft reads the target's last hidden state (feature_layers "
                             f"[] or [-1]), got {feats}")
    elif len(feats) != 3 or not all(1 <= k <= num_layers - 1 for k in feats) or feats != sorted(feats):
        raise ValueError(f"a reference EAGLE-3 draft fuses exactly three ascending target layers in "
                         f"1..{num_layers - 1} (the residual stream entering layer k, as vLLM captures it), "
                         f"got {feats}")


__all__ = ["LAYOUT", "check_draft_layers", "check_feature_layers", "frequent_tokens", "llama_config",
           "llama_layer_config", "reference_config", "vocab_mapping"]
