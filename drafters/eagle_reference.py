"""Reference-exact EAGLE drafts: what vLLM, SGLang and SafeAILab/EAGLE compute, layer for layer.

Selected by EagleConfig.layout == "reference" (draftkit's own layout, drafters.eagle.EagleDraftModel,
stays the default for existing folders). The draft layer is Llama-style whatever the target family.

EAGLE-1/2 (SafeAILab cnets1.py, vLLM llama_eagle.py, SGLang llama_eagle.py), feature f_t = the
target's last hidden state after its final norm:
    x   = fc([emb(x_{t+1}); f_t])                  Linear(2H -> H), no bias (SafeAILab's may have one)
    h   = x + attn(x)                              layer 0 has NO input_layernorm
    out = h + mlp(post_attention_layernorm(h))     no final norm
    logits = the target's LM head(out); out is the next step's feature.

EAGLE-3 (SafeAILab cnets.py, vLLM llama_eagle3.py, SGLang llama_eagle3.py, SpecForge):
    g   = fc([h_a; h_b; h_c])                      Linear(3H -> H), no bias: three target layers, first step only
    a   = attn([input_layernorm(emb); hidden_norm(g)])   q/k/v take 2H inputs
    h   = g + a                                    (norm_before_residual: hidden_norm(g) + a)
    out = h + mlp(post_attention_layernorm(h))     the PRE-norm output: fed back as g on later steps
    out = later_layers[i](out)                     num_hidden_layers > 1 only: plain pre-norm Llama layers, as
                                                   vLLM's llama_eagle3 runs layers 1.. (4-layer P-EAGLE drafts)
    logits = lm_head(norm(out)) over the draft vocabulary; draft id i is target id i + d2t[i].

forward() returns `out` (what is fed back); logits(out, head) gives target-vocabulary logits, -inf
outside the draft vocabulary (so a sampled q is zero there: acceptance stays lossless). The
attention is transformers' LlamaAttention, so it writes into any transformers Cache (KVBuffer,
DynamicCache) and accepts 4D additive masks and explicit position ids like the target does.
A reduced vocabulary for EAGLE-1/2 restricts the target's LM head to the draft ids (no new weights;
the engines, which do not support it for EAGLE-1, simply use the full head).
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Sequence

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import (LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaRMSNorm,
                                                      LlamaRotaryEmbedding)

from draftkit.drafters.attention_window import windowed
from draftkit.drafters.eagle import CONFIG_NAME, WEIGHTS_NAME, EagleConfig, EagleDraftModel
from draftkit.drafters.reference_config import (LAYOUT, check_draft_layers, llama_config, reference_config,
                                                vocab_mapping)


class _ReferenceDraft(nn.Module):
    """What both reference drafts share: rotary positions, the causal mask, the vocabulary mapping, files."""

    # the feature selection and target checks are draftkit's, unchanged
    select = EagleDraftModel.select
    join = EagleDraftModel.join
    check_target = EagleDraftModel.check_target

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config.check()
        self.layer_config = llama_config(config.layer_config)
        check_draft_layers(self.layer_config.num_hidden_layers, config.feature_layers)
        self.rotary_emb = LlamaRotaryEmbedding(self.layer_config)
        self._rows = None  # EAGLE-1/2 with a reduced vocabulary: cached rows of the target's LM head

    @property
    def cache_config(self) -> LlamaConfig:
        return self.layer_config

    @property
    def draft_vocab(self) -> int:
        return self.config.draft_vocab_size or self.config.vocab_size

    @property
    def reduced(self) -> bool:
        return self.draft_vocab < self.config.vocab_size

    def _register_vocab(self, always: bool) -> None:
        if self.reduced or always:
            self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))
            self.register_buffer("t2d", torch.ones(self.config.vocab_size, dtype=torch.bool))

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """Use the draft vocabulary `draft_ids` (target ids): sets d2t / t2d."""
        d2t, t2d = vocab_mapping(draft_ids, self.config.vocab_size)
        if d2t.numel() != self.draft_vocab:
            raise ValueError(f"{d2t.numel()} draft ids for a draft vocabulary of {self.draft_vocab}")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def vocab_ids(self) -> torch.Tensor | None:
        """Target id of each draft id, or None for the full vocabulary."""
        if not self.reduced:
            return None
        return torch.arange(self.draft_vocab, device=self.d2t.device) + self.d2t

    def _init_weights(self) -> None:
        std = self.layer_config.initializer_range
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def _positions(self, x, cache, attention_mask, position_ids):
        """(mask, rotary embeddings) exactly as transformers' LlamaModel builds them."""
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(x.shape[1], device=x.device) + past)[None]
        mask = create_causal_mask(config=self.layer_config, inputs_embeds=x, attention_mask=attention_mask,
                                  cache=cache, position_ids=position_ids)
        if cache is not None and self.config.attention_window:  # decoding: cache column c holds position c
            # the keys' count from the mask when there is one: the cache's Python ints would make a compiled
            # forward guard on them (a graph per length)
            keys = mask.shape[-1] if mask is not None else cache.get_seq_length() + x.shape[1]
            mask = windowed(mask, position_ids, keys, self.config.attention_window)
        return mask, self.rotary_emb(x, position_ids=position_ids), position_ids

    def logits(self, features: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """Target-vocabulary logits of the draft's outputs: -inf outside the draft vocabulary."""
        small = self.draft_logits(features, head)
        if not self.reduced:
            return small
        out = small.new_full((*small.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., self.vocab_ids()] = small
        return out

    # --- files: draftkit's own folder (config.json with kind/layout + model.safetensors) ---------
    def save_pretrained(self, path: str, dtype: torch.dtype = torch.float16) -> None:
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        state = {k: (v.to(dtype) if v.is_floating_point() else v).detach().cpu().contiguous()
                 for k, v in self.state_dict().items()}
        save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt", "kind": "eagle",
                                                                       "layout": LAYOUT})
        with open(os.path.join(path, CONFIG_NAME), "w") as fh:
            json.dump(asdict(self.config), fh, indent=2)

    def load_weights(self, state: dict, source: str) -> "_ReferenceDraft":
        """Load a state dict in this draft's own key names (floats cast to fp32); a clear error if it does not fit."""
        own = self.state_dict()
        state = {k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        shapes = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in own.items()
                  if k in state and tuple(state[k].shape) != tuple(v.shape)]
        if missing or unexpected or shapes:
            raise ValueError(f"{source}: weights do not match the EAGLE draft config (missing {missing}, "
                             f"unexpected {unexpected}, shapes {shapes})")
        self.load_state_dict(state, strict=True)
        if self.reduced:
            ids = torch.arange(self.d2t.numel()) + self.d2t.cpu()
            if ids.min() < 0 or ids.max() >= self.config.vocab_size or ids.unique().numel() != ids.numel():
                raise ValueError(f"{source}: d2t maps draft ids outside the target vocabulary or twice")
        return self.float()


