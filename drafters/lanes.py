"""The drafters of a batch's lanes, drafting together: one draft forward per level for every lane.

Alone, each lane's autoregressive drafter (EAGLE, a standalone draft model) runs its own forwards: the
catch-up on what was committed, then one per tree level. At batch 8 that is 8 x (1 + depth) small forwards a
step, one lane after another, and the drafting is paid eight times (batch 8: EAGLE 0.89x of plain batched
decoding at tau 3.57, the standalone draft 0.70x). Together, the lanes' draft caches are the rows of ONE KV
buffer (verify/cache.py: a row per lane, ragged lengths), and each level of every lane's search
(drafters/tree_search.py: a generator of forward requests) is answered by one forward over all rows:

    row r:   [ lane r's committed entries ][ this step's entries: every forward's q columns ][ garbage ]
    forward: q = the most tokens any lane asks for at this level; a lane asking for k < q (or none) fills
             the rest with padding queries that see only themselves

A lane's own entries of a step sit at the pending offsets of the forwards it took part in (`slots`), so its
search's block (over its own run rows) is scattered to those columns, and what it keeps after the step is
translated from its run order to them. Padding entries are never visible to a real query. Greedy trees are
the trees each lane would draft alone (the same forwards, batched; tested).

`DraftLanes` drives the searches and lays out the forwards; a subclass says what goes in and comes out
(`EagleLanes` in drafters/eagle_lanes.py, `StandaloneLanes` in drafters/standalone.py). One sequence is the
group of one (each drafter's `alone`), so a method has one drafting path: its forwards then take the search's
own mask (no padding, no scatter), as a lone drafter would.
"""
from __future__ import annotations

import torch

from draftkit.drafters.tree_search import search
from draftkit.verify.cache import KVBuffer
from draftkit.verify.compiled import bucket, warm_graphs
from draftkit.verify.contract import DecodeState, DraftTree
from draftkit.verify.tree import COMPILED_ROWS, MaskBuffer, run_model, static_key


