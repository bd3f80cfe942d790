"""The EAGLE drafters of a batch's lanes, drafting together: one draft forward per level for every lane.

Alone, each lane's drafter runs its own forwards (the catch-up on the kept positions, then one per tree
level): at batch 8 that is 8 x (1 + depth) small forwards a step, one lane after another, and EAGLE's
drafting was paid eight times (batch 8: 0.89x of plain batched decoding at tau 3.57). Together, the lanes'
draft caches are the rows of ONE KV buffer (verify/cache.py: a row per lane, ragged lengths) and each level
of every lane's search (drafters/tree_search.py: a generator of forward requests) is answered by one
forward over all rows:

    row r:   [ lane r's committed pairs ][ this step's entries: every forward's q columns ][ garbage ]
    forward: q = the most nodes any lane asks for at this level; a lane asking for k < q nodes (or none)
             fills the rest with padding queries that see only themselves

A lane's own rows of a step sit at the pending offsets of the forwards it took part in (`slots`), so its
search's block (over its own run rows) is scattered to those columns. Padding entries are never visible to
a real query and are dropped with the rest of the step's entries by the next update. Greedy trees are the
trees each lane would draft alone (the same forwards, batched; tested).
"""
from __future__ import annotations

import torch

from draftkit.drafters.tree_search import search
from draftkit.verify.cache import KVBuffer
from draftkit.verify.contract import DecodeState, DraftTree
from draftkit.verify.forward import run_model
from draftkit.verify.tree import MaskBuffer


class EagleLanes:
    """EagleDrafters of one draft model (and the same settings) drafting as one group (verify/contract.py
    DraftLanes). Built after the lanes' reset; a drafter's next reset takes it back to its own cache."""

    def __init__(self, drafters: list):
        first = drafters[0]
        self.drafters = drafters
        self.draft, self.embed, self.device = first.draft, first.embed, first.device
        self.top_k, self.temperature, self.sampling = first.top_k, first.temperature, first.sampling
        self.masks = MaskBuffer(first.dtype, self.device)
        self.cache = KVBuffer(num_layers=1, batch_size=len(drafters), capacity=max(
            max(d.cache.capacity for d in drafters), 256))
        self.slots: dict[int, list[int]] = {}  # per drafting lane: the pending offsets of its rows this step
        for d in drafters:
            if d.cache.lengths[0] or d.todo:
                raise ValueError("EAGLE lanes are formed right after the drafters' reset")
            d.cache = self.cache  # their update drops the step's entries of every row at once

    @staticmethod
    def compatible(drafters: list) -> bool:
        first = drafters[0]
        return all(d.draft is first.draft and d.head is first.head and d.embed is first.embed
                   and d.top_k == first.top_k and d.temperature == first.temperature
                   and d.sampling == first.sampling for d in drafters)

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None]) -> list[DraftTree]:
        rows = [r for r, (d, st) in enumerate(zip(self.drafters, states))
                if st is not None and min(st.budget.max_depth, st.budget.max_nodes) >= 1 and d.todo]
        trees = [None if st is None else DraftTree.empty(st.tokens.device) for st in states]
        if not rows:
            return trees
        self._catch_up(rows)
        root = self.drafters[0]._logits(torch.cat([self.drafters[r].bank for r in rows]))  # (len(rows), V)
        searches, requests = {}, {}
        for i, r in enumerate(rows):
            searches[r] = search(root[i], states[r], self.top_k, self.temperature, self.sampling)
            self.slots[r] = []
            self._advance(r, searches, requests, trees, None)
        while requests:
            outs = self._level(requests)
            logits = self.drafters[0]._logits(torch.cat(list(outs.values())))
            at = 0
            for r, out in outs.items():
                self._advance(r, searches, requests, trees, logits[at:at + out.shape[0]])
                at += out.shape[0]
        return trees

    def _advance(self, r: int, searches: dict, requests: dict, trees: list, logits) -> None:
        """Send lane r's search its forward's logits (None: start it); keep its next request or its tree."""
        try:
            requests[r] = next(searches[r]) if logits is None else searches[r].send(logits)
        except StopIteration as done:
            requests.pop(r, None)
            trees[r] = done.value

    def _catch_up(self, rows: list[int]) -> None:
        """Every drafting lane's kept positions (their true target features) through the draft in one forward;
        they are committed, and each lane's last output is the features at its root (bank row 0)."""
        todo = {r: self.drafters[r].todo for r in rows}
        feats = {r: torch.cat([f for f, _ in t]) for r, t in todo.items()}
        nxt = {r: torch.cat([x for _, x in t]) for r, t in todo.items()}
        k = {r: nxt[r].numel() for r in rows}
        q, n = max(k.values()), len(self.drafters)
        width = next(iter(feats.values())).shape[-1]
        x = torch.zeros(n, q, width, dtype=next(iter(feats.values())).dtype, device=self.device)
        ids = torch.zeros(n, q, dtype=torch.long, device=self.device)
        for r in rows:
            x[r, :k[r]], ids[r, :k[r]] = feats[r], nxt[r]
        causal = torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        offsets = torch.arange(q, device=self.device)
        out = run_model(self.draft, self.cache, self.masks, causal, offsets, features=x, embeds=self.embed(ids))
        self.cache.commit([list(range(k[r])) if r in k else [] for r in range(n)])
        for r in rows:
            d = self.drafters[r]
            d.todo, d.bank = [], out[r, k[r] - 1:k[r]]

    def _level(self, requests: dict) -> dict[int, torch.Tensor]:
        """One draft forward answering every lane's pending request: {lane: (k, H) outputs}."""
        n, pending = len(self.drafters), self.cache.pending
        size = {r: req[0].numel() for r, req in requests.items()}
        q = max(size.values())
        dev = self.device
        block = torch.zeros(n, q, pending + q, dtype=torch.bool, device=dev)
        block[:, torch.arange(q), pending + torch.arange(q)] = True  # padding queries see themselves
        offsets = torch.zeros(n, q, dtype=torch.long, device=dev)
        bank = self.drafters[next(iter(requests))].bank  # (rows, H) of a lane that drafts (lane 0 may not)
        feats = torch.zeros(n, q, bank.shape[-1], dtype=bank.dtype, device=dev)
        ids = torch.zeros(n, q, dtype=torch.long, device=dev)
        for r, (tokens, parent_rows, own, depths) in requests.items():
            d, k, slots = self.drafters[r], size[r], self.slots[r]
            e = len(slots)
            if own is None:  # a chain: each node sees every row its lane ran before it, and itself
                own = torch.ones(k, e + k, dtype=torch.bool, device=dev).tril(e)
            cols = torch.tensor(slots + list(range(pending, pending + k)), dtype=torch.long, device=dev)
            block[r, :k].index_copy_(1, cols, own.to(dev))
            offsets[r, :k] = depths - 1  # the root sits at the lane's committed length - 1
            feats[r, :k] = d.bank[parent_rows + 1]
            ids[r, :k] = tokens
            slots += list(range(pending, pending + k))
        out = run_model(self.draft, self.cache, self.masks, block, offsets, features=feats, embeds=self.embed(ids))
        result = {}
        for r in requests:
            d, k = self.drafters[r], size[r]
            d.bank = torch.cat([d.bank, out[r, :k]])
            result[r] = out[r, :k]
        return result
