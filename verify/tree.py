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
import torch.nn.functional as F

from draftkit.verify.attention_layout import per_layer_type
from draftkit.verify.cache import KVBuffer
from draftkit.verify import compiled as compiled_module
from draftkit.verify.compiled import bucket, call_compiled
from draftkit.verify.contract import DraftTree
from draftkit.verify.gqa import cpu_kernels


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
            # only a dimension that is too small grows (the columns by doubling: a context grows a few entries a
            # step); doubling the columns whenever the rows grew took a cost profile's 17 row sizes at context
            # 2048 to a 35 GB buffer
            self.buf = torch.zeros(max(batch, b), 1, max(q, rows), max(width, 2 * cols) if width > cols else cols,
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

    def write_rows_static(self, past: torch.Tensor, block: torch.Tensor, capacity: int) -> torch.Tensor:
        """Rows of their own, static shapes: past (B, 1) long on the device, each row's committed entries (all
        visible); block (B, b, C) bool, what each of a row's b new tokens sees among its C pending and new entries,
        which follow its committed ones. Returns the (B, 1, b, capacity) mask, rewritten in place in a buffer of
        its own per shape (as write_static); every other column is hidden. No host loop: one op per part."""
        n, b, c = block.shape
        buf = self.static.get((n, b, capacity))
        if buf is None:
            buf = self.static[(n, b, capacity)] = torch.empty(n, 1, b, capacity, dtype=self.dtype, device=self.device)
        view = buf[:, 0]  # (B, b, capacity)
        view.fill_(self.min)
        view.masked_fill_((torch.arange(capacity, device=self.device) < past)[:, None, :], 0)
        at = (past + torch.arange(c, device=self.device))[:, None, :].expand(n, b, c)  # each row's block columns
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        view.scatter_(2, at, torch.where(block.to(self.device), zero, self.min))
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


ROW_INPUTS = ("input_ids", "inputs_embeds", "features", "embeds")  # a draft's inputs with a row per new token
COMPILED_ROWS = 16  # static draft forwards of at most this many rows a sequence run compiled; larger ones eagerly


def run_model(model, kv: KVBuffer, masks: MaskBuffer | None, block: torch.Tensor | None,
              offsets: torch.Tensor | None, compile: bool = False, **inputs):
    """model(**inputs) on top of `kv`; the new entries become pending in kv.

    block (q, C) bool: what each new token sees among the pending and new entries; offsets (q,)
    long: positions relative to each row's committed length (see verify/tree.py). None: the new
    tokens follow the pending ones causally, so the model builds its own mask (even rows only).
    A static kv (rows of their own, a draft's lanes): `_run_static`, compiled when `compile`.
    """
    if kv.static:
        return _run_static(model, kv, masks, block, offsets, compile, inputs)
    if block is not None:
        full = masks(kv.lengths, block)
        inputs["position_ids"] = positions(kv.lengths, offsets)
        inputs["attention_mask"] = per_layer_type(model, full, inputs["position_ids"], kv.lengths, block.shape[-1])
    try:
        with cpu_kernels(model):  # verify/gqa.py
            return model(cache=kv, use_cache=True, **inputs)
    finally:
        kv.end_forward()


def static_key(kv: KVBuffer, n: int, b: int, inputs: dict) -> tuple:
    """What a compiled static draft forward's graph depends on: rows, bucket, buffer, each row input's width and
    dtype (EAGLE-3's catch-up takes fused target features, its levels the draft's own: two graphs a bucket)."""
    return (n, b, kv.capacity) + tuple((k, tuple(inputs[k].shape[2:]), inputs[k].dtype) for k in ROW_INPUTS
                                       if k in inputs)


def _run_static(model, kv: KVBuffer, masks: MaskBuffer, block: torch.Tensor | None, offsets: torch.Tensor | None,
                compile: bool, inputs: dict):
    """run_model with static shapes: each row's q new tokens padded to their bucket b (padding tokens carry 0s at
    offset 0 and see only themselves; their entries stay pending, never visible to a real token, and go at the
    commit), the mask (B, 1, b, capacity), every row's entries written at its own positions; compiled (one graph
    per rows x bucket x capacity, verify/compiled.py) when `compile` and b <= COMPILED_ROWS. Returns what the
    model returns for the q real tokens: an output's logits as `logits_to_keep` asked, or a (B, q, ...) tensor."""
    name = next(k for k in ROW_INPUTS if k in inputs)
    n, q = inputs[name].shape[:2]
    dev, pending = inputs[name].device, kv.pending
    b = bucket(q)
    if block is None:  # causal after the pending entries
        block = torch.ones(q, pending + q, dtype=torch.bool, device=dev).tril(pending)
        offsets = torch.arange(q, device=dev)
    c = block.shape[-1]
    padded = torch.zeros(n, b, c - q + b, dtype=torch.bool, device=dev)  # (B, b, C'): the block, then padding
    padded[:, :q, :c] = block
    padded[:, torch.arange(q, b), c - q + torch.arange(q, b)] = True
    offs = torch.zeros(n, b, dtype=torch.long, device=dev)
    offs[:, :q] = offsets
    past = kv.static_rows(b, dev) - pending  # (B, 1) committed entries per row (one upload)
    inputs = {k: F.pad(v, (0, 0) * (v.dim() - 2) + (0, b - q)) if k in ROW_INPUTS else v for k, v in inputs.items()}
    inputs["position_ids"] = past + offs
    full = masks.write_rows_static(past, padded, kv.capacity)
    inputs["attention_mask"] = per_layer_type(model, full, inputs["position_ids"], kv.lengths, padded.shape[-1])
    keep = inputs.pop("logits_to_keep", None)
    if isinstance(keep, int) and keep:
        keep = torch.arange(q - keep, q, device=dev)
    compiled = compile and b <= COMPILED_ROWS and kv.layers[0].is_initialized
    graphs = compiled and compiled_module.graph_outputs(dev)
    try:
        if compiled:  # every row's logits: one shape per graph; the rows asked for are read below
            out = call_compiled(model, static_key(kv, n, b, inputs), f"the draft forward of {type(model).__name__} "
                                f"for {n} x {b} rows on a {kv.capacity}-entry buffer", "drafters.lanes warms every "
                                "size a step meets when lanes form", graphs, cache=kv, use_cache=True, **inputs)
        else:
            if keep is not None:
                inputs["logits_to_keep"] = keep
            with cpu_kernels(model):
                out = model(cache=kv, use_cache=True, **inputs)
    finally:
        kv.end_forward()
    if not hasattr(out, "logits"):  # a draft module's own output: (B, b, ...) rows
        out = out[:, :q]
        return out.clone() if graphs else out  # CUDA-graph memory the next replay rewrites; a drafter keeps rows
    if compiled:
        out.logits = out.logits[:, :q] if keep is None else out.logits[:, keep]
        if graphs:
            out.logits = out.logits.clone()
    elif keep is None:
        out.logits = out.logits[:, :q]
    return out
