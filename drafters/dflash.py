"""DFlash: a block-diffusion drafter that fills a whole block of masked positions in one forward
(Chen et al. 2026, arXiv 2602.06036; z-lab/dflash; vLLM method `dflash`, SGLang `DFLASH`, speculators `dflash`).

The draft is a small stack of Qwen3-style decoder layers with NO token embedding and NO LM head of its
own: it reads the target's embedding table and ends in the target's LM head. Each step it runs ONE
forward over a block of B positions at the positions right after the committed context:

    block   = [root, mask, mask, ..., mask]            the last committed token, then B - 1 mask tokens
    context = hidden_norm(fc([h_a; h_b; ...]))         the target's hidden states of several layers at every
                                                       committed position but the root, fused (nH -> H)
    layer i: x = input_layernorm(h); q = q_norm(q_proj(x)), keys and values over [context ; block]:
             k = k_norm(k_proj(.)), v = v_proj(.) of the context (not normed again) and of x;
             rotary positions: context at its own positions, block at root .. root + B - 1;
             attention is NON-causal inside the block, and every block position sees the whole context;
             h = h + o_proj(attn); h = h + mlp(post_attention_layernorm(h))
    logits  = target_lm_head(norm(h))                  block position j >= 1 gives the distribution of depth j

Depth j's distribution depends only on the context and the root, never on the tokens drafted at other
depths, so chains and trees are cut from the B - 1 per-depth distributions (tree_search.draft_from_depths)
and a sampled token's q is its depth's distribution: lossless like any draft.

The context keys and values are the same for every later step: they are kept per layer (rotated) in a
growing cache, and each step appends only the positions the verifier kept. Nothing is rolled back: the
context holds true target features, and the block's entries are never stored.

Layers: `target_layers` are indices into transformers' hidden_states (0 = embeddings, k = the residual
stream entering layer k). z-lab and vLLM's dflash_config.target_layer_ids name the output of layer id,
i.e. hidden_states[id + 1]; vLLM's top-level eagle_aux_hidden_state_layer_ids and speculators'
aux_hidden_state_layer_ids use hidden_states indices, as here.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

from draftkit.drafters.draft_dtype import draft_dtype as dtype_for, head_in, reads_of
from draftkit.drafters.eagle import _target_name, check_target_shape, target_shape
from draftkit.drafters.attention_window import far_back
from draftkit.drafters.reference_config import llama_config, llama_layer_config
from draftkit.verify.contract import Budget, DecodeState, DraftTree, StepResult

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
KIND = "dflash"


def default_target_layers(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's choice as hidden_states indices: one layer per draft layer, spread from layer 1 to L - 3 (ids),
    the middle one for a one-layer draft; hidden_states index = id + 1."""
    if num_draft_layers == 1:
        return [num_target_layers // 2 + 1]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) + 1 for i in range(num_draft_layers)]


@dataclass
class DFlashConfig:
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    target_layers: list[int]  # hidden_states indices fused into the context
    block_size: int  # B: the root and B - 1 masked positions, so B - 1 draft tokens per step at most
    mask_token_id: int
    target_name: str = ""
    layer_config: dict = field(default_factory=dict)  # Llama/Qwen3 sizes: num_hidden_layers = draft layers
    # greedy trees score paths by log softmax(logits / tree_temperature), fitted on the target's own text
    # (train/calibrate.py); chains and sampled trees do not read it
    tree_temperature: float = 1.0
    # decoding: context positions more than this many before the root are hidden (0: none), the relative
    # distances of training (train/dflash.py sets it to seq_len); see EagleConfig.attention_window
    attention_window: int = 0
    kind: str = KIND

    def check(self) -> "DFlashConfig":
        n = self.num_target_layers
        if self.block_size < 2:
            raise ValueError(f"a DFlash block holds the root and at least one mask: block_size >= 2, "
                             f"got {self.block_size}")
        if not self.target_layers or not all(1 <= k <= n for k in self.target_layers):
            raise ValueError(f"DFlash target_layers must be hidden_states indices in 1..{n}, got {self.target_layers}")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id must lie in [0, {self.vocab_size}), got {self.mask_token_id}")
        if not self.tree_temperature > 0:
            raise ValueError(f"tree_temperature must be > 0, got {self.tree_temperature}")
        if self.attention_window < 0:
            raise ValueError(f"attention_window must be >= 0 (0: none), got {self.attention_window}")
        return self

    @property
    def draft_layers(self) -> int:
        return int(self.layer_config["num_hidden_layers"])


def dflash_config(target, block_size: int, mask_token_id: int, draft_layers: int = 1,
                  target_layers: list[int] | None = None) -> DFlashConfig:
    hidden, vocab, layers = target_shape(target)
    lc = llama_layer_config(target)
    lc["num_hidden_layers"] = int(draft_layers)
    feats = list(target_layers) if target_layers else default_target_layers(layers, draft_layers)
    feats = [k + layers + 1 if k < 0 else k for k in feats]
    return DFlashConfig(hidden, vocab, layers, feats, int(block_size), int(mask_token_id), _target_name(target),
                        lc).check()


class ContextCache:
    """Per draft layer, the rotated context keys and values of one lane or of a batch's lanes, as the rows of
    one buffer (L, kv_heads, capacity, D): row r's first lengths[r] columns are lane r's context. Grown in place
    (capacity doubles), never rolled back. A forward appends every row's new entries: as many as it brings
    (k.shape[2]), or the ragged `expect`ed counts (lanes drafting together: padding past a row's count is
    dropped); it reads every row up to the longest."""

    def __init__(self, num_layers: int, lanes: int = 1):
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * lanes
        self._counts: list[int] | None = None
        self._scatter: tuple | None = None  # (rows, from, to) of a ragged append, built at layer 0

    def expect(self, counts: list[int]) -> list[int]:
        """The next forward appends counts[r] entries to row r; returns the rows' lengths after it."""
        self._counts = list(counts)
        return [n + c for n, c in zip(self.lengths, counts)]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (L, kv_heads, new, D): append, then (L, kv_heads, longest, D) views of every row's context."""
        counts = self._counts or [k.shape[2]] * len(self.lengths)
        after = [n + c for n, c in zip(self.lengths, counts)]
        width = max(after)
        buf = self.k[layer]
        if buf is None or buf.shape[2] < width:
            cap, old = max(2 * width, 64), max(self.lengths)
            grown_k = k.new_zeros(len(self.lengths), k.shape[1], cap, k.shape[3])
            grown_v = v.new_zeros(len(self.lengths), v.shape[1], cap, v.shape[3])
            if buf is not None:
                grown_k[:, :, :old], grown_v[:, :, :old] = buf[:, :, :old], self.v[layer][:, :, :old]
            self.k[layer], self.v[layer] = grown_k, grown_v
        if len(set(self.lengths)) == 1 and len(set(counts)) == 1:  # every row alike: one slice
            n, c = self.lengths[0], counts[0]
            self.k[layer][:, :, n:n + c], self.v[layer][:, :, n:n + c] = k[:, :, :c], v[:, :, :c]
        else:  # ragged: each row's first counts[r] entries to its own end, one indexed copy
            if layer == 0 or self._scatter is None:
                self._scatter = self._ragged(counts, k.device)
            rows, src, dst = self._scatter
            self.k[layer][rows, :, dst], self.v[layer][rows, :, dst] = k[rows, :, src], v[rows, :, src]
        if layer == len(self.k) - 1:
            self.lengths, self._counts, self._scatter = after, None, None
        return self.k[layer][:, :, :width], self.v[layer][:, :, :width]

    def reset(self, reserve: int = 0) -> None:
        """Empty rows for the next sequences (the eager cache grows as it needs: `reserve` is not read)."""
        self.__init__(len(self.k), len(self.lengths))

    def nbytes(self) -> int:
        """Bytes this cache holds (allocated, not only used)."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v if t is not None)

    def _ragged(self, counts: list[int], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = [r for r, c in enumerate(counts) for _ in range(c)]
        src = [i for c in counts for i in range(c)]
        dst = [n + i for n, c in zip(self.lengths, counts) for i in range(c)]
        rows, src, dst = torch.tensor([rows, src, dst], dtype=torch.long).to(device)  # one upload
        return rows, src, dst


class DFlashAttention(nn.Module):
    """Queries from the block; keys / values from [context ; block] (see the module docstring)."""

    def __init__(self, cfg):
        super().__init__()
        h, self.heads, self.kv_heads, self.head_dim = cfg.hidden_size, cfg.num_attention_heads, \
            cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(h, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.q_norm = LlamaRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(self.head_dim, eps=cfg.rms_norm_eps)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)  # (B, n, T, D)

    def kv(self, x: torch.Tensor, rope) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, kv_heads, T, D) rotated keys and values of x (B, T, H)."""
        k = self.k_norm(self._heads(self.k_proj(x), self.kv_heads))
        cos, sin = rope
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, self._heads(self.v_proj(x), self.kv_heads)

    def forward(self, x, rope, ctx_k, ctx_v, mask=None) -> torch.Tensor:
        """x (B, Q, H) normed block; ctx_k / ctx_v (B, kv_heads, C, D); mask (B, 1, Q, C + Q) bool or None
        (None: every block position sees the whole context and the whole block)."""
        q = self.q_norm(self._heads(self.q_proj(x), self.heads))
        cos, sin = rope
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k, v = self.kv(x, rope)
        k, v = torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class DFlashLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.self_attn = DFlashAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def forward(self, h, rope, ctx_k, ctx_v, mask=None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDraft(nn.Module):
    """fc + hidden_norm over the fused target layers, draft layers, final norm (the target's embedding and
    LM head are used, never stored). Tensor names are z-lab's and vLLM's."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config.check()
        self.layer_config = llama_config(config.layer_config)
        lc, h = self.layer_config, config.hidden_size
        self.fc = nn.Linear(len(config.target_layers) * h, h, bias=False)
        self.hidden_norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
        self.layers = nn.ModuleList([DFlashLayer(lc) for _ in range(config.draft_layers)])
        self.norm = LlamaRMSNorm(h, eps=lc.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(lc)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=lc.initializer_range)

    def fuse(self, hidden: list[torch.Tensor] | tuple) -> torch.Tensor:
        """(..., nH) from one tensor per target layer (target_layers order)."""
        return torch.cat(list(hidden), -1) if len(hidden) > 1 else hidden[0]

    def forward(self, embeds, positions, feats, feat_positions, cache: ContextCache | None = None,
                mask=None) -> torch.Tensor:
        """embeds (B, Q, H) of the block, positions (B, Q); feats (B, C, nH) the NEW context's fused target
        layers at feat_positions (B, C) (appended to `cache` when given). Returns (B, Q, H) normed outputs."""
        w = self.fc.weight
        ctx = self.hidden_norm(self.fc(feats.to(w.dtype)))
        h = embeds.to(w.dtype)
        rope_q, rope_c = self.rotary_emb(h, positions), self.rotary_emb(ctx, feat_positions)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, rope_c)
            if cache is not None:
                k, v = cache.append(i, k, v)
                if i == 0:
                    mask = self._windowed(mask, positions, k.shape[2])
            h = layer(h, rope_q, k, v, mask)
        return self.norm(h)

    def _windowed(self, mask, positions: torch.Tensor, context: int):
        """mask (B, 1, Q, C + Q) bool or None, with the context columns (column c: position c) more than
        attention_window positions before each row's root hidden."""
        w = self.config.attention_window
        if not w or context < w:  # host ints (a root is at most `context`): nothing that far back
            return mask
        near = ~far_back(context, positions[:, 0], w)  # (B, C)
        near = torch.cat([near, near.new_ones(near.shape[0], positions.shape[1])], 1)[:, None, None, :]
        return near if mask is None else mask & near

    # --- files ---------------------------------------------------------------------------------------
    def check_target(self, target) -> None:
        check_target_shape(self.config, target, "DFlash", "train/dflash.py")

    def save_pretrained(self, path: str, dtype: torch.dtype = torch.float16) -> None:
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}
        save_file(state, os.path.join(path, WEIGHTS_NAME), metadata={"format": "pt", "kind": KIND})
        with open(os.path.join(path, CONFIG_NAME), "w") as fh:
            json.dump(asdict(self.config), fh, indent=2)

    def load_weights(self, state: dict, source: str) -> "DFlashDraft":
        own = self.state_dict()
        missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
        shapes = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in own.items()
                  if k in state and tuple(state[k].shape) != tuple(v.shape)]
        if missing or unexpected or shapes:
            raise ValueError(f"{source}: weights do not match the DFlash config (missing {missing}, unexpected "
                             f"{unexpected}, shapes {shapes})")
        self.load_state_dict({k: v.float() for k, v in state.items()})
        return self.float()

    @classmethod
    def from_pretrained(cls, path: str, target=None) -> "DFlashDraft":
        """draftkit's folder, or the public layouts (z-lab / vLLM, speculators) through drafters.formats."""
        from draftkit.drafters.dflash_formats import load_dflash_draft

        return load_dflash_draft(path, target)


