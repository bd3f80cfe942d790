"""DFlash's block forward with static shapes (compile_draft): a fixed-size context buffer, new context entries
padded to a bucket, so `torch.compile` builds one graph per (lanes, bucket, capacity) and replays it.

The eager forward (drafters/dflash.py) grows its ContextCache and attends over the longest row's columns, so
its shapes change every step. Here, per draft layer:

    buffer   (L, kv_heads, capacity, D): row r's first lengths[r] columns are lane r's context; the last
             column is a sink where padding entries are written, never seen
    feats    (L, kb, nH): the step's new context entries, kb = bucket(most any lane brings), zeros past a row's own
    write_at (L, kb): the column each entry goes to (lengths[r] + i, or the sink past row r's count)
    mask     (L, 1, 1, capacity + B): row r's block sees its columns < lengths[r] + its count (minus those past
             the draft's attention window) and its whole block

Each block position's distribution still depends only on its own row's context and root, so the trees are the
eager ones (tested). The sink and padding cost a few columns of attention; on a GPU the forward replays as one
CUDA graph instead of a dozen kernel launches a layer.
"""
from __future__ import annotations

import torch
from torch import nn

from draftkit.drafters.attention_window import far_back
from draftkit.verify.compiled import bucket, call_compiled, graph_outputs, warm_graphs
from draftkit.verify.tree import COMPILED_ROWS

MIN_CAPACITY = 256


class StaticContext:
    """The lanes' context keys and values in fixed-size buffers (see the module docstring); grown (doubling, a
    new graph) only when a row would reach the sink. `lengths`: committed context entries per lane (host ints)."""

    def __init__(self, num_layers: int, lanes: int, kv_heads: int, head_dim: int, dtype, device):
        self.shape, self.dtype, self.device = (lanes, kv_heads, head_dim), dtype, device
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.num_layers, self.capacity, self.lengths = num_layers, 0, [0] * lanes

    def reset(self, reserve: int) -> None:
        """Empty rows, with room for `reserve` entries a row (buffers are kept, and only grow)."""
        self.lengths = [0] * len(self.lengths)
        self.reserve(reserve)

    def reserve(self, entries: int) -> None:
        need = 1 << (max(entries + 1, MIN_CAPACITY) - 1).bit_length()  # and the sink; powers of two: few graphs
        if need <= self.capacity:
            return
        lanes, heads, dim = self.shape
        old = max(self.lengths)
        for buffers in (self.k, self.v):
            for i in range(self.num_layers):
                grown = torch.zeros(lanes, heads, need, dim, dtype=self.dtype, device=self.device)
                if i < len(buffers):
                    grown[:, :, :old] = buffers[i][:, :, :old]
                    buffers[i] = grown
                else:
                    buffers.append(grown)
                if grown.is_cuda:  # CUDA graphs read and write it in place at a fixed address
                    torch._dynamo.mark_static_address(grown)
        self.capacity = need

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class StaticBlock(nn.Module):
    """The draft's block forward over a StaticContext's buffers (its own module, so its compiled graphs are kept
    apart from the draft's eager forward)."""

    def __init__(self, draft):
        super().__init__()
        self.draft = draft

    def forward(self, embeds, positions, feats, feat_positions, write_at, mask, keys: list, values: list):
        """embeds (L, B, H), positions (L, B); feats (L, kb, nH) at feat_positions (L, kb), written to columns
        write_at (L, kb) of keys / values [layer] (L, kv_heads, capacity, D); mask (L, 1, 1, capacity + B) bool.
        Returns (L, B, H) normed outputs."""
        d = self.draft
        w = d.fc.weight
        ctx = d.hidden_norm(d.fc(feats.to(w.dtype)))
        h = embeds.to(w.dtype)
        rope_q, rope_c = d.rotary_emb(h, positions), d.rotary_emb(ctx, feat_positions)
        rows = torch.arange(write_at.shape[0], device=write_at.device)[:, None].expand_as(write_at)
        for i, layer in enumerate(d.layers):
            k, v = layer.self_attn.kv(ctx, rope_c)  # (L, kv_heads, kb, D)
            keys[i][rows, :, write_at] = k.transpose(1, 2)  # (L, kb, kv_heads, D) at each entry's column
            values[i][rows, :, write_at] = v.transpose(1, 2)
            h = layer(h, rope_q, keys[i], values[i], mask)
        return d.norm(h)


