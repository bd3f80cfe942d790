"""EAGLE and P-EAGLE drafters of a batch's lanes drafting together (drafters/lanes.py): what goes in and
comes out.

Each lane's catch-up runs its kept positions' true target features through the draft (one forward for every
lane, ragged), and each level runs every lane's frontier nodes as (f^ of the parent, embedding of the token)
pairs; the draft's outputs extend each lane's bank, whose rows feed the next level and give the logits.
"""
from __future__ import annotations

import torch

from draftkit.drafters.lanes import DraftLanes, compatible, joined
from draftkit.drafters.tree_search import draft_from_depths
from draftkit.verify.contract import DecodeState, DraftTree
from draftkit.verify.tree import run_model


class EagleLanes(DraftLanes):
    """EagleDrafters of one draft model and the same settings, drafting as one group."""

    def __init__(self, drafters: list):
        first = drafters[0]
        if any(getattr(d, "todo", None) for d in drafters):
            raise ValueError("EAGLE lanes are formed right after the drafters' reset")
        self.draft, self.embed, self.logits, self.dtype = first.draft, first.embed, first._logits, first.dtype
        super().__init__(drafters, first.draft.cache_config.num_hidden_layers, first.dtype, first.device)  # last:
        # it may warm the draft

    @staticmethod
    def compatible(drafters: list) -> bool:
        return compatible(drafters, "draft") and all(d.head is drafters[0].head for d in drafters)

    def wants(self, r: int, state: DecodeState) -> bool:
        return super().wants(r, state) and bool(self.drafters[r].todo)

    def catch_up(self, rows: list[int], states: list) -> torch.Tensor:
        self._run_kept(rows, {})
        return self.logits(torch.cat([self.drafters[r].bank for r in rows]))

    def _run_kept(self, rows: list[int], extra: dict) -> tuple[torch.Tensor, dict]:
        """One causal draft forward over each drafting lane's kept pairs (true target features, the token after
        each), followed by its `extra` pairs ({lane: (features (m, nH), tokens (m,))}); the kept pairs' entries
        are committed, the extras' dropped. Returns the outputs (L, q, H) and each lane's kept count."""
        feats, nxt, k = {}, {}, {}
        for r in rows:
            d = self.drafters[r]
            pairs = d.todo + ([extra[r]] if r in extra else [])
            feats[r] = joined([f.to(self.dtype) for f, _ in pairs])  # (k_r + m_r, nH)
            nxt[r] = joined([x for _, x in pairs])
            k[r] = sum(x.numel() for _, x in d.todo)
        q = max(x.numel() for x in nxt.values())
        causal = None if len(self.drafters) == 1 else torch.ones(q, q, dtype=torch.bool, device=self.device).tril()
        out = run_model(self.draft, self.cache, self.masks, causal, None if causal is None else
                        torch.arange(q, device=self.device), self.compile, features=self.padded(feats, q),
                        embeds=self.embed(self.padded(nxt, q)))
        self.cache.commit([list(range(k[r])) if r in k else [] for r in range(len(self.drafters))])
        for r in rows:
            d = self.drafters[r]
            d.todo, d.bank = [], out[r, k[r] - 1:k[r]]  # bank row 0: f^ at the root
        return out, k

    @property
    def draft_model(self):
        return self.draft

    def warm_inputs(self, n: int, b: int) -> list[dict]:
        """The catch-up's joined target features (one layer's width per feature layer) and the levels' draft
        outputs (one layer's width): one kind for EAGLE-1/2, two for EAGLE-3."""
        width = self.embed.weight.shape[1]
        embeds = self.embed(torch.zeros(n, b, dtype=torch.long, device=self.device))
        return [dict(features=torch.zeros(n, b, k * width, dtype=self.dtype, device=self.device), embeds=embeds)
                for k in sorted({len(self.drafters[0].hidden_layers), 1})]

    def run_nodes(self, requests: dict, block: torch.Tensor, offsets: torch.Tensor, q: int) -> dict:
        banks = {r: self.drafters[r].bank for r in requests}
        feats = self.padded({r: banks[r][req[1] + 1] for r, req in requests.items()}, q)  # f^ of each parent
        ids = self.padded({r: req[0] for r, req in requests.items()}, q)
        out = run_model(self.draft, self.cache, self.masks, block, offsets, self.compile, features=feats,
                        embeds=self.embed(ids))
        size = {r: req[0].numel() for r, req in requests.items()}
        for r in requests:
            self.drafters[r].bank = torch.cat([banks[r], out[r, :size[r]]])
        logits = self.logits(torch.cat([out[r, :size[r]] for r in requests]))  # one head call for every lane
        return dict(zip(requests, logits.split(list(size.values()))))


class PEagleLanes(EagleLanes):
    """P-EAGLE drafters (drafters/peagle.py) of one draft: each drafting lane's kept pairs and its depth - 1
    placeholder pairs, every lane in ONE causal draft forward; each lane's chain or tree is cut from its own
    per-depth logits (the root's output and the placeholders')."""

    def __init__(self, drafters: list):
        super().__init__(drafters)
        self.mask_token = torch.tensor([self.draft.config.mask_token_id], device=self.device)  # (1,)

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None]) -> list[DraftTree]:
        trees = [None if st is None else DraftTree.empty(st.tokens.device) for st in states]
        rows = [r for r, st in enumerate(states) if st is not None and self.wants(r, st)]
        if not rows:
            return trees
        depth = {r: min(states[r].budget.max_depth, states[r].budget.max_nodes) for r in rows}
        extra = {r: (self.draft.placeholders(depth[r] - 1), self.mask_token.expand(depth[r] - 1)) for r in rows}
        out, k = self._run_kept(rows, extra)
        for r in rows:  # the root's output (depth 1), then each placeholder's (depths 2 ..)
            logits = self.logits(out[r, k[r] - 1:k[r] - 1 + depth[r]])
            trees[r] = draft_from_depths(logits, states[r], self.top_k, self.temperature, self.sampling,
                                         self.tree_temperature)
        return trees