@torch.no_grad()
def make_dflash_draft(target, block_size: int, mask_token_id: int, draft_layers: int = 1,
                      target_layers: list[int] | None = None) -> DFlashDraft:
    """A fresh DFlash draft for `target`; its final norm starts as the target's."""
    draft = DFlashDraft(dflash_config(target, block_size, mask_token_id, draft_layers, target_layers))
    base = target.get_decoder() if hasattr(target, "get_decoder") else target.model
    norm = getattr(getattr(base, "norm", None), "weight", None)
    if norm is not None and norm.shape == draft.norm.weight.shape:
        draft.norm.weight.copy_(norm)
    return draft.float()


class DFlashDrafter:
    """Chains or trees from one DFlash block forward per step.

    max_depth: draft depth (at most block_size - 1); max_nodes: tree size cap; top_k: children per node
    (1: a chain). temperature: the q temperature when sampling (default: the sampling temperature).
    compile_draft: the block forward on static buffers, compiled (drafters/dflash_static.py).
    """

    def __init__(self, target, draft: DFlashDraft, max_depth: int = 4, max_nodes: int = 8, top_k: int = 2,
                 temperature: float | None = None, sampling=None, draft_dtype: str = "auto",
                 compile_draft: bool = False):
        block = draft.config.block_size
        if not 1 <= max_depth <= block - 1:
            raise ValueError(f"dflash drafts at most block_size - 1 = {block - 1} tokens per step (its trained "
                             f"block); max_depth must be in 1..{block - 1}, got {max_depth}")
        if top_k < 1 or max_nodes < 1:
            raise ValueError(f"top_k and max_nodes must be >= 1, got {top_k} and {max_nodes}")
        if temperature is not None and temperature <= 0:
            raise ValueError(f"the draft temperature must be > 0, got {temperature}")
        draft.check_target(target)
        self._target = target
        self.draft_dtype = draft_dtype
        dtype = dtype_for(target, draft_dtype, reads_of(draft, target, True))  # drafters/draft_dtype.py
        self.embed, self.head = target.get_input_embeddings(), head_in(target, dtype)  # the head in the draft's dtype
        self.device = self.head.weight.device
        self.draft = draft.to(self.device, dtype).eval()
        self.hidden_layers = tuple(draft.config.target_layers)
        self.top_k, self.temperature, self.sampling = top_k, temperature, sampling
        self.tree_temperature = float(draft.config.tree_temperature)
        self.budget_cap = Budget(max_depth, max_nodes if top_k > 1 else max_depth)
        self.compile_draft = compile_draft
        self.alone = None
        self.reset(None)

    @classmethod
    def from_pretrained(cls, path: str, target, **flags) -> "DFlashDrafter":
        from draftkit.drafters.dflash_formats import load_dflash_draft

        return cls(target, load_dflash_draft(path, target), **flags)

    def lane(self) -> "DFlashDrafter":
        """A drafter for another lane of a batch: the same draft (shared, so the lanes can draft together) and
        settings, a state of its own."""
        cap = self.budget_cap
        return DFlashDrafter(self._target, self.draft, cap.max_depth, cap.max_nodes, self.top_k, self.temperature,
                             self.sampling, self.draft_dtype, self.compile_draft)

    @classmethod
    def draft_lanes(cls, drafters: list):
        """The lanes of a batch drafting together (drafters/dflash_lanes.py), when they share a draft and settings."""
        from draftkit.drafters.dflash_lanes import DFlashLanes
        from draftkit.drafters.lanes import compatible

        return DFlashLanes(drafters) if compatible(drafters, "draft") else None

    def reset(self, prompt) -> None:
        from draftkit.drafters.dflash_lanes import DFlashLanes
        from draftkit.verify.lanes import lanes_forming

        self.todo: list[torch.Tensor] = []  # (k, nH) fused target layers of kept positions not yet in the cache
        self.reserve = 2 * (prompt.numel() if prompt is not None else 0) + 256  # context entries a static buffer holds
        if self.alone is None:  # one sequence: a group of one, whose cache becomes `self.cache`
            self.alone = DFlashLanes([self])
        else:  # out of any batch's group; compile_draft's graphs now, unless a batch is forming (verify/lanes.py)
            self.alone.reset(self.reserve, warm=prompt is not None and not lanes_forming())

    def warm(self) -> None:
        """compile_draft: this drafter's graphs for one sequence, unless it has joined a batch's group."""
        if self.cache is self.alone.cache:
            self.alone.warm()

    def propose(self, state: DecodeState) -> DraftTree:
        return self.alone.propose([state])[0]

    @torch.no_grad()
    def update(self, result: StepResult) -> None:
        if result.hidden is None:
            raise ValueError("DFlashDrafter needs the target's hidden states (hidden_layers)")
        self.todo.append(self.draft.fuse(result.hidden).to(self.device))


__all__ = ["ContextCache", "DFlashConfig", "DFlashDraft", "DFlashDrafter", "default_target_layers", "dflash_config",
           "make_dflash_draft"]
