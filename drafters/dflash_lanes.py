"""DFlash drafters drafting together: one block forward for every drafting lane of a batch, and the same
path for one sequence (a group of one).

Alone, each lane runs its own block forward (drafters/dflash.py) one after another, so at batch 4 a step pays
the draft four times (DFlash: 1.09x of plain batched decoding at tau 2.15, against 1.57x for one sequence).
Together, the lanes' contexts are the rows of one ContextCache and one forward runs every lane's block:

    row r:   context [ lane r's committed entries | this step's new entries (k_r) | padding ]
             block   [ root_r, mask, ..., mask ]
    feats:   (L, k, nH), k = the most new entries any lane brings; a row's padding past k_r is never stored
    mask:    (L, 1, 1, C + B): row r's block sees its own context (C = the longest row) and its whole block;
             None when every row's context has the same length (one sequence)

A lane that does not draft this step keeps its new entries for later; its row runs on padding and its output
is dropped. Each block position's distribution depends on its own row only, so every lane's tree is the one
it would draft alone. With compile_draft the contexts live in fixed-size buffers instead and the forward has static
shapes (drafters/dflash_static.py); the trees are the same.
"""
from __future__ import annotations

import torch

from draftkit.drafters.dflash import ContextCache
from draftkit.drafters.dflash_static import StaticContext, run_static, static_inputs, warm as warm_static
from draftkit.drafters.lanes import joined
from draftkit.drafters.tree_search import draft_from_depths
from draftkit.verify.contract import DecodeState, DraftTree