def static_block(draft) -> StaticBlock:
    """The draft's StaticBlock, one per draft (kept outside its modules: not a weight, not in its state dict), so
    every group of lanes on this draft replays the same graphs."""
    block = draft.__dict__.get("_draftkit_static_block")
    if block is None:
        block = draft.__dict__["_draftkit_static_block"] = StaticBlock(draft)
    return block


def static_inputs(ctx: StaticContext, counts: list[int], feats: torch.Tensor, roots: list[int], block: int,
                  window: int) -> dict:
    """The StaticBlock's inputs but the block's embeddings: feats (L, k, nH) padded to bucket(k) rows; positions,
    write columns and the mask from the lanes' lengths, counts and roots (host ints): one upload for a batch,
    none for one sequence."""
    n, k, dev, cap = len(counts), feats.shape[1], feats.device, ctx.capacity
    kb = bucket(k)
    if kb > k:
        feats = torch.cat([feats, feats.new_zeros(n, kb - k, feats.shape[-1])], 1)
    steps = torch.arange(kb, device=dev)
    if n == 1:
        start, count, root = ctx.lengths[0], counts[0], roots[0]
        feat_positions = (start + steps)[None]
        write_at = torch.where(steps < count, start + steps, cap - 1)[None]
        positions = torch.arange(root, root + block, device=dev)[None]
        seen = (torch.arange(cap, device=dev) < start + count)[None]  # (1, capacity)
    else:
        base = torch.tensor([ctx.lengths, counts, roots], dtype=torch.long).to(dev)  # (3, L): the one upload
        start, count = base[0, :, None], base[1, :, None]
        feat_positions = start + steps
        write_at = torch.where(steps < count, feat_positions, cap - 1)
        positions = base[2, :, None] + torch.arange(block, device=dev)
        seen = torch.arange(cap, device=dev) < start + count  # (L, capacity)
    if window:
        seen = seen & ~far_back(cap, positions[:, 0], window)
    mask = torch.cat([seen, seen.new_ones(n, block)], 1)[:, None, None, :]
    return dict(positions=positions, feats=feats, feat_positions=feat_positions, write_at=write_at, mask=mask)


def run_static(draft, ctx: StaticContext, embeds: torch.Tensor, inputs: dict, compile: bool) -> torch.Tensor:
    """The block forward on the static buffers, compiled when `compile` and the new entries fit COMPILED_ROWS (a
    prompt's first step runs eagerly on the same path); (L, B, H), a copy where CUDA-graph memory would be kept."""
    n, kb = inputs["feats"].shape[:2]
    model = static_block(draft)
    inputs = dict(inputs, embeds=embeds, keys=ctx.k, values=ctx.v)
    if not (compile and kb <= COMPILED_ROWS):
        return model(**inputs)
    graphs = graph_outputs(embeds.device)
    out = call_compiled(model, static_key(ctx, n, kb), f"DFlash's block forward for {n} x {kb} new context entries "
                        f"on a {ctx.capacity}-entry buffer", "drafters.dflash_static warms every size when lanes form",
                        graphs, **inputs)
    return out.clone() if graphs else out


def static_key(ctx: StaticContext, n: int, kb: int) -> tuple:
    return ("dflash", n, kb, ctx.capacity, ctx.dtype)


@torch.no_grad()
def warm(draft, ctx: StaticContext, embed, block: int, mask_id: int) -> None:
    """Compile, before any step is timed, the graph of every bucket of up to COMPILED_ROWS new entries for these
    lanes and this buffer; every entry goes to the sink, so the context is untouched. Said in one line; nothing
    when every graph exists (kept on the draft)."""
    n = len(ctx.lengths)
    width = len(draft.config.target_layers) * draft.config.hidden_size
    ids = torch.full((n, block), mask_id, dtype=torch.long, device=ctx.device)

    def run(b: int) -> None:  # b new entries a lane, all written to the sink
        feats = torch.zeros(n, b, width, dtype=ctx.dtype, device=ctx.device)
        run_static(draft, ctx, embed(ids), static_inputs(ctx, [0] * n, feats, [0] * n, block, 0), True)
    calls = [(static_key(ctx, n, b), lambda b=b: run(b)) for b in sorted({bucket(q) for q in range(1, COMPILED_ROWS + 1)})]
    warm_graphs(static_block(draft), calls, f"DFlash's block forward for {n} lane{'s' if n > 1 else ''}, buckets of "
                f"1-{COMPILED_ROWS} new context entries, on a {ctx.capacity}-entry buffer")
