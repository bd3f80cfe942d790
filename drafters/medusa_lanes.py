"""The Medusa drafters of a batch's lanes running their heads together: one call for every drafting lane.

Alone, each lane runs its heads on its own root hidden state: per head a residual block and a vocabulary
projection of one row, so at batch 8 the projections' weights (4 x 8192 x 192 for the shipped heads) are read
eight times a step and the heads cost more than the tokens they win. Together, the drafting lanes' hidden states
are stacked, (L, H), and each head runs once over them: one matrix product reads its weights once. Only the
heads the deepest lane's tree needs run. Each lane then builds its own tree from its row of the logits, exactly
as it would alone (the same layout, the same ranks or draws), so the trees are the lanes' own (tested). With
compile_draft the rows are padded to the group's size, whose graphs compile when the group forms
(drafters/medusa_static.py).
"""
from __future__ import annotations

import torch

from draftkit.verify.contract import DecodeState, DraftTree


class MedusaLanes:
    """Medusa drafters sharing one MedusaHeads, proposing together (verify/lanes.py DraftLanes)."""

    def __init__(self, drafters: list):
        self.drafters = drafters
        drafters[0].warm(len(drafters))  # compile_draft: every graph of this group, before the first step

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None]) -> list[DraftTree]:
        trees = [None if st is None else DraftTree.empty(st.tokens.device) for st in states]
        depth = {r: self.drafters[r].wants(st) for r, st in enumerate(states) if st is not None}
        rows = [r for r, n in depth.items() if n]
        if not rows:
            return trees
        hidden = torch.stack([self.drafters[r].hidden_on_heads() for r in rows])  # (L, H)
        logits = self.drafters[0].head_logits(hidden, max(depth[r] for r in rows), len(self.drafters))  # (n, L, V)
        for i, r in enumerate(rows):
            trees[r] = self.drafters[r].tree(logits[:, i], states[r])
        return trees
