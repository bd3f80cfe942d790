"""One target forward over [prefix] + draft tree on top of the verifier's KV buffer.

Works for any transformers causal LM that accepts a 4D additive attention mask
and explicit position ids (Llama, Qwen2, Mistral, GPT-2, ...). Plain decoding,
trees and batches all take the same path (`Verifier.run`): the step's input
(verify/step.py), a mask written in place, one forward. A model that gets tree
attention wrong is caught by a one-time probe and limited to one sequence with
chains, which then run with the model's own causal masking (verify/tree_probe.py).

Rows layout (`lanes > 1`, a batch of prompts): the KV buffer has a row per lane and a step is a
(lanes, width) batch, each lane's pending tokens and tree padded to the widest lane's; a row attends over
its own lane's entries only. Packed in one row (the default: one sequence, best-of-N's shared prompt, static
shapes), every row of every lane attends over every lane's columns and masks the others' away: at 8 lanes of
256 entries and 5 rows each, the forward cost 68 ms against 42 ms in rows (CPU, the 12M target), while a
plain step of one row per lane cost the same either way. The lanes still decoding keep the first rows: a
finished lane's row takes the last live lane's entries (`release`), so a step never runs a finished lane.
The buffer is rectangular (lanes x the longest lane's capacity): at very unequal prompt lengths it holds more
than the packed row would.

Row padding (eager, one sequence): on some CPU BLAS builds a forward over q rows costs more than one over a few
rows more (SmolLM2-135M, 2 EPYC cores, context 256: 2-4 rows 1.27-1.44 plain steps, 5 rows 1.05; the shipped 12M
target: 4 rows 1.25, 5 rows 1.14), so a step may run padded to the cheapest row count at or above its own, as the
target's cost profile measured it (`row_padding`, verify/cost_profile.py). Padding rows come after the step's rows: on the
model's own causal mask they are later tokens no real row sees; with a 4D mask they carry token 0 at position 0
and see only themselves. Their logits are never read and their entries never committed.

Static shapes (`static_verifier`, `compile=True` in the API): the step's q rows are
padded to a bucket (1, 2, 4, ..., 64, then multiples of 64; padding rows carry token
0 at position 0, see only themselves, are never committed and their logits never
read), the KV buffer returns its whole capacity (verify/cache.py) and the mask is
(1, 1, bucket, capacity), so a forward's shapes depend only on its bucket and
`torch.compile(dynamic=False)` compiles it once per bucket. transformers reads no
Python int from the cache on this path (a 4D mask and position ids are given, so
neither `get_seq_length` nor `get_mask_sizes` is called; the latter would report the
capacity), and the write positions reach the layers as a device tensor.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from draftkit.verify.attention_layout import AttentionLayout, per_layer_type
from draftkit.verify.cache import KVBuffer
from draftkit.verify.compiled import bucket, call_compiled, graph_outputs
from draftkit.verify.layer_tap import LayerTap
from draftkit.verify.contract import DraftTree
from draftkit.verify.gqa import cpu_kernels
from draftkit.verify.step import SHARED, Piece, StepInputs
from draftkit.verify.tree import MaskBuffer
from draftkit.verify.tree_probe import TreeAttentionUnsupported, probe_tree_attention


def output_vocab(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def context_limit(model) -> int | None:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)


def padded_block(block: torch.Tensor, pad: int) -> torch.Tensor:
    """(q + pad, q + pad): the step's block (q, q), then `pad` rows that see only themselves."""
    out = torch.eye(block.shape[0] + pad, dtype=torch.bool, device=block.device)
    out[:block.shape[0], :block.shape[0]] = block
    return out


