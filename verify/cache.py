"""A preallocated KV cache with a batch dimension, per-row lengths and O(accepted) commits.

Each layer holds keys and values in one buffer of shape (B, H_kv, capacity, D).
Row b's committed entries sit at [0, lengths[b]). A forward appends its q new
entries per row right after that row's committed ones and any entries still
pending from earlier forwards of the same step (drafters run several forwards
per step):

    row b:  [ committed: lengths[b] ][ pending: `pending` ][ new: q ] ... garbage

Nothing is concatenated and nothing is copied on the way in. `commit(keep)`
then keeps, per row, the pending entries named in `keep` (in order): those
already in place (a prefix of the pending region: the fed prefix, a chain,
the best branch laid out first) are not touched; only the others are moved,
one indexed copy per layer. The garbage past each row's length is never read:
the attention mask hides it (verify/tree.py).

It is a transformers `Cache`, so any causal LM writes into it through its own
attention layers (`model(..., cache=kv)`).

A window of rows (`window = (first, count)`): a forward of `count` sequences runs over those rows only
and sees only them (the verifier's rows layout, verify/forward.py: one row per lane, the lanes still
decoding kept in the first rows, and a lane's prompt written into its row alone).

Static shapes (`static=True`, the compiled forwards of the verifier and of draft models): a forward writes
its q new entries at the device positions `write_pos` (one `index_copy_` per layer, as transformers'
StaticCache and gpt-fast do; rows of their own lengths, a draft's lanes, one indexed copy at (B, q)
positions) and every layer returns the WHOLE
capacity-wide buffer, so no shape and no Python int in the forward depends on how
far the sequence has come; the attention mask, as wide as the buffer, hides what a
row must not see. The host still keeps `lengths` and `pending` for the commit.
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from draftkit.verify.attention_layout import check_kv_only


class BufferLayer(CacheLayerMixin):
    """One layer's keys and values: (B, H_kv, capacity, D), allocated at the first write."""

    is_sliding = False

    def __init__(self, owner: "KVBuffer"):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states, value_states) -> None:
        _, h, _, d = key_states.shape
        b = self.owner.batch_size  # every row, whichever window the first forward ran over
        self.device = key_states.device
        cap = self.owner.capacity
        self.keys = key_states.new_zeros(b, h, cap, d)
        self.values = value_states.new_zeros(b, h, cap, value_states.shape[-1])
        self.is_initialized = True
        self._mark_static()

    def _mark_static(self) -> None:
        """A static buffer on CUDA keeps its address for CUDA graphs (what StaticCache does)."""
        if self.owner.static and self.keys.is_cuda:
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)

    def grow(self, capacity: int) -> None:
        if self.is_initialized and self.keys.shape[2] < capacity:
            pad = capacity - self.keys.shape[2]
            self.keys = torch.cat([self.keys, self.keys.new_zeros(*self.keys.shape[:2], pad, self.keys.shape[3])], 2)
            self.values = torch.cat([self.values, self.values.new_zeros(*self.values.shape[:2], pad,
                                                                        self.values.shape[3])], 2)
            self._mark_static()

    def update(self, key_states, value_states, *args, **kwargs):
        """key_states (B, H_kv, q, D) -> all keys a query of this forward may see: (B, H_kv, W, D)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        pos = self.owner.write_pos
        if pos is not None:  # static shapes: device positions in, the whole buffer out
            if pos.dim() == 1:  # one row (or rows at one length): (q,) columns
                self.keys.index_copy_(2, pos, key_states)
                self.values.index_copy_(2, pos, value_states)
            else:  # rows of their own (a draft's lanes): (B, q) columns, one indexed copy
                rows = torch.arange(pos.shape[0], device=pos.device)[:, None]
                self.keys[rows, :, pos] = key_states.transpose(1, 2)
                self.values[rows, :, pos] = value_states.transpose(1, 2)
            return self.keys, self.values
        q = key_states.shape[2]
        start, width = self.owner.write_window(q)
        keys, values = self.keys, self.values
        if self.owner.window is not None:  # a view of the window's rows: writes land in the buffer
            first, count = self.owner.window
            keys, values = keys[first:first + count], values[first:first + count]
        if isinstance(start, int):  # every row at the same length: one slice copy
            keys[:, :, start:start + q] = key_states
            values[:, :, start:start + q] = value_states
        else:  # ragged rows: start (B, 1) and the (B, q) positions in one indexed copy
            pos = start + torch.arange(q, device=start.device)
            rows = torch.arange(pos.shape[0], device=pos.device)[:, None]
            keys[rows, :, pos] = key_states.transpose(1, 2)
            values[rows, :, pos] = value_states.transpose(1, 2)
        return keys[:, :, :width], values[:, :, :width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.owner.static:  # the keys a static forward returns: the whole buffer, whatever the step
            return self.owner.capacity, 0
        return self.owner.get_seq_length() + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.get_seq_length()

    def get_max_length(self) -> int:
        return -1

    def move(self, rows: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        """keys[rows[i], :, dst[i]] = keys[rows[i], :, src[i]] for each kept entry i (a gather, then a scatter)."""
        self.keys[rows, :, dst] = self.keys[rows, :, src]
        self.values[rows, :, dst] = self.values[rows, :, src]


class KVBuffer(Cache):
    """The KV cache of one model for a batch of B rows (the verifier's, and a draft model's own).

    lengths: committed entries per row (host ints). pending: entries appended by forwards since
    the last commit, the same count for every row. capacity grows by doubling if a sequence
    outgrows it, so size it to prompt + new tokens + the largest tree to never grow.
    static: forwards write at `write_pos` and see the whole buffer (the module docstring); its capacity is a power
    of two, so that a compiled forward meets few buffer sizes.
    """

    def __init__(self, num_layers: int, batch_size: int = 1, capacity: int = 256, static: bool = False):
        self.static = static
        self.capacity = self._sized(max(int(capacity), 1))
        self.write_pos: torch.Tensor | None = None  # (q,) or (B, q) long on the device: a static forward's new entries
        super().__init__(layers=[BufferLayer(self) for _ in range(num_layers)])
        self.lengths = [0] * batch_size
        self.pending = 0
        self.window: tuple[int, int] | None = None  # (first row, rows) the forwards run over; None: every row
        self._q = 0  # size of the forward in flight (set by the first layer's write)
        self._ragged_start = None  # (rows, 1) long: where each row's new entries go (a caller may give it)

    @classmethod
    def for_model(cls, model, batch_size: int = 1, capacity: int = 256, static: bool = False) -> "KVBuffer":
        check_kv_only(model)  # a model with recurrent state would decode wrongly from keys and values alone
        return cls(cls.layers_of(model), batch_size, capacity, static)

    @staticmethod
    def layers_of(model) -> int:
        """How many layers' keys and values `model` caches."""
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        return int(getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer"))

    # -- the forward's view -------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return len(self.lengths)

    def window_lengths(self) -> list[int]:
        """Committed entries of each row the forwards run over."""
        if self.window is None:
            return self.lengths
        first, count = self.window
        return self.lengths[first:first + count]

    @property
    def ragged(self) -> bool:
        return len(set(self.window_lengths())) > 1

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Entries before the forward in flight in the longest row (what transformers calls the past)."""
        return max(self.window_lengths()) + self.pending

    def write_window(self, q: int):
        """(start, width) for a forward of q tokens: start is an int (even rows) or a (B, 1) tensor."""
        self._q = q
        width = self.get_seq_length() + q
        if width > self.capacity:
            self.reserve(2 * width)
        if not self.ragged:
            return self.window_lengths()[0] + self.pending, width
        if self._ragged_start is None:
            dev = self.layers[0].keys.device
            self._ragged_start = torch.tensor(self.window_lengths(), device=dev)[:, None] + self.pending
        return self._ragged_start, width

    def give_start(self, start: torch.Tensor) -> None:
        """Before a forward over ragged rows: start (rows, 1) long on the device, each row's committed length plus
        the pending entries (what write_window would upload; a caller that has it on the device saves the copy)."""
        self._ragged_start = start

    def _sized(self, capacity: int) -> int:
        return 1 << (capacity - 1).bit_length() if self.static else capacity

    def reserve(self, capacity: int) -> None:
        """Make room for `capacity` entries per row (a copy only when the buffer must grow)."""
        if capacity > self.capacity:
            self.capacity = self._sized(capacity)
            for layer in self.layers:
                layer.grow(self.capacity)

    def static_window(self, q: int, device) -> int:
        """Before a static forward of q rows: their positions, right after the committed and pending entries, go
        to `write_pos` (one device op, no upload), the buffer grows if they would not fit. Returns the first."""
        start = self.lengths[0] + self.pending
        if start + q > self.capacity:
            self.reserve(2 * (start + q))
        self.write_pos = torch.arange(q, device=device) + start
        self._q = q
        return start

    def static_rows(self, q: int, device) -> torch.Tensor:
        """Before a static forward of q new entries in every row (rows of their own lengths): (B, q) write positions,
        each row's right after its committed and pending entries (one upload of the lengths, no wait for the device).
        Returns each row's first, (B, 1)."""
        if max(self.lengths) + self.pending + q > self.capacity:
            self.reserve(2 * (max(self.lengths) + self.pending + q))
        start = torch.tensor(self.lengths).to(device, non_blocking=True)[:, None] + self.pending  # queued, as commit's
        self.write_pos = start + torch.arange(q, device=device)
        self._q = q
        return start

    def end_forward(self) -> None:
        """The forward in flight is done: its entries become pending."""
        self.pending += self._q
        self._q = 0
        self.write_pos = None
        self._ragged_start = None

    # -- commit -------------------------------------------------------------------------------
    def commit(self, keep: list[list[int]] | list[int]) -> None:
        """Keep, per row, the pending entries at offsets `keep[b]` (ascending), in that order; drop the
        rest. A flat list applies to every row. Only entries that must move are copied."""
        if keep and isinstance(keep[0], int) or not keep:
            keep = [keep] * self.batch_size
        rows, src, dst = [], [], []
        for b, offsets in enumerate(keep):
            base = self.lengths[b]
            for i, off in enumerate(offsets):
                if off != i:
                    rows.append(b)
                    src.append(base + off)
                    dst.append(base + i)
            self.lengths[b] = base + len(offsets)
        self.pending = 0
        if rows and self.layers[0].is_initialized:
            dev = self.layers[0].keys.device
            idx = torch.tensor([rows, src, dst]).to(dev, non_blocking=True)  # queued: no wait for the device
            for layer in self.layers:
                layer.move(idx[0], idx[1], idx[2])

    def keep_rows(self, moves: list[tuple[int, torch.Tensor, int]], counts: list[int]) -> None:
        """After a forward over the window's rows: row `first + i` keeps counts[i] pending entries. moves: per row
        whose kept entries are not all in place, (its index in the window, offsets (k,) long on the device of the
        kept entries from the j-th on, j): they go to pending positions j, j + 1, ... (the entries before j are in
        place). One gather and one scatter per layer for all rows, from device offsets (no upload)."""
        first = self.window[0] if self.window is not None else 0
        if len(moves) == 1 and self.layers[0].is_initialized:  # one row (every step of one sequence): a slice
            i, offsets, j = moves[0]
            row, base = first + i, self.lengths[first + i]
            src = offsets + base
            for layer in self.layers:
                layer.keys[row, :, base + j:base + j + src.numel()] = layer.keys[row].index_select(1, src)
                layer.values[row, :, base + j:base + j + src.numel()] = layer.values[row].index_select(1, src)
        elif moves and self.layers[0].is_initialized:
            rows, src, dst = [], [], []
            for i, offsets, j in moves:
                base = self.lengths[first + i]
                rows.append(torch.full_like(offsets, first + i))
                src.append(offsets + base)
                dst.append(torch.arange(base + j, base + j + offsets.numel(), device=offsets.device))
            rows, src, dst = torch.cat(rows), torch.cat(src), torch.cat(dst)
            for layer in self.layers:
                layer.move(rows, src, dst)
        for i, k in enumerate(counts):
            self.lengths[first + i] += k
        self.pending = 0

    def move_row(self, src: int, dst: int) -> None:
        """Row `dst` takes row `src`'s committed entries (a finished sequence's row is reused)."""
        n = self.lengths[src]
        if n and self.layers[0].is_initialized:
            for layer in self.layers:
                layer.keys[dst, :, :n] = layer.keys[src, :, :n]
                layer.values[dst, :, :n] = layer.values[src, :, :n]
        self.lengths[dst] = n

    def drop_pending(self) -> None:
        self.commit([[] for _ in self.lengths])

    def truncate(self, row: int, length: int) -> None:
        """Forget row `row`'s entries from `length` on (a draft cache that ran ahead of the text)."""
        self.lengths[row] = min(self.lengths[row], length)

    def reset(self) -> None:
        self.lengths = [0] * len(self.lengths)
        self.pending = 0

    def tile(self, length: int) -> None:
        """For timing only (verify/cost_profile.py): every row's committed entries repeated up to `length`, as if
        that many had been committed; attention costs the same whatever the keys hold, and a prompt's forward of
        4,096 tokens took half of a cost profile's time."""
        self.reserve(length)
        for row, n in enumerate(self.lengths):
            if 0 < n < length:
                for layer in self.layers:
                    take = torch.arange(n, length, device=layer.keys.device) % n
                    layer.keys[row, :, n:length] = layer.keys[row, :, take]
                    layer.values[row, :, n:length] = layer.values[row, :, take]
                self.lengths[row] = length

    def nbytes(self) -> int:
        """Bytes this buffer holds (allocated, not only used)."""
        return sum(layer.keys.numel() * layer.keys.element_size() * 2 for layer in self.layers
                   if layer.is_initialized)

    def used_bytes(self, entries: int | None = None) -> int:
        """Bytes of `entries` committed entries (default: those held now; what a cache sized exactly to the text
        would hold)."""
        per = sum(layer.keys[0, :, 0].numel() * layer.keys.element_size() * 2 for layer in self.layers
                  if layer.is_initialized)
        return per * (sum(self.lengths) if entries is None else entries)