class DraftLanes:
    """Drafters of one draft model and the same settings, drafting as one group (verify/lanes.py DraftLanes). Built
    right after the lanes' reset; a drafter's next reset takes it back to its own cache."""

    def __init__(self, drafters: list, num_layers: int, dtype: torch.dtype, device):
        self.drafters, self.device = drafters, device
        first = drafters[0]
        self.top_k, self.temperature, self.sampling = first.top_k, first.temperature, first.sampling
        self.tree_temperature = getattr(first, "tree_temperature", 1.0)
        self.masks = MaskBuffer(dtype, device)
        # compiled draft forwards run on static shapes (verify/tree.py `_run_static`): a bucket of rows per lane
        self.compile = bool(getattr(first, "compile_draft", False))
        held = [d.cache for d in drafters if getattr(d, "cache", None) is not None]
        self.cache = KVBuffer(num_layers, batch_size=len(drafters), capacity=max([c.capacity for c in held] + [256]),
                              static=self.compile)
        self.slots: dict[int, list[int]] = {}  # per drafting lane: the pending offsets of its entries this step
        self.kept: dict[int, list[int]] = {}  # per lane: the pending offsets it keeps, committed before next use
        if any(c.lengths[0] for c in held):
            raise ValueError("lanes are formed right after the drafters' reset")
        for d in drafters:
            d.cache, d.group = self.cache, self
        if self.compile and len(drafters) > 1:  # a batch's lanes form before its first step
            self.warm()

    def reset(self, reserve: int, warm: bool = True) -> None:
        """A group of one, for its drafter's next sequence: empty, with room for `reserve` entries. warm: compile
        what compile_draft needs for it now (not before a first prompt says how large the buffer must be)."""
        self.cache.reset()
        self.cache.reserve(reserve)
        self.slots, self.kept = {}, {}
        self.drafters[0].cache, self.drafters[0].group = self.cache, self
        if self.compile and warm:
            self.warm()

    def warm_alone(self) -> None:
        """compile_draft: a group of one compiles its forwards now, unless its drafter has joined a batch's group
        (verify/lanes.py forming_lanes: a batch resets its drafters without compiling)."""
        if self.compile and len(self.drafters) == 1 and self.drafters[0].group is self:
            self.warm()

    @torch.no_grad()
    def warm(self) -> None:
        """compile_draft: compile, before any step is timed, every graph a step can meet here (each kind of input a
        subclass names, at every bucket of up to COMPILED_ROWS rows a lane, for these lanes and this buffer). A graph
        compiling inside a step would be read as seconds of drafting and teach the controller that drafting does
        not pay. Said in one line; nothing when every graph exists (kept on the model)."""
        model, n = self.draft_model, len(self.drafters)

        def run(kw: dict) -> None:
            if not self.cache.layers[0].is_initialized:  # the first forward allocates the buffer: an eager one
                run_model(model, self.cache, self.masks, None, None, False, **kw)
                self.cache.drop_pending()
            run_model(model, self.cache, self.masks, None, None, True, **kw)
            self.cache.drop_pending()
        calls = [(static_key(self.cache, n, b, kw), lambda kw=kw: run(kw))
                 for b in sorted({bucket(q) for q in range(1, COMPILED_ROWS + 1)}) for kw in self.warm_inputs(n, b)]
        warm_graphs(model, calls, f"the draft forward of {type(model).__name__} for {n} lane{'s' if n > 1 else ''}, "
                    f"buckets of 1-{COMPILED_ROWS} rows, on a {self.cache.capacity}-entry buffer")

    # --- what a subclass supplies ---------------------------------------------------------------------------
    def wants(self, r: int, state: DecodeState) -> bool:
        """Lane r drafts this step (its budget is not empty)."""
        return min(state.budget.max_depth, state.budget.max_nodes) >= 1

    def catch_up(self, rows: list[int], states: list) -> torch.Tensor:
        """Run what each drafting lane committed since it last drafted, commit it; (len(rows), V) root logits."""
        raise NotImplementedError

    def run_nodes(self, requests: dict, block: torch.Tensor, offsets: torch.Tensor, q: int) -> dict:
        """One draft forward over every lane's requested nodes (block (L, q, pending + q), offsets (L, q));
        {lane: (k, V) logits of its nodes' children}."""
        raise NotImplementedError

    @property
    def draft_model(self):
        """The module whose forwards the group runs (run_model's model)."""
        raise NotImplementedError

    def warm_inputs(self, n: int, b: int) -> list[dict]:
        """Every kind of row input (verify/tree.py ROW_INPUTS) a forward of b rows for n lanes takes, zeros of the
        shapes and dtypes real steps pass: what compile_draft compiles ahead."""
        raise NotImplementedError

    # --- the group's work -----------------------------------------------------------------------------------
    def keep(self, drafter, entries: list[int]) -> None:
        """After a step: `drafter` keeps its draft entries at these run rows (its search's order)."""
        r = self.drafters.index(drafter)
        slots = self.slots.get(r, [])
        self.kept[r] = [slots[e] for e in entries]

    def commit_kept(self) -> None:
        """The step's entries each lane kept stay; the rest of the step's entries (padding too) go."""
        if self.cache.pending:
            self.cache.commit([self.kept.get(r, []) for r in range(len(self.drafters))])
        self.kept, self.slots = {}, {}

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None]) -> list[DraftTree]:
        self.commit_kept()
        trees = [None if st is None else DraftTree.empty(st.tokens.device) for st in states]
        rows = [r for r, st in enumerate(states) if st is not None and self.wants(r, st)]
        if not rows:
            return trees
        root = self.catch_up(rows, states)
        searches, requests = {}, {}
        for i, r in enumerate(rows):
            searches[r] = search(root[i], states[r], self.top_k, self.temperature, self.sampling,
                                 self.tree_temperature)
            self.slots[r] = []
            self._advance(r, searches, requests, trees, None)
        while requests:
            logits = self._level(requests)
            for r, rows_logits in logits.items():
                self._advance(r, searches, requests, trees, rows_logits)
        return trees

    def _advance(self, r: int, searches: dict, requests: dict, trees: list, logits) -> None:
        """Send lane r's search its forward's logits (None: start it); keep its next request or its tree."""
        try:
            requests[r] = next(searches[r]) if logits is None else searches[r].send(logits)
        except StopIteration as done:
            requests.pop(r, None)
            trees[r] = done.value

    def _level(self, requests: dict) -> dict[int, torch.Tensor]:
        """One draft forward answering every lane's pending request: {lane: (k, V) logits}."""
        n, pending, dev = len(self.drafters), self.cache.pending, self.device
        size = {r: req[0].numel() for r, req in requests.items()}
        if n == 1 and not self.compile:  # one sequence: the search's own block over its pending entries (None: a
            # chain, causal); static shapes leave padding entries among the pending ones, so they take the scatter
            (r, (_, _, own, depths)), = requests.items()
            self.slots[r] += list(range(pending, pending + size[r]))
            return self.run_nodes(requests, None if own is None else own[None].to(dev),
                                  None if own is None else (depths - 1)[None], size[r])
        q = max(size.values())
        block = torch.zeros(n, q, pending + q, dtype=torch.bool, device=dev)
        block[:, torch.arange(q), pending + torch.arange(q)] = True  # padding queries see themselves
        offsets = torch.zeros(n, q, dtype=torch.long, device=dev)
        for r in requests:  # each lane's columns: its earlier entries of this step, then its new ones
            self.slots[r] += list(range(pending, pending + size[r]))
        cols = torch.tensor([c for r in requests for c in self.slots[r]], dtype=torch.long, device=dev)  # 1 upload
        at = 0
        for r, (_, _, own, depths) in requests.items():
            k, width = size[r], len(self.slots[r])
            if own is None:  # a chain: each node sees every entry its lane ran before it, and itself
                own = torch.ones(k, width, dtype=torch.bool, device=dev).tril(width - k)
            block[r, :k].index_copy_(1, cols[at:at + width], own.to(dev))
            offsets[r, :k] = depths - 1  # the root sits at the lane's committed length - 1
            at += width
        return self.run_nodes(requests, block, offsets, q)

    def padded(self, per_row: dict, q: int, fill=0) -> torch.Tensor:
        """(L, q, ...) from {lane: (k, ...)} tensors, the rest `fill`."""
        some = next(iter(per_row.values()))
        if len(self.drafters) == 1 and some.shape[0] == q:  # one sequence: a view, no copy
            return some[None]
        out = torch.full((len(self.drafters), q, *some.shape[1:]), fill, dtype=some.dtype, device=self.device)
        for r, x in per_row.items():
            out[r, :x.shape[0]] = x
        return out


def joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat of the parts, without the copy when there is one part (a lane's usual step)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def compatible(drafters: list, model_attr: str) -> bool:
    """Drafters of one draft model (`model_attr` names it) and the same search settings."""
    first = drafters[0]
    return all(getattr(d, model_attr) is getattr(first, model_attr) and d.top_k == first.top_k
               and d.temperature == first.temperature and d.sampling == first.sampling
               and getattr(d, "tree_temperature", 1.0) == getattr(first, "tree_temperature", 1.0)
               and getattr(d, "compile_draft", False) == getattr(first, "compile_draft", False)
               for d in drafters)