class Verifier:
    """Holds the target, its KV buffer (packed: one row shared by every lane, with the owner of each committed
    entry, a lane's index or SHARED; rows: a row per lane, `lanes` > 1) and the mask buffer: the one forward path
    of the loop.
    static: every forward has the static shapes of the module docstring; compile: decoding steps then run
    the compiled forward (the prefill, a one-off size, runs eagerly through the same static path)."""

    def __init__(self, model, capacity: int = 256, static: bool = False, compile: bool = False, lanes: int = 1):
        self.model = model
        self.vocab_size = output_vocab(model)
        self.tree_ok = None  # probed before the first forward
        self.max_len = context_limit(model)
        self.masks = MaskBuffer(model.dtype, model.device)
        self.static = static or compile
        self.compile = compile
        # "reduce-overhead" compiles to CUDA graphs, whose outputs live in memory the next replay rewrites
        self.graph_outputs = graph_outputs(model.device)
        self.rows = lanes > 1 and not self.static  # the rows layout (module docstring): capacity is per row
        self.kv = KVBuffer.for_model(model, lanes if self.rows else 1, capacity=capacity, static=self.static)
        self.row_of = {i: i for i in range(lanes)} if self.rows else {}  # lane -> its KV row (rows layout)
        self.released = 0  # entries of the lanes that gave their rows back (rows layout)
        self.owner = torch.full((max(capacity, 1),), SHARED, dtype=torch.long, device=model.device)
        self.kpos = torch.arange(max(capacity, 1), device=model.device)  # each committed entry's position (packed)
        self.layout = None  # the model's AttentionLayout, read before the first hand-built mask
        self.peak_entries = 0
        self.peak_logits_bytes = 0
        self.peak_hidden_bytes = 0  # the largest set of hidden states one forward returned (all layers, or a tap's)
        self.row_padding: dict[int, int] = {}  # eager, one row: a step of q rows runs as row_padding[q] rows

    @property
    def cache_len(self) -> int:
        return self.kv.lengths[0]

    def reset(self) -> None:
        """Empty, for a new run on the same buffers."""
        self.kv.reset()
        self.row_of = {i: i for i in range(self.kv.batch_size)} if self.rows else {}
        self.released = 0
        self.owner.fill_(SHARED)
        self.kpos.copy_(torch.arange(self.kpos.numel(), device=self.kpos.device))
        self.peak_entries = self.peak_logits_bytes = self.peak_hidden_bytes = 0

    def _check_tree_attention(self) -> None:
        if self.layout is None:
            self.layout = AttentionLayout.of(self.model)  # UnsupportedAttention: one line naming the feature
        if self.tree_ok is None:
            self.tree_ok = probe_tree_attention(self.model)
        if not self.tree_ok:
            hint = "static shapes (compile=True) need a 4D attention mask; run without compile" if self.static else \
                "use a chain drafter (tree size 1 per depth) with this model, one sequence at a time"
            raise TreeAttentionUnsupported(
                f"{type(self.model).__name__} does not give correct logits under a 4D tree attention mask; {hint}")

    def check_masks_early(self) -> None:
        """The first hand-built mask's one-time checks (the attention layout, the tree-attention probe: two small
        forwards), run before a drafting run's first timed step: inside it (SmolLM2: 0.2 s) they read as that
        step's verify time, and the controller priced drafting at 4.4 times its cost for the rest of the call.
        Whatever they find is raised where a mask is first needed, as before (a run that never needs one, a
        chain drafter's, never hears of it)."""
        try:
            self._check_tree_attention()
        except Exception:  # noqa: BLE001 - not cached: the first hand-built mask runs the check again and raises
            pass

    def _needs_mask(self, step: StepInputs) -> bool:
        """Whether the forward needs a 4D mask: not for one lane whose input is a chain on top of a cache it
        owns entirely (plain decoding, chain drafters), which runs with the model's own causal mask."""
        if len(step.pieces) == 1 and not step.branched and step.pieces[0].owner in (0, SHARED) \
                and self.cache_len == step.pieces[0].position:
            return False
        self._check_tree_attention()
        return True

    def _padding(self, step: StepInputs, prefill: bool) -> int:
        """Rows of padding this step runs with (row_padding; module docstring): none at a prefill, where the buffer
        would have to grow for them or their positions would pass the model's."""
        rows = self.row_padding.get(step.q)
        end = self.kv.get_seq_length() + (rows or 0)
        if rows is None or prefill or end > self.kv.capacity or (self.max_len and end > self.max_len):
            return 0
        return rows - step.q

    def _padded_masks(self, step: StepInputs, pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(past (q + pad, W), block (q + pad, q + pad), positions (q + pad,)) of the step with `pad` padding rows
        after its own: they see no committed entry and only themselves, at position 0."""
        return F.pad(self._past(step), (0, 0, 0, pad)), padded_block(step.block, pad), F.pad(step.pos, (0, pad))

    def use_row_padding(self, padding: dict[int, int]) -> None:
        """Pad the steps of one sequence as `padding` says (rows -> rows, each at least its key); eager only."""
        if not self.static and not self.rows:
            self.row_padding = {q: r for q, r in padding.items() if r > q}

    def _past(self, step: StepInputs) -> torch.Tensor:
        """(q, W) bool: the committed entries each new row sees (its own lane's and the SHARED ones)."""
        owner = self.owner[:self.cache_len]  # (W,): each committed entry's lane
        return (owner[None] == step.lane[:, None]) | (owner == SHARED)[None]

    def inputs(self, pieces: list[Piece], prefill: bool = False) -> StepInputs:
        """The step's input for these pieces (the step's one upload): in the rows layout, lane by lane in the order
        of their rows (`in_row_order`), padded to the widest; packed otherwise, and for a lane's prefill alone."""
        if self.rows and not prefill:
            assert [self.row_of[p.owner] for p in pieces] == list(range(len(pieces))), "pieces out of row order"
            return StepInputs(pieces, self.model.device, max(p.m + len(p.tree) for p in pieces))
        return StepInputs(pieces, self.model.device)

    def in_row_order(self, lanes: list) -> list:
        """Lanes (objects with `index`) sorted by their KV rows (the rows layout; unchanged when packed)."""
        return sorted(lanes, key=lambda ln: self.row_of[ln.index]) if self.rows else lanes

    def release(self, lane: int) -> None:
        """Lane `lane` is done: the last live lane's entries move into its row (rows layout), so the lanes still
        decoding keep the first rows and a step runs over them only."""
        if not self.rows:
            return
        row = self.row_of.pop(lane)
        last = len(self.row_of)
        self.released += self.kv.lengths[row]
        if row != last:
            mover = next(k for k, r in self.row_of.items() if r == last)
            self.kv.move_row(last, row)
            self.row_of[mover] = row
        self.kv.lengths[last] = 0  # the vacated row holds nothing

    def entries(self) -> int:
        """Target KV entries committed in this run: those held now and those of released lanes (rows layout)."""
        return self.released + sum(self.kv.lengths)

    def _run_rows(self, step: StepInputs, inputs: dict) -> None:
        """Fill `inputs` for a forward over the lanes' rows: (lanes, width) ids and positions, each row's mask (its
        committed entries, then its block), each row's write position from the uploaded positions (no upload)."""
        self._check_tree_attention()  # ragged rows and trees need the 4D mask
        n, w = len(step.pieces), step.width
        self.kv.window = (0, n)
        inputs["input_ids"] = step.ids.view(n, w)
        inputs["position_ids"] = step.pos.view(n, w)
        self.kv.give_start(inputs["position_ids"][:, :1])  # a lane's first pending token sits at its row's length
        block = step.block.view(n, w, n, w).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (n, w, w): each row's own
        lengths = self.kv.window_lengths()
        inputs["attention_mask"] = per_layer_type(self.model, self.masks(lengths, block), inputs["position_ids"],
                                                  lengths, w)
        inputs["logits_to_keep"] = 0

    def run(self, step: StepInputs, hidden_layers: tuple[int, ...] = (), logits_to_keep: int | None = None,
            prefill: bool = False):
        """One target forward over the step's q new rows on top of the cache. Returns logits (k, V) of the
        last k = logits_to_keep rows (default: all q) and the requested hidden-state layers, one (q, H) each,
        or None. The q new entries stay pending until `commit_rows`. prefill: the run's first forward of a
        lane (static shapes: not padded, never compiled)."""
        keep = logits_to_keep or step.q
        inputs = dict(input_ids=step.ids[None], output_hidden_states=bool(hidden_layers))
        forward, pad = self.model, 0
        if self.rows:
            if step.width:
                self._run_rows(step, inputs)
            else:  # a lane's prefill alone in its row, on an empty row: the model's own causal mask
                self.kv.window = (self.row_of[step.pieces[0].owner], 1)
                inputs["logits_to_keep"] = keep
        elif self.static:
            self._check_tree_attention()
            forward = self._static_inputs(step, inputs, prefill)
            inputs["logits_to_keep"] = keep if prefill else 0  # a bucket keeps all its rows: one shape
        else:
            pad = self._padding(step, prefill)
            inputs["logits_to_keep"] = keep + pad  # the padding rows are the last: logits[:keep] are the step's
            if self._needs_mask(step):
                past, block, pos = self._padded_masks(step, pad) if pad else (self._past(step), step.block, step.pos)
                full = self.masks.write(past, block)
                inputs["attention_mask"] = self._per_layer_type(full, pos)
                inputs["position_ids"] = pos[None]
            if pad:  # without a 4D mask: later tokens on the model's causal mask, which no row of the step sees
                inputs["input_ids"] = F.pad(step.ids, (0, pad))[None]
        tap = LayerTap.of(self.model) if hidden_layers and forward is self.model else None
        if tap is not None:  # eager: hooks keep the layers asked for; the model returns no hidden states
            inputs["output_hidden_states"] = False
        try:
            kernels = cpu_kernels(self.model) if forward is self.model else nullcontext()  # verify/gqa.py
            with tap.capture(hidden_layers) if tap is not None else nullcontext({}) as tapped, kernels:
                out = forward(cache=self.kv, use_cache=True, **inputs)
        finally:
            self.kv.end_forward()
        hidden = (lambda i: tapped[i % len(tap.modules)]) if tap is not None else (lambda i: out.hidden_states[i])
        self.peak_hidden_bytes = max(self.peak_hidden_bytes, sum(
            t.numel() * t.element_size() for t in (tapped.values() if tap is not None else out.hidden_states or ())))
        rows_run = (self.kv.window or (0, 1))[1]  # rows the forward ran over, each with `pending` new entries
        self.peak_entries = max(self.peak_entries, sum(self.kv.lengths) + self.kv.pending * rows_run)
        self.peak_logits_bytes = max(self.peak_logits_bytes, out.logits.numel() * out.logits.element_size())
        if out.logits.shape[0] > 1:  # the rows layout: (lanes, width, .) read as one (q, .) block of rows
            rows = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
        else:
            rows = lambda t: t[0, :step.q]  # noqa: E731
        states = tuple(rows(hidden(i)) for i in hidden_layers) if hidden_layers else None
        logits = out.logits[0, :keep] if pad else rows(out.logits)  # padded: the step's rows come first
        if forward is not self.model and self.graph_outputs:
            # CUDA-graph outputs live in the graph's own memory, rewritten by the next replay, while the loop keeps
            # these rows past the step (the rows handed to drafter.update, the logits of the log-probabilities)
            logits = logits.clone()
            states = tuple(s.clone() for s in states) if states else states
        return (logits[-keep:] if self.static and not prefill else logits), states

    def _static_inputs(self, step: StepInputs, inputs: dict, prefill: bool):
        """Pad the step to its bucket (the prefill: to itself) and write the capacity-wide mask; fills `inputs`
        and returns the forward to call: the compiled one for a decoding step when compile is on."""
        q, dev = step.q, self.model.device
        b = q if prefill else bucket(q)
        self.kv.static_window(b, dev)
        past, block, pos = self._padded_masks(step, b - q)
        full = self.masks.write_static(past, block, self.kv.capacity)
        inputs["input_ids"] = F.pad(step.ids, (0, b - q))[None]
        inputs["position_ids"] = pos[None]
        inputs["attention_mask"] = self._per_layer_type(full, inputs["position_ids"][0], static=True)
        if prefill or not self.compile or not self.kv.layers[0].is_initialized:
            return self.model
        key = (1, b, self.kv.capacity, bool(inputs.get("output_hidden_states")))  # a graph of its own each
        what = f"the verify forward for {b} rows{' with hidden states' if key[3] else ''} on a " \
               f"{self.kv.capacity}-entry buffer"
        # a forward that hands hidden states over is a graph of its own (measured: EAGLE's first use of a bucket
        # recompiled for 4-5 s inside a call, without a word)
        return lambda **kw: call_compiled(self.model, key, what, "verify.forward.warm_compiled compiles every "
                                          "bucket ahead", self.graph_outputs, **kw)

    def _per_layer_type(self, full: torch.Tensor, pos: torch.Tensor, static: bool = False):
        """One row's full mask (1, 1, q, W + q or capacity), narrowed per layer type: the keys are the committed
        entries (at their kept positions) and then the step's q' rows (pos (q',), padding included)."""
        if self.layout.plain:
            return full
        w, width = self.cache_len, full.shape[-1]
        k_pos = torch.zeros(width, dtype=torch.long, device=pos.device)  # columns past W + q' are hidden anyway
        k_pos[:w] = self.kpos[:w]
        k_pos[w:w + pos.numel()] = pos
        return self.layout.masks(full, pos[None], k_pos[None], self.masks.per_type if static else None)

    def commit_rows(self, step: StepInputs, keep: torch.Tensor, keep_host: list[int]) -> None:
        """Keep the pending rows `keep` (K,) long on the device, ascending (keep_host: the same on the host),
        in that order (packed: with their lanes as owners); drop the other pending rows. No upload."""
        if self.rows:  # each piece's rows, from its start, go to its own KV row
            spans = [(start, start + (step.width or step.q)) for start in step.starts]
        else:  # one row: the step's rows are its pending entries
            spans = [(0, step.q)]
            w, k = self.cache_len, len(keep_host)
            if w + k > self.owner.numel():
                grown = torch.full((2 * (w + k),), SHARED, dtype=torch.long, device=self.owner.device)
                grown[:self.owner.numel()] = self.owner
                self.owner = grown
                self.kpos = torch.cat([self.kpos, torch.arange(self.kpos.numel(), grown.numel(),
                                                               device=self.kpos.device)])
            self.owner[w:w + k] = step.lane[keep]
            self.kpos[w:w + k] = step.pos[keep]
        self._keep(spans, keep, keep_host)

    def _keep(self, spans: list[tuple[int, int]], keep: torch.Tensor, keep_host: list[int]) -> None:
        """The kept step rows that fall in span i (start, end) go to the window's KV row i. A row's kept entries
        are in place up to the first that is not (offsets ascend), and from there all move."""
        moves, counts, at = [], [], 0
        for i, (start, end) in enumerate(spans):
            j = at
            while j < len(keep_host) and keep_host[j] < end:
                j += 1
            offsets = [k - start for k in keep_host[at:j]]
            first = next((t for t, o in enumerate(offsets) if o != t), len(offsets))
            if first < len(offsets):
                moves.append((i, keep[at + first:j] - start, first))
            counts.append(len(offsets))
            at = j
        self.kv.keep_rows(moves, counts)
        self.kv.window = None

    @torch.no_grad()
    def forward(self, prefix: torch.Tensor, tree: DraftTree, hidden_layers: tuple[int, ...] = ()):
        """One sequence: prefix (m,) committed tokens not yet cached (last = root); tree of n nodes.

        Returns logits (n + 1, V) at the root and each node, and the requested hidden-state layers
        (one (m + n, H) tensor each) or None. The m + n new entries stay pending; `commit` next.
        """
        step = StepInputs([Piece(0, self.cache_len, prefix, tree.validate())], self.model.device)
        logits, states = self.run(step, hidden_layers, len(tree) + 1, prefill=self.cache_len == 0)
        return logits, states

    def commit(self, prefix_len: int, accepted: list[int]) -> None:
        """Keep the prefix and the accepted nodes' entries; O(accepted) copies at most."""
        self.kv.commit(list(range(prefix_len)) + [prefix_len + a for a in accepted])


def static_verifier(model, capacity: int, compile: bool = False) -> Verifier:
    """The model's static-shaped verifier, emptied for a run of up to `capacity` entries. It is kept on the model
    (as transformers keeps a StaticCache): every run reuses its buffers, so a compiled forward meets the shapes
    (and, under CUDA graphs, the addresses) it was compiled for. Its capacity only grows, to powers of two."""
    ver = getattr(model, "_draftkit_static", None)
    if ver is None or ver.kv.capacity < capacity or ver.masks.device != model.device or ver.masks.dtype != model.dtype:
        ver = model._draftkit_static = Verifier(model, 1 << max(capacity - 1, 1).bit_length(), static=True)
    ver.reset()
    ver.compile = compile
    return ver


@torch.no_grad()
def warm_compiled(model, capacity: int, max_rows: int, hidden: tuple[bool, ...] = (False,)) -> list[int]:
    """Compile, before anything is timed, every bucket a run of up to `capacity` KV entries and steps of up to
    `max_rows` rows can meet: one dummy forward per bucket on the model's static verifier (its buffer is sized
    to `capacity` here and kept). hidden: with and/or without hidden states (drafters that read the target's
    features ask for them: a graph of its own, which transformers' output hooks break in pieces). Returns the
    buckets."""
    ver = static_verifier(model, capacity, compile=True)
    dev = model.device
    ver.forward(torch.zeros(1, dtype=torch.long, device=dev), DraftTree.empty(dev))  # the prefill: eager
    ver.commit(1, [])
    sizes = sorted({bucket(q) for q in range(1, max_rows + 1)})
    for b in sizes:  # the root and a chain of b - 1 nodes: exactly b rows
        for h in hidden:
            ver.forward(torch.zeros(1, dtype=torch.long, device=dev), DraftTree.chain([0] * (b - 1), device=dev),
                        (-1,) if h else ())
            ver.kv.drop_pending()
    ver.reset()
    return sizes
