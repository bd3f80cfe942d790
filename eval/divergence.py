"""Telling a near-tie from a bug when a drafted greedy output differs from plain greedy decoding.

In fp32 every drafter's greedy output equals plain decoding token for token. In bf16 (or fp16) a tree verification
and a plain step run different kernel shapes, so a logit can round differently: where the target's top two tokens
lie within a few units in the last place, either output is the model's greedy choice. `first_divergence` finds the
first differing position, recomputes the target's logits there with one plain forward, and calls the difference a
near-tie when the two tokens' logits are within the dtype's tolerance (verify/tree_probe.probe_tolerance); anything
else is a MISMATCH, a bug to report.
"""
from __future__ import annotations

import torch

from draftkit.verify.tree_probe import probe_tolerance


def classify(logits: torch.Tensor, a: int, b: int, dtype: torch.dtype) -> dict:
    """logits (V,) at the first differing position; a, b the two outputs' tokens there."""
    logits = logits.float()
    gap = float((logits[a] - logits[b]).abs())
    tol = probe_tolerance(dtype, float(logits.abs().max()))
    below_top = float(logits.max() - torch.minimum(logits[a], logits[b]))  # both tokens sit at the top
    return {"gap": gap, "tolerance": tol, "near_tie": below_top <= tol}


@torch.no_grad()
def first_divergence(target, prompt: list[int], plain: list[int], other: list[int]) -> dict | None:
    """None when the outputs agree (up to the shorter one); else {position, tokens, gap, tolerance, near_tie}."""
    pos = next((i for i, (x, y) in enumerate(zip(plain, other)) if x != y), None)
    if pos is None:
        return None
    ids = torch.tensor(prompt + plain[:pos], device=target.device)[None]
    logits = target(input_ids=ids).logits[0, -1]
    return {"position": pos, "tokens": [plain[pos], other[pos]],
            **classify(logits, plain[pos], other[pos], target.dtype)}