class DFlashLanes:
    """DFlashDrafters of one draft and the same settings (verify/lanes.py DraftLanes); built right after the drafters'
    reset. Each drafter's `cache` becomes the group's (its row r)."""

    def __init__(self, drafters: list):
        first = drafters[0]
        if any(d.todo for d in drafters):
            raise ValueError("DFlash lanes are formed right after the drafters' reset")
        self.drafters = drafters
        self.draft, self.embed, self.head, self.device = first.draft, first.embed, first.head, first.device
        self.top_k, self.temperature, self.sampling = first.top_k, first.temperature, first.sampling
        self.tree_temperature = first.tree_temperature  # the lanes share one draft, so one value
        config = first.draft.config
        self.mask_id, self.block, self.window = config.mask_token_id, config.block_size, config.attention_window
        self.compile = bool(getattr(first, "compile_draft", False))  # static buffers (drafters/dflash_static.py)
        if self.compile:
            lc = first.draft.layer_config
            self.cache = StaticContext(config.draft_layers, len(drafters), lc.num_key_value_heads, lc.head_dim,
                                       first.draft.fc.weight.dtype, self.device)
            self.cache.reserve(max(d.reserve for d in drafters))
        else:
            self.cache = ContextCache(config.draft_layers, lanes=len(drafters))
        for d in drafters:
            d.cache = self.cache
        if self.compile and len(drafters) > 1:  # a batch's lanes form before its first step
            self.warm()

    def reset(self, reserve: int, warm: bool) -> None:
        """A group of one, for its drafter's next sequence: empty, with room for `reserve` context entries; warm:
        compile_draft's graphs for it now (static buffers are kept, so a later sequence reuses them)."""
        self.cache.reset(reserve)
        self.drafters[0].cache = self.cache
        if warm:
            self.warm()

    def warm(self) -> None:
        if self.compile:
            warm_static(self.draft, self.cache, self.embed, self.block, self.mask_id)

    @torch.no_grad()
    def propose(self, states: list[DecodeState | None]) -> list[DraftTree]:
        trees = [None if st is None else DraftTree.empty(st.tokens.device) for st in states]
        rows = [r for r, st in enumerate(states) if st is not None and self.drafters[r].todo
                and min(st.budget.max_depth, st.budget.max_nodes) >= 1]
        if not rows:
            return trees
        feats = self._take_new(rows, states)
        counts = [feats[r].shape[0] if r in feats else 0 for r in range(len(self.drafters))]
        after = [n + c for n, c in zip(self.cache.lengths, counts)]
        roots = [states[r].tokens.numel() - 1 if r in feats else n for r, n in enumerate(after)]
        ids = torch.full((len(self.drafters), self.block), self.mask_id, dtype=torch.long, device=self.device)
        for r in rows:
            ids[r, 0] = states[r].tokens[-1]
        out = self._static(ids, feats, counts, roots) if self.compile else self._eager(ids, feats, counts, roots)
        picked = out[:, 1:] if len(rows) == len(states) else out[rows, 1:]
        logits = self.head(picked.to(self.head.weight.dtype))  # (R, B - 1, V): depth j at row j - 1
        for i, r in enumerate(rows):
            trees[r] = draft_from_depths(logits[i], states[r], self.top_k, self.temperature, self.sampling,
                                         self.tree_temperature)
        return trees

    def _take_new(self, rows: list[int], states: list) -> dict[int, torch.Tensor]:
        """{lane: (k_r, nH) the fused target layers of its kept positions the draft has not seen}, taken."""
        feats = {}
        for r in rows:
            d = self.drafters[r]
            feats[r], d.todo = joined(d.todo), []
            root = states[r].tokens.numel() - 1  # the context ends right before the root
            if self.cache.lengths[r] + feats[r].shape[0] != root:
                raise RuntimeError(f"DFlash context out of step: {self.cache.lengths[r] + feats[r].shape[0]} "
                                   f"positions for a root at {root}")
        return feats

    def _eager(self, ids, feats: dict, counts: list[int], roots: list[int]) -> torch.Tensor:
        """The one block forward on the growing ContextCache: (L, B, H)."""
        after = self.cache.expect(counts)
        positions, ctx, ctx_positions, mask = self._inputs(feats, roots, after)
        return self.draft(self.embed(ids), positions, ctx, ctx_positions, self.cache, mask)

    def _static(self, ids, feats: dict, counts: list[int], roots: list[int]) -> torch.Tensor:
        """The one block forward on static buffers (drafters/dflash_static.py): (L, B, H)."""
        self.cache.reserve(max(n + c for n, c in zip(self.cache.lengths, counts)))
        inputs = static_inputs(self.cache, counts, self._padded(feats), roots, self.block, self.window)
        out = run_static(self.draft, self.cache, self.embed(ids), inputs, self.compile)
        self.cache.lengths = [n + c for n, c in zip(self.cache.lengths, counts)]
        return out

    def _padded(self, feats: dict) -> torch.Tensor:
        """(L, k, nH) of every lane's new entries, zeros past a lane's own (none for one sequence)."""
        if len(self.drafters) == 1:
            return feats[0][None]
        k = max(f.shape[0] for f in feats.values())
        some = next(iter(feats.values()))
        ctx = some.new_zeros(len(self.drafters), k, some.shape[-1])
        for r, f in feats.items():
            ctx[r, :f.shape[0]] = f
        return ctx

    def _inputs(self, feats: dict, roots: list[int], after: list[int]):
        """The block's positions (L, B); the new context (L, k, nH), its positions (L, k); the mask (L, 1, 1, C + B)
        bool (row r sees its own context and its whole block), None when every row's context has the same length.
        One host->device copy for a batch, none for one sequence."""
        n, b, dev = len(self.drafters), self.block, self.device
        k = max(f.shape[0] for f in feats.values())
        if n == 1:
            root, start = roots[0], self.cache.lengths[0]
            return (torch.arange(root, root + b, device=dev)[None], feats[0][None],
                    torch.arange(start, start + k, device=dev)[None], None)
        base = torch.tensor([roots, self.cache.lengths, after], dtype=torch.long).to(dev)  # one upload
        mask = None
        if len(set(after)) > 1:
            seen = torch.arange(max(after), device=dev)[None] < base[2, :, None]  # (L, C)
            mask = torch.cat([seen, seen.new_ones(n, b)], 1)[:, None, None, :]
        return (base[0, :, None] + torch.arange(b, device=dev), self._padded(feats),
                base[1, :, None] + torch.arange(k, device=dev), mask)
