"""Decoding with a freshly trained drafter on held-out prompts: the mean accepted length tau a recipe reports."""
from __future__ import annotations

import torch


def heldout_prompts(stream: torch.Tensor, prompts: int, prompt_len: int, device) -> list[torch.Tensor]:
    """Up to `prompts` prompts of `prompt_len` tokens taken evenly from the held-out `stream`."""
    if prompts < 1 or stream.numel() < prompt_len + 1:
        return []
    stride = max(prompt_len, (stream.numel() - prompt_len) // prompts)
    heads = [stream[i * stride: i * stride + prompt_len].long().to(device) for i in range(prompts)]
    return [p for p in heads if p.numel() == prompt_len]


@torch.no_grad()
def decode_stats(target, drafter, heads: list[torch.Tensor], new_tokens: int, budget="fixed"):
    """The merged statistics of `drafter` decoding each prompt greedily (`budget`: the drafter's own cap every
    step by default: a measure of the draft, not of the machine); None for no prompts."""
    from draftkit.verify.decode import generate

    stats = None
    for p in heads:
        out = generate(target, p, drafter=drafter, max_new_tokens=new_tokens, eos_token_id=[], budget=budget)
        stats = out.stats if stats is None else stats.merge(out.stats)
    return stats


@torch.no_grad()
def measure_tau(target, drafter, stream: torch.Tensor, prompts: int, new_tokens: int, prompt_len: int = 128) -> dict:
    """tau, per-depth acceptance and the mean tree size of `drafter` on `prompts` held-out prompts taken
    evenly from `stream`, greedy, with the drafter's own cap every step (a measure of the draft, not of the
    machine); and own_text_top1: the share of steps of a one-node draft whose node the target kept, i.e. the
    draft's top-1 agreement with the target on the text the target writes itself (held-out top-1 is measured on
    written text, which decoding never drafts over). {} when there is nothing to measure."""
    from draftkit.verify.budget import FixedBudget
    from draftkit.verify.contract import Budget

    heads = heldout_prompts(stream, prompts, prompt_len, target.device)
    if not heads:
        return {}
    stats = decode_stats(target, drafter, heads, new_tokens)
    top1 = decode_stats(target, drafter, heads, new_tokens, FixedBudget(Budget(1, 1)))
    drafted = [s for s in top1.decode_steps if s.drafted]
    agreed = sum(s.accepted > 0 for s in drafted) / max(1, len(drafted))
    return {"tau": stats.tau, "acceptance_by_depth": stats.acceptance_by_depth(),
            "mean_tree_size": stats.mean_tree_size, "own_text_top1": agreed}