# ----------------------------------------------------------------------------- EAGLE-1/2


class Eagle1Draft(_ReferenceDraft):
    """fc([emb; f]) -> one Llama decoder layer without input_layernorm; no final norm; the target's head."""

    def __init__(self, config: EagleConfig):
        super().__init__(config)
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=config.fc_bias)
        layer = LlamaDecoderLayer(self.layer_config, layer_idx=0)
        layer.input_layernorm = nn.Identity()  # SafeAILab cnets1.py: layer 0 has no input norm
        self.layers = nn.ModuleList([layer])
        self._register_vocab(always=False)
        self._init_weights()

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, cache=None, attention_mask=None,
                position_ids=None, use_cache: bool = True) -> torch.Tensor:
        x = self.fc(torch.cat([embeds.to(self.fc.weight.dtype), features.to(self.fc.weight.dtype)], -1))
        mask, rope, position_ids = self._positions(x, cache, attention_mask, position_ids)
        return self.layers[0](x, attention_mask=mask, position_ids=position_ids, cache=cache,
                              use_cache=cache is not None, position_embeddings=rope)

    def draft_logits(self, features: torch.Tensor, head: nn.Module) -> torch.Tensor:
        """Logits over the draft vocabulary: the target's LM head (its draft-vocabulary rows if reduced)."""
        features = features.to(head.weight.dtype)
        if not self.reduced:
            return head(features)
        w = head.weight
        key = (id(w), w._version, w.device, w.dtype, self.d2t.data_ptr())
        if self._rows is None or self._rows[0] != key:
            ids = self.vocab_ids()
            bias = getattr(head, "bias", None)
            self._rows = (key, w.detach()[ids], None if bias is None else bias.detach()[ids])
        return nn.functional.linear(features, self._rows[1], self._rows[2])


