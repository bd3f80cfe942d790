"""The DFlash training loss (Chen et al. 2026; z-lab/dflash; vllm-project/speculators' `dflash`).

Blocks are cut at random anchors a of each training sequence: block = [x_a, mask, ..., mask] (B positions,
a .. a + B - 1), the same input the drafter sees at decoding time with x_a as the root. The context is the
fused target layers at positions < a only (at decoding time the root has no target features yet). Every
mask position is masked at once: the noise schedule is the fully masked block, denoised in one step, which
is how the block is drafted. All anchors of a sequence share one forward: each block attends to the
sequence's context before its anchor and, non-causally, to its own block, never to another block.

Slot j >= 1 predicts x_{a+j}; its label is the target's distribution there, p = softmax(lm_head(last[a+j-1])),
and its loss the soft cross-entropy CE(p, q_j) weighted by exp(-(j - 1) / gamma) (the early slots decide
the accepted length, so they weigh most) and by the loss mask of x_{a+j}.

Pure over a batch: forward(ids (B, T), loss_mask (B, T), hidden {layer: (B, T, H)}, last (B, T, H)).
"""
from __future__ import annotations

import torch
from torch import nn


def pick_anchors(loss_mask: torch.Tensor, block: int, count: int, gen: torch.Generator | None = None) -> torch.Tensor:
    """(B, n) sorted anchors in 1 .. T - block per row, drawn without replacement among those whose first
    predicted token is trained on (any anchor when a row has none); n = min(count, T - block)."""
    b, t = loss_mask.shape
    n = min(count, t - block)
    if n < 1:
        raise ValueError(f"sequences of {t} tokens hold no DFlash block of {block}: seq_len must exceed block_size")
    weight = loss_mask[:, 2:t - block + 2].float() + 1e-6  # anchor a = 1 .. T - block; its slot 1 is x_{a+1}
    return (torch.multinomial(weight, n, generator=gen) + 1).sort(-1).values


def block_mask(anchors: torch.Tensor, seq_len: int, block: int) -> torch.Tensor:
    """(B, 1, nB, T + nB) bool with nB = n * block: block i sees context positions < anchors[:, i] and its own
    block."""
    b, n = anchors.shape
    q = n * block
    owner = torch.arange(q, device=anchors.device) // block  # (q,) the block of each query
    ctx = torch.arange(seq_len, device=anchors.device)[None, None, :] < anchors[:, owner, None]  # (B, q, T)
    own = (owner[:, None] == owner[None, :]).expand(b, q, q)
    return torch.cat([ctx, own], -1)[:, None]


class DFlashLoss(nn.Module):
    """The draft plus a frozen reference to the target's embedding and LM head (checkpoints hold the draft)."""

    def __init__(self, draft, target, anchors: int = 16, gamma: float = 4.0):
        super().__init__()
        self.draft, self.anchors, self.gamma = draft, anchors, gamma
        self._frozen = (target.get_input_embeddings(), target.get_output_embeddings())

    def forward(self, ids, loss_mask, hidden: dict, last, gen: torch.Generator | None = None) -> dict:
        embed, head = self._frozen
        draft, block = self.draft, self.draft.config.block_size
        b, t = ids.shape
        anchors = pick_anchors(loss_mask, block, self.anchors, gen)  # (B, n)
        slots = torch.arange(block, device=ids.device)
        where = (anchors[:, :, None] + slots).flatten(1)  # (B, n * block) each query's position
        tokens = torch.full_like(where, draft.config.mask_token_id)
        tokens[:, ::block] = ids.gather(1, anchors)  # slot 0: the anchor token (the root)
        feats = draft.fuse([hidden[k] for k in draft.config.target_layers]).float()  # (B, T, nH)
        ctx_pos = torch.arange(t, device=ids.device)[None].expand(b, -1)
        out = draft(embed(tokens).float(), where, feats, ctx_pos, mask=block_mask(anchors, t, block))
        logq = head(out.to(head.weight.dtype)).float().log_softmax(-1)  # (B, nB, V)
        with torch.no_grad():
            p = head(last.gather(1, (where - 1)[..., None].expand(-1, -1, last.shape[-1])).to(head.weight.dtype))
            p = p.float().softmax(-1)  # the target's distribution of the token at each query position
            j = slots.repeat(anchors.shape[1])  # (nB,) slot of each query
            decay = torch.where(j > 0, torch.exp(-(j - 1).float() / self.gamma), torch.zeros((), device=ids.device))
            weight = decay[None] * loss_mask.gather(1, where).float()  # (B, nB); slot 0 predicts nothing
        ce = -(p * logq).sum(-1)
        res = {"loss": (ce * weight).sum() / weight.sum().clamp_min(1e-6)}
        with torch.no_grad():
            hit = (logq.argmax(-1) == p.argmax(-1)).float()
            trained = loss_mask.gather(1, where).float()
            chain = torch.ones(b, anchors.shape[1], device=ids.device)
            eal = torch.zeros((), device=ids.device)
            for s in range(1, block):
                sel = j == s
                res[f"acc_{s}"] = (hit[:, sel] * trained[:, sel]).sum() / trained[:, sel].sum().clamp_min(1.0)
                chain = chain * hit[:, sel]  # a block's drafts all right up to slot s
                eal = eal + chain.mean()
            res["accepted_length"] = eal  # greedy drafts the target would keep per block (top-1 agreement)
        return res


__all__ = ["DFlashLoss", "block_mask", "pick_anchors"]
