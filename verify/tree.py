"""Tree attention: masks and position ids for a forward on top of a KVBuffer.

One builder serves the verifier and the drafters that run a model (standalone,
EAGLE). A forward sees, per row b, `past[b]` entries that every new token may
attend to (the committed cache), then a block of C entries (pending entries of
earlier forwards of this step, then the q new tokens) in which each new token
sees only what `block` allows:

    columns:  [ past[b]: all visible ][ block (q, C) ][ past[max] - past[b]: hidden ]

For the verifier the forward's input is a committed prefix (m >= 1 tokens not
yet in the cache; the last one is the root) followed by the n draft nodes:

    input:     [p_0 ... p_{m-1}=root] [node_0 ... node_{n-1}]
    positions:  L .. L+m-1             L+m-1+depth(node)

Prefix tokens attend causally; a node attends to the whole prefix and to its own
ancestors and itself (`verify_block`). Masks are written into one buffer that
is reused from step to step; only the block that changed is rewritten.
"""
from __future__ import annotations

import torch

from draftkit.verify.attention_layout import per_layer_type
from draftkit.verify.cache import KVBuffer
from draftkit.verify.contract import DraftTree
from draftkit.verify.head import rows_first_head


def verify_block(tree: DraftTree, prefix_len: int) -> torch.Tensor:
    """(m + n, m + n) bool: what each of [prefix] + [nodes] may see among themselves."""
    m, n = prefix_len, len(tree)
    block = torch.zeros(m + n, m + n, dtype=torch.bool, device=tree.tokens.device)
    block[:m, :m] = torch.ones(m, m, dtype=torch.bool, device=block.device).tril_()
    block[m:, :m] = True
    if n:
        block[m:, m:] = tree.ancestors
    return block


def verify_offsets(tree: DraftTree, prefix_len: int) -> torch.Tensor:
    """(m + n,) long position offsets from the cache length: 0..m-1, then m - 1 + depth."""
    depth = torch.tensor(tree.depth[1:], dtype=torch.long)
    return torch.cat([torch.arange(prefix_len), prefix_len - 1 + depth]).to(tree.tokens.device)


class MaskBuffer:
    """Additive 4D masks (B, 1, q, W), 0 where attention is allowed and dtype-min elsewhere,
    written into a buffer kept from call to call. Between calls the buffer is all zeros; each
    call writes its block (and the hidden columns of shorter rows) and clears them next time."""

    def __init__(self, dtype: torch.dtype, device):
        self.dtype, self.device = dtype, torch.device(device)
        self.min = torch.finfo(dtype).min
        self.buf = torch.zeros(1, 1, 0, 0, dtype=dtype, device=self.device)
        self.dirty: list[tuple[int, int, int, int]] = []  # (row, q, first column, end column)
        self.static: dict[tuple[int, int], torch.Tensor] = {}  # (bucket, capacity) -> its (1, 1, b, capacity) mask
        self.per_type: dict[tuple, torch.Tensor] = {}  # (layer type, shape) -> a static mask narrowed to that type

    def _room(self, batch: int, q: int, width: int) -> None:
        b, _, rows, cols = self.buf.shape
        if batch > b or q > rows or width > cols:
            self.buf = torch.zeros(max(batch, b), 1, max(q, rows), max(width, 2 * cols),
                                   dtype=self.dtype, device=self.device)
            self.dirty = []

    def __call__(self, past: list[int], block: torch.Tensor) -> torch.Tensor:
        """past: visible entries per row; block (q, C) bool shared by every row, or (B, q, C)."""
        q, c = block.shape[-2:]
        width = max(past) + c
        self._room(len(past), q, width)
        for row, rq, c0, c1 in self.dirty:
            self.buf[row, 0, :rq, c0:c1] = 0
        self.dirty = []
        hide = ~block.to(self.device)
        for row, start in enumerate(past):
            region = self.buf[row, 0, :q, start:width]  # the block, then columns this row must not see
            region[:, :c].masked_fill_(hide if hide.dim() == 2 else hide[row], self.min)
            region[:, c:] = self.min
            self.dirty.append((row, q, start, width))
        return self.buf[:len(past), :, :q, :width]

    def write(self, past: torch.Tensor, block: torch.Tensor) -> torch.Tensor:
        """One row: past (q, W) bool (which committed entries each new token sees), block (q, q) bool (which
        new tokens). Returns the (1, 1, q, W + q) mask, written in place."""
        q, w = past.shape
        self._room(1, q, w + q)
        for row, rq, c0, c1 in self.dirty:
            self.buf[row, 0, :rq, c0:c1] = 0
        view = self.buf[0, 0, :q, :w + q]
        view[:, :w].masked_fill_(~past, self.min)
        view[:, w:].masked_fill_(~block, self.min)
        self.dirty = [(0, q, 0, w + q)]
        return self.buf[:1, :, :q, :w + q]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [self.buf, *self.static.values(), *self.per_type.values()])

    def write_static(self, past: torch.Tensor, block: torch.Tensor, capacity: int) -> torch.Tensor:
        """One row, static shapes: past (b, W) bool, block (b, b) bool for the b rows of a bucket. Returns the
        (1, 1, b, capacity) mask, rewritten in place in a buffer of its own per shape (fixed strides and address,
        so a compiled forward neither recompiles nor, on CUDA, copies it); columns from W + b on are hidden."""
        b, w = past.shape
        buf = self.static.get((b, capacity))
        if buf is None:
            buf = self.static[(b, capacity)] = torch.empty(1, 1, b, capacity, dtype=self.dtype, device=self.device)
        view = buf[0, 0]
        view.fill_(self.min)
        view[:, :w].masked_fill_(past, 0)
        view[:, w:w + b].masked_fill_(block, 0)
        return buf


def positions(past: list[int], offsets: torch.Tensor) -> torch.Tensor:
    """(B, q) position ids: row b's new token j is at past[b] + offsets[j] (offsets (q,), shared by the rows)
    or past[b] + offsets[b, j] (offsets (B, q): rows of different trees, drafters/lanes.py)."""
    rows = offsets if offsets.dim() == 2 else offsets[None]
    if len(set(past)) == 1:  # one row, or rows at the same length: no upload
        return rows.expand(len(past), -1) + past[0]
    start = torch.tensor(past, dtype=torch.long, device=offsets.device)[:, None]
    return start + rows


def path_slots(tree: DraftTree, node: int) -> list[int]:
    """Node indices from the root's first child down to `node` (inclusive)."""
    path, parents = [], tree.host_parents
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def run_model(model, kv: KVBuffer, masks: MaskBuffer | None, block: torch.Tensor | None,
              offsets: torch.Tensor | None, **inputs):
    """model(**inputs) on top of `kv`; the new entries become pending in kv.

    block (q, C) bool: what each new token sees among the pending and new entries; offsets (q,)
    long: positions relative to each row's committed length (see verify/tree.py). None: the new
    tokens follow the pending ones causally, so the model builds its own mask (even rows only).
    """
    if block is not None:
        full = masks(kv.lengths, block)
        inputs["position_ids"] = positions(kv.lengths, offsets)
        inputs["attention_mask"] = per_layer_type(model, full, inputs["position_ids"], kv.lengths, block.shape[-1])
    try:
        with rows_first_head(model):  # verify/head.py
            return model(cache=kv, use_cache=True, **inputs)
    finally:
        kv.end_forward()