# ----------------------------------------------------------------------------- EAGLE-3


class Eagle3Midlayer(nn.Module):
    """The EAGLE-3 decoder layer: attention over [input_layernorm(emb); hidden_norm(g)] (2H inputs)."""

    def __init__(self, cfg: LlamaConfig, norm_before_residual: bool = False):
        super().__init__()
        h = cfg.hidden_size
        self.norm_before_residual = norm_before_residual
        self.self_attn = LlamaAttention(cfg, layer_idx=0)
        a = self.self_attn
        a.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * a.head_dim, bias=cfg.attention_bias)
        a.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * a.head_dim, bias=cfg.attention_bias)
        a.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * a.head_dim, bias=cfg.attention_bias)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=cfg.rms_norm_eps)

    def forward(self, embeds, hidden, attention_mask, position_embeddings, cache=None, **kwargs):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], -1)
        attn, _ = self.self_attn(x, position_embeddings=position_embeddings, attention_mask=attention_mask,
                                 cache=cache, **kwargs)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(_ReferenceDraft):
    """fc(3 target layers) -> midlayer -> later_layers -> (fed back pre-norm) ; norm -> lm_head over the draft
    vocabulary. later_layers (num_hidden_layers - 1 plain Llama layers, cache layers 1..) export as layers.1.."""

    def __init__(self, config: EagleConfig):
        super().__init__(config)
        h = config.hidden_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.midlayer = Eagle3Midlayer(self.layer_config, config.norm_before_residual)
        self.later_layers = nn.ModuleList([LlamaDecoderLayer(self.layer_config, layer_idx=i)
                                           for i in range(1, self.layer_config.num_hidden_layers)])
        self.norm = LlamaRMSNorm(h, eps=self.layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(h, self.draft_vocab, bias=False)
        self._register_vocab(always=True)
        self._init_weights()

    def forward(self, features: torch.Tensor, embeds: torch.Tensor, cache=None, attention_mask=None,
                position_ids=None, use_cache: bool = True) -> torch.Tensor:
        """features (B, T, 3H) raw target layers (fused by fc) or (B, T, H) the draft's own pre-norm outputs."""
        features = features.to(self.fc.weight.dtype)
        if features.shape[-1] != self.config.hidden_size:
            features = self.fc(features)
        embeds = embeds.to(features.dtype)
        mask, rope, position_ids = self._positions(embeds, cache, attention_mask, position_ids)
        out = self.midlayer(embeds, features, mask, rope, cache=cache, position_ids=position_ids,
                            use_cache=cache is not None)
        for layer in self.later_layers:
            out = layer(out, attention_mask=mask, position_ids=position_ids, cache=cache,
                        use_cache=cache is not None, position_embeddings=rope)
        return out

    def draft_logits(self, features: torch.Tensor, head: nn.Module | None = None) -> torch.Tensor:
        return self.lm_head(self.norm(features.to(self.lm_head.weight.dtype)))


# ----------------------------------------------------------------------------- construction


def draft_class(config: EagleConfig):
    if config.mask_token_id is not None:
        from draftkit.drafters.peagle import PEagleDraft

        return PEagleDraft
    return Eagle3Draft if len(config.feature_layers) > 1 else Eagle1Draft


def build_draft(config: EagleConfig) -> nn.Module:
    """An (uninitialised-by-target) draft of config's layout."""
    if config.layout == "draftkit":
        return EagleDraftModel(config)
    if config.layout != LAYOUT:
        raise ValueError(f"unknown EAGLE draft layout {config.layout!r}; choose draftkit or {LAYOUT}")
    return draft_class(config)(config)


@torch.no_grad()
def make_draft(target, feature_layers: Sequence[int] | None = None, layout: str = "draftkit",
               draft_ids: torch.Tensor | None = None, init_from_target: bool = False,
               draft_layers: int = 1) -> nn.Module:
    """A fresh draft for `target`. layout "draftkit": EagleDraftModel (draft_ids must be None);
    "reference": EAGLE-1/2 (one feature layer) or EAGLE-3 (three; `draft_layers` decoder layers), with a
    reduced draft vocabulary when draft_ids (target ids) is given. EAGLE-3's lm_head starts as the target's
    rows, its final norm as the target's; init_from_target also copies what fits of the target's last layer."""
    if layout == "draftkit":
        if draft_ids is not None or draft_layers != 1:
            raise ValueError("a reduced draft vocabulary or more than one draft layer needs layout: reference")
        return EagleDraftModel.from_target(target, feature_layers, init_from_target)
    n = 0 if draft_ids is None else int(torch.as_tensor(draft_ids).unique().numel())
    config = reference_config(target, feature_layers, n, draft_layers)
    draft = build_draft(config)
    if draft.reduced:
        draft.set_vocab(draft_ids)
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    last = base.layers[-1] if hasattr(base, "layers") else None
    if isinstance(draft, Eagle3Draft):
        head = target.get_output_embeddings().weight
        ids = draft.vocab_ids()
        draft.lm_head.weight.copy_(head if ids is None else head[ids.to(head.device)])
        norm = getattr(base, "norm", None)
        weight = getattr(norm, "weight", None)
        if weight is not None and weight.shape == draft.norm.weight.shape:
            draft.norm.weight.copy_(norm.weight)
        if init_from_target and last is not None:
            for layer in [draft.midlayer, *draft.later_layers]:
                own = layer.state_dict()
                fits = {k: v for k, v in last.state_dict().items() if k in own and own[k].shape == v.shape}
                layer.load_state_dict(fits, strict=False)
    elif init_from_target and last is not None:
        own = draft.layers[0].state_dict()
        fits = {k: v for k, v in last.state_dict().items() if k in own and own[k].shape == v.shape}
        draft.layers[0].load_state_dict(fits, strict=False)
    return draft.float()


@torch.no_grad()
def deepen(draft: Eagle3Draft, draft_layers: int) -> Eagle3Draft:
    """A copy of an EAGLE-3 / P-EAGLE draft with `draft_layers` decoder layers that computes what it computes:
    the added layers' residual branches start at zero (o_proj and down_proj zero), so training starts from the
    trained draft's outputs and grows the deeper layers from there."""
    have = draft.layer_config.num_hidden_layers
    if draft_layers < have:
        raise ValueError(f"the draft has {have} decoder layers; it cannot be cut to {draft_layers}")
    if draft_layers == have:
        return draft
    config = EagleConfig(**{**asdict(draft.config), "layer_config": {**draft.config.layer_config,
                                                                     "num_hidden_layers": int(draft_layers)}})
    deeper = build_draft(config)
    state = deeper.state_dict()
    state.update(draft.state_dict())
    deeper.load_state_dict(state)
    for layer in deeper.later_layers[have - 1:]:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    return deeper.float()


__all__ = ["Eagle1Draft", "Eagle3Draft", "Eagle3Midlayer", "build_draft", "deepen", "draft_class", "make_draft"]
