"""EAGLE drafters of a batch's lanes drafting together (drafters/lanes.py): what goes in and comes out.

Each lane's catch-up runs its kept positions' true target features through the draft (one forward for every
lane, ragged), and each level runs every lane's frontier nodes as (f^ of the parent, embedding of the token)
pairs; the draft's outputs extend each lane's bank, whose rows feed the next level and give the logits.
"""
from __future__ import annotations

import torch

from draftkit.drafters.lanes import DraftLanes, compatible
from draftkit.verify.contract import DecodeState
from draftkit.verify.forward import run_model


class EagleLanes(DraftLanes):
    """EagleDrafters of one draft model and the same settings, drafting as one group."""

    def __init__(self, drafters: list):
        first = drafters[0]
        if any(getattr(d, "todo", None) for d in drafters):
            raise ValueError("EAGLE lanes are formed right after the drafters' reset")
        super().__init__(drafters, 1, first.dtype, first.device)
        self.draft, self.embed, self.logits = first.draft, first.embed, first._logits

    @staticmethod
    def compatible(drafters: list) -> bool:
        return compatible(drafters, "draft") and all(d.head is drafters[0].head for d in drafters)

    def wants(self, r: int, state: DecodeState) -> bool:
        return super().wants(r, state) and bool(self.drafters[r].todo)

    def catch_up(self, rows: list[int], states: list) -> torch.Tensor:
        todo = {r: self.drafters[r].todo for r in rows}
        feats = {r: torch.cat([f for f, _ in t]) for r, t in todo.items()}  # (k_r, nH) true target features
        nxt = {r: torch.cat([x for _, x in t]) for r, t in todo.items()}  # (k_r,) the token after each
        k = {r: nxt[r].numel() for r in rows}
        q = max(k.values())
        causal = None if len(self.drafters) == 1 else torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        out = run_model(self.draft, self.cache, self.masks, causal, None if causal is None else
                        torch.arange(q, device=self.device), features=self.padded(feats, q),
                        embeds=self.embed(self.padded(nxt, q)))
        self.cache.commit([list(range(k[r])) if r in k else [] for r in range(len(self.drafters))])
        for r in rows:
            d = self.drafters[r]
            d.todo, d.bank = [], out[r, k[r] - 1:k[r]]  # bank row 0: f^ at the root
        return self.logits(torch.cat([self.drafters[r].bank for r in rows]))

    def run_nodes(self, requests: dict, block: torch.Tensor, offsets: torch.Tensor, q: int) -> dict:
        banks = {r: self.drafters[r].bank for r in requests}
        feats = self.padded({r: banks[r][req[1] + 1] for r, req in requests.items()}, q)  # f^ of each parent
        ids = self.padded({r: req[0] for r, req in requests.items()}, q)
        out = run_model(self.draft, self.cache, self.masks, block, offsets, features=feats, embeds=self.embed(ids))
        size = {r: req[0].numel() for r, req in requests.items()}
        for r in requests:
            self.drafters[r].bank = torch.cat([banks[r], out[r, :size[r]]])
        logits = self.logits(torch.cat([out[r, :size[r]] for r in requests]))  # one head call for every lane
        return dict(zip(requests, logits.split(list(size.values()))))
