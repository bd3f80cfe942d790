"""The P-EAGLE training loss: every depth of the draft trained in one forward (Hui et al. 2026; the
conditional-drop-token (COD) sampling of vllm-project/speculators' `peagle`).

A training sequence of T tokens gives T - 2 EAGLE-3 pairs (f_t, x_{t+1}) at positions t (depth 1: each
predicts x_{t+2}). For depth d = 2 .. K, a subset A_d of anchors t gets a placeholder pair (mask_hidden,
emb(mask token)) at position t + d - 1 that predicts x_{t+d+1}, exactly what it is asked at decoding time.
A_d keeps about max(r^(d-1), r_min) of the anchors and is nested (A_d within A_{d-1}), so a placeholder's
chain of earlier placeholders always exists: the deep depths cost little (COD sampling). Attention: a pair
sees the pairs at or before it; a placeholder sees the pairs up to its anchor and its own chain's earlier
placeholders, as in the causal decoding forward. All depths share one forward; the loss is the
soft cross-entropy against the target's distribution (restricted to the draft vocabulary, on positions
whose target top-1 lies in it, as EagleLoss), averaged over every pair and placeholder the loss mask keeps.

Pure over a batch: forward(ids (B, T), loss_mask (B, T), hidden {layer: (B, T, H)}, last (B, T, H)).
"""
from __future__ import annotations

import torch
from torch import nn


def cod_anchors(n_pairs: int, depths: int, ratio: float, ratio_min: float,
                gen: torch.Generator | None = None) -> list[torch.Tensor]:
    """Anchor sets A_2 .. A_K (sorted long tensors) for pairs 0 .. n_pairs - 1: A_d is a random subset of
    A_{d-1} of about n * max(ratio^(d-1), ratio_min) anchors whose target x_{t+d+1} exists (t + d <= n_pairs)."""
    sets, prev = [], torch.arange(n_pairs)
    for d in range(2, depths + 1):
        cand = prev[prev + d <= n_pairs]
        keep = min(cand.numel(), int(n_pairs * max(ratio ** (d - 1), ratio_min)))
        if keep < 1:
            break
        prev = cand[torch.randperm(cand.numel(), generator=gen)[:keep]].sort().values
        sets.append(prev)
    return sets


def layout(n_pairs: int, anchor_sets: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(anchor (L,), depth (L,), allowed (L, L) bool) of the L = n_pairs + sum |A_d| elements: the pairs first
    (depth 1), then the placeholders by depth."""
    anchor = torch.cat([torch.arange(n_pairs)] + list(anchor_sets)).to(device)
    depth = torch.cat([torch.ones(n_pairs, dtype=torch.long)]
                      + [torch.full((a.numel(),), d + 2, dtype=torch.long)
                         for d, a in enumerate(anchor_sets)]).to(device)
    is_pair = depth == 1
    sees_pair = is_pair[None, :] & (anchor[None, :] <= anchor[:, None])  # pairs up to the element's anchor
    own_chain = (anchor[None, :] == anchor[:, None]) & (depth[None, :] <= depth[:, None])
    return anchor, depth, sees_pair | own_chain


class PEagleLoss(nn.Module):
    """The draft plus a frozen reference to the target's embedding and LM head (checkpoints hold the draft)."""

    def __init__(self, draft, target, depths: int, ratio: float = 0.7, ratio_min: float = 0.2):
        super().__init__()
        if depths < 1:
            raise ValueError(f"P-EAGLE trains depths >= 1, got {depths}")
        self.draft, self.depths, self.ratio, self.ratio_min = draft, depths, ratio, ratio_min
        self._frozen = (target.get_input_embeddings(), target.get_output_embeddings())

    def forward(self, ids, loss_mask, hidden: dict, last, gen: torch.Generator | None = None) -> dict:
        embed, head = self._frozen
        draft = self.draft
        b, t = ids.shape
        n = t - 2  # pairs (f_t, x_{t+1}) whose predicted token x_{t+2} is in the sequence: t = 0 .. T - 3
        anchor, depth, allowed = layout(n, cod_anchors(n, self.depths, self.ratio, self.ratio_min, gen), ids.device)
        pos = anchor + depth - 1  # (L,) the element's position
        pair = depth == 1
        feats = torch.cat([hidden[k] for k in draft.config.feature_layers], -1)[:, :n].float()  # (B, n, 3H)
        x = torch.cat([feats, draft.placeholders(int((~pair).sum())).float()[None].expand(b, -1, -1)], 1)
        tok = torch.where(pair, ids[:, (anchor + 1).clamp_max(t - 1)],
                          torch.full_like(anchor, draft.config.mask_token_id)[None])  # (B, L)
        mask = torch.zeros(allowed.shape, dtype=x.dtype, device=ids.device).masked_fill_(~allowed,
                                                                                         torch.finfo(x.dtype).min)
        out = draft(x, embed(tok).float(), attention_mask=mask[None, None], position_ids=pos[None])  # (B, L, H)
        logp = draft.draft_logits(out).float().log_softmax(-1)  # (B, L, Vd)
        goal = pos + 1  # the element predicts x_{pos + 2} from the target's distribution at pos + 1
        with torch.no_grad():  # the target's distributions, once per position (elements share positions)
            p_logits = head(last[:, 1:t - 1].to(head.weight.dtype)).float()  # (B, T - 2, V) at positions 1..T-2
            top = p_logits.argmax(-1)[:, goal - 1]  # (B, L)
            weight = loss_mask[:, goal + 1].float()
            ids_d = draft.vocab_ids()
            if ids_d is not None:  # the draft vocabulary: p restricted to it, where its top-1 lies in it
                weight = weight * draft.t2d[top].float()
                p_logits = p_logits[..., ids_d]
            p = p_logits.softmax(-1)[:, goal - 1]  # (B, L, Vd)
        ce = -(p * logp).sum(-1)  # (B, L)
        loss = (ce * weight).sum() / weight.sum().clamp_min(1.0)
        res = {"loss": loss}
        with torch.no_grad():
            pred = logp.argmax(-1) if ids_d is None else ids_d[logp.argmax(-1)]
            hit = (pred == top).float()
            for d in range(1, int(depth.max()) + 1):
                sel = depth == d
                w = weight[:, sel]
                res[f"acc_{d}"] = (hit[:, sel] * w).sum() / w.sum().clamp_min(1.0)
        return res


__all__ = ["PEagleLoss", "cod_anchors", "layout"]
