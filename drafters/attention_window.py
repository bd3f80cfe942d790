"""The drafts' attention window when decoding (EagleConfig / DFlashConfig `attention_window`): a draft trained on
rows of seq_len tokens never met a key further back than that, so its own attention hides the keys more than the
window back. Draft caches hold position c at column c, so "far back" is a comparison of column and position.
Nothing is computed while the widest row is inside the window (a host-int check: no sync)."""
from __future__ import annotations

import torch


def far_back(width: int, positions: torch.Tensor, window: int) -> torch.Tensor:
    """(..., width) bool: column c (position c) is `window` or more positions before each of `positions` (...)."""
    return torch.arange(width, device=positions.device) <= positions[..., None] - window


def windowed(mask: torch.Tensor | None, position_ids: torch.Tensor, keys: int, window: int) -> torch.Tensor | None:
    """`mask` (B, 1, Q, K) bool or additive, or None for plain causal attention over K = `keys` columns, with
    the columns far back from each query's position (position_ids (B, Q)) hidden; this step's columns lie after
    the committed ones, inside the window."""
    width = mask.shape[-1] if mask is not None else keys
    if width <= window:  # the widest query sits at width - 1 at most: nothing is that far back
        return mask
    far = far_back(width, position_ids[:, None], window)  # (B, 1, Q, K)
    if mask is None:
        return (torch.arange(width, device=position_ids.device) <= position_ids[:, None, :, None]) & ~far
    return mask & ~far if mask.dtype == torch.bool else mask.masked_fill(far, torch.finfo(mask.dtype).min)
