"""Which keys each layer of a model may attend to, so that a hand-built mask hides what the model's own would.

transformers builds one mask per layer type from a 2D mask (`full_attention`, `sliding_attention` with a window
w: a query at position p sees keys at positions > p - w, `chunked_attention` with chunk c: keys in p's chunk
of c positions), but returns a 4D mask it is given as-is, for every layer. A tree mask handed to a model whose
layers slide would let those layers see keys older than their window: the output drifts from plain decoding
once the context passes the window. So the verifier (and a draft model's own forward) derives, from its full
tree mask and the positions of the queries and keys, one mask per layer type, and hands the model either that
one mask (every layer of one type: Mistral, Qwen2 with every layer sliding) or a {layer type: mask} mapping
(mixed layers: Gemma 2/3, Qwen2 with `max_window_layers`, gpt-oss, Llama 4, Cohere2).

Positions, not columns: in the packed layout a lane's entries interleave with other lanes', so the verifier
keeps each committed entry's position (verify/forward.py) and the rule is written on positions throughout.

Models this cannot serve exactly are refused in one line that names the feature (`AttentionLayout.of` raises
UnsupportedAttention when a forward needs a hand-built mask; plain decoding runs on the model's own mask):
ALiBi position biases (computed by the model from a 2D mask it never gets), FlashAttention kernels (a causal flag
and padding, no mask) and flex attention (load the model with sdpa) and mixed layer types in a model whose forward takes one mask for
all layers. Models that keep state outside a key/value cache (Mamba, linear
attention, short convolutions: Jamba, Falcon-H1, Qwen3-Next, LFM2, MiniMax; RWKV) are refused before any forward,
plain decoding too (`check_kv_only`): a rejected draft would leave that state advanced, and the cache draftkit
rolls back holds keys and values only.
"""
from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass

import torch

FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


class UnsupportedAttention(ValueError):
    """A model whose attention a hand-built mask cannot reproduce exactly."""


def text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _module_source(model) -> str:
    """The source of the module that defines the model's class ('' when not readable)."""
    try:
        return inspect.getsource(sys.modules[type(model).__module__])
    except (OSError, TypeError, KeyError):
        return ""


def _layer_types(cfg, source: str) -> list[str]:
    """Each layer's attention type: `layer_types` when the config has it; else every layer sliding when the
    config sets a window AND the model's code builds a sliding mask from it (Mistral, Mixtral, Phi-3,
    Starcoder2: a `sliding_window` field some other families carry unused must not narrow anything)."""
    types = getattr(cfg, "layer_types", None)
    layers = getattr(cfg, "num_hidden_layers", None) or 1
    if types:
        return list(types)
    window = getattr(cfg, "sliding_window", None)
    if window and getattr(cfg, "use_sliding_window", True) and "create_sliding_window_causal_mask" in source:
        return [SLIDING] * layers
    return [FULL] * layers


# transformers' layer types whose cache holds recurrent or convolution state (cache_utils' linear-attention layers)
RECURRENT = ("conv", "linear_attention", "hybrid", "hybrid_sliding", "mamba", "mamba2", "recurrent")


def config_problem(config, name: str | None = None) -> str | None:
    """Why draftkit cannot decode a model of this config (read before any weights: a tool's early check), or None."""
    cfg = text_config(config)
    name = name or (getattr(config, "architectures", None) or [getattr(cfg, "model_type", "the model")])[0]
    kinds = sorted({k for k in getattr(cfg, "layer_types", None) or () if k in RECURRENT})
    if kinds:
        return (f"{name} keeps recurrent state in its {', '.join(kinds)} layers, which a rejected draft would leave "
                "advanced; draftkit rolls back key/value caches only")
    if _alibi(cfg):
        return f"{name} adds ALiBi position biases, which it computes from a 2D mask that a tree forward never gives it"
    return None


def check_kv_only(model) -> None:
    """Raise UnsupportedAttention (one line) for a model whose state is not all keys and values (module docstring)."""
    cfg = text_config(model.config)
    kinds = sorted({k for k in getattr(cfg, "layer_types", None) or () if k in RECURRENT})
    if kinds:
        raise UnsupportedAttention(config_problem(model.config, type(model).__name__))
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model: what it wraps
    params = inspect.signature(type(inner).forward).parameters  # the class's: an instance's wrapper says nothing
    if not {"past_key_values", "cache"} & set(params):
        raise UnsupportedAttention(f"{type(model).__name__}'s forward takes no key/value cache (past_key_values), "
                                   "the state draftkit decodes with and rolls back")


def _alibi(cfg) -> bool:
    """A text config whose model adds ALiBi biases."""
    return bool(getattr(cfg, "alibi", False)) or getattr(cfg, "position_embedding_type", None) == "alibi" \
        or getattr(cfg, "model_type", "") in ("bloom", "mpt")


