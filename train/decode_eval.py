"""Decoding with a freshly trained drafter on held-out prompts: the mean accepted length tau a recipe reports."""
from __future__ import annotations

import torch


@torch.no_grad()
def measure_tau(target, drafter, stream: torch.Tensor, prompts: int, new_tokens: int, prompt_len: int = 128) -> dict:
    """tau, per-depth acceptance and the mean tree size of `drafter` on `prompts` held-out prompts taken
    evenly from `stream`, greedy, with the drafter's own cap every step (a measure of the draft, not of the
    machine); and own_text_top1: the share of steps of a one-node draft whose node the target kept, i.e. the
    draft's top-1 agreement with the target on the text the target writes itself (held-out top-1 is measured on
    written text, which decoding never drafts over). {} when there is nothing to measure."""
    from draftkit.verify.budget import FixedBudget
    from draftkit.verify.contract import Budget
    from draftkit.verify.decode import generate

    if prompts < 1 or stream.numel() < prompt_len + 1:
        return {}
    stride = max(prompt_len, (stream.numel() - prompt_len) // prompts)
    stats = top1 = None
    for i in range(prompts):
        p = stream[i * stride: i * stride + prompt_len].long().to(target.device)
        if p.numel() < prompt_len:
            break
        out = generate(target, p, drafter=drafter, max_new_tokens=new_tokens, eos_token_id=[], budget="fixed")
        stats = out.stats if stats is None else stats.merge(out.stats)
        one = generate(target, p, drafter=drafter, max_new_tokens=new_tokens, eos_token_id=[],
                       budget=FixedBudget(Budget(1, 1)))
        top1 = one.stats if top1 is None else top1.merge(one.stats)
    if stats is None:
        return {}
    drafted = [s for s in top1.decode_steps if s.drafted]
    agreed = sum(s.accepted > 0 for s in drafted) / max(1, len(drafted))
    return {"tau": stats.tau, "acceptance_by_depth": stats.acceptance_by_depth(),
            "mean_tree_size": stats.mean_tree_size, "own_text_top1": agreed}
