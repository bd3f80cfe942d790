"""Decoding with a freshly trained drafter on held-out prompts: the mean accepted length tau a recipe reports."""
from __future__ import annotations

import torch


@torch.no_grad()
def measure_tau(target, drafter, stream: torch.Tensor, prompts: int, new_tokens: int, prompt_len: int = 128) -> dict:
    """tau, per-depth acceptance and the mean tree size of `drafter` on `prompts` held-out prompts taken
    evenly from `stream`, greedy, with the drafter's own cap every step (a measure of the draft, not of the
    machine). {} when there is nothing to measure."""
    from draftkit.verify.decode import generate

    if prompts < 1 or stream.numel() < prompt_len + 1:
        return {}
    stride = max(prompt_len, (stream.numel() - prompt_len) // prompts)
    stats = None
    for i in range(prompts):
        p = stream[i * stride: i * stride + prompt_len].long()
        if p.numel() < prompt_len:
            break
        out = generate(target, p.to(target.device), drafter=drafter, max_new_tokens=new_tokens, eos_token_id=[],
                       budget="fixed")
        stats = out.stats if stats is None else stats.merge(out.stats)
    if stats is None:
        return {}
    return {"tau": stats.tau, "acceptance_by_depth": stats.acceptance_by_depth(), "mean_tree_size": stats.mean_tree_size}