@dataclass(frozen=True)
class AttentionLayout:
    """spans: {layer type: its window (sliding) or chunk size (chunked), None for full attention}; mapping: the
    model reads a {layer type: mask} dict (needed when its layers mix types)."""

    spans: dict
    mapping: bool

    @classmethod
    def of(cls, model) -> "AttentionLayout":
        """The layout of `model` (kept on it). Raises UnsupportedAttention for mixed types without a mapping."""
        cached = getattr(model, "_draftkit_layout", None)
        if cached is not None:
            return cached
        if _alibi(text_config(model.config)):
            raise UnsupportedAttention(config_problem(model.config, type(model).__name__))
        impl = str(getattr(model.config, "_attn_implementation", None) or "")
        # FlashAttention kernels take a causal flag and padding, not a mask; flex attention given one of these masks
        # died in the heap on this CPU (torch 2.13, "corrupted size vs. prev_size"), where transformers' own runs
        if any(word in impl for word in ("flash", "paged", "flex")):
            raise UnsupportedAttention(f"{type(model).__name__} runs {impl}, to which draftkit cannot hand a tree's "
                                       "or a batch's 4D mask; load it with attn_implementation=\"sdpa\" (or \"eager\")")
        cfg = text_config(model.config)
        source = _module_source(model)
        spans = {}
        for kind in _layer_types(cfg, source):
            if kind == SLIDING:
                spans[kind] = int(cfg.sliding_window)
            elif kind == CHUNKED:
                spans[kind] = int(cfg.attention_chunk_size)
            elif kind == FULL:
                spans[kind] = None
            else:
                raise UnsupportedAttention(f"{type(model).__name__} has layers of attention type {kind!r}, "
                                           "which draftkit does not know how to mask")
        mapping = "causal_mask_mapping" in source
        if len(spans) > 1 and not mapping:
            raise UnsupportedAttention(f"{type(model).__name__} mixes attention layer types ({', '.join(spans)}) "
                                       "but its forward takes one mask for all layers")
        layout = cls(spans, mapping)
        try:
            model._draftkit_layout = layout
        except AttributeError:
            pass
        return layout

    @property
    def plain(self) -> bool:
        """Every layer attends to every earlier key: the full mask serves as it is."""
        return all(span is None for span in self.spans.values())

    @property
    def widest_window(self) -> int:
        """The largest window or chunk (0 when every layer is full): what a probe must pass to see the rule."""
        return max((s for s in self.spans.values() if s), default=0)

    def far(self, kind: str, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor | None:
        """(B, 1, q, W) bool: keys a layer of `kind` must not see, on top of the full mask (None: none).
        q_pos (B, q) and k_pos (B, W) long positions."""
        span = self.spans[kind]
        if span is None:
            return None
        q, k = q_pos[:, None, :, None], k_pos[:, None, None, :]
        if kind == SLIDING:
            return q - k >= span
        return torch.div(q, span, rounding_mode="floor") != torch.div(k, span, rounding_mode="floor")

    def masks(self, full: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, out: dict | None = None):
        """What to hand the model as `attention_mask`: full (B, 1, q, W) additive, as it is for a plain layout;
        else one mask per layer type (a dict when the model reads one). out: {(kind, shape): buffer} to write
        into in place (static shapes: a compiled forward keeps its mask addresses), else new tensors."""
        if self.plain:
            return full
        low = torch.finfo(full.dtype).min
        per_kind = {}
        for kind in self.spans:
            far = self.far(kind, q_pos, k_pos)
            if far is None:
                per_kind[kind] = full
            elif out is None:
                per_kind[kind] = full.masked_fill(far, low)
            else:
                buf = out.get((kind, full.shape))
                if buf is None:
                    buf = out[(kind, full.shape)] = torch.empty_like(full)
                per_kind[kind] = buf.copy_(full).masked_fill_(far, low)
        return per_kind if self.mapping else next(iter(per_kind.values()))


def block_key_positions(past: list[int], q_pos: torch.Tensor, width: int, c: int) -> torch.Tensor:
    """(B, width) long: the position of each column of a MaskBuffer mask (verify/tree.py) whose rows each see
    past[b] committed entries at positions 0.. (a row of its own per sequence) and then a block of c entries,
    the last q of them this forward's (q_pos (B, q)). Pending entries of earlier forwards of the step are placed
    right after the committed ones (exact for chains; a draft model's tree of pending entries may sit a few
    positions further, which moves a window by as much and changes only what the draft proposes)."""
    q = q_pos.shape[1]
    cols = torch.arange(width, device=q_pos.device).repeat(len(past), 1)
    for b, start in enumerate(past):
        cols[b, start + c - q:start + c] = q_pos[b]
    return cols


def per_layer_type(model, full: torch.Tensor, q_pos: torch.Tensor, past: list[int], c: int):
    """The `attention_mask` for a forward whose full mask (B, 1, q, W) is MaskBuffer's (rows of their own, past[b]
    committed entries, a block of c), narrowed per layer type (verify/attention_layout.py)."""
    layout = AttentionLayout.of(model)
    if layout.plain:
        return full
    return layout.masks(full, q_pos, block_key_positions(past, q_pos, full.shape[-1], c))
