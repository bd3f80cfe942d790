"""Acceptance rules: which draft nodes the target keeps, and the bonus token.

Glossary (as in the papers): p is the target distribution at a tree slot, q the
distribution a draft node was drawn from. Accepted tokens are draft nodes the
target kept; the bonus token is the one token the target adds after them.

- greedy: follow the child equal to argmax p; stop at the first slot with no
  matching child and emit argmax p there.
- exact (lossless sampling, SpecInfer / EAGLE multi-draft): at a slot, try its
  children in order, accept child x with probability min(1, p(x) / q(x)); after
  a rejection p <- normalize(max(p - q, 0)); when no child is accepted the bonus
  is drawn from what remains of p. With q one-hot (deterministic drafts) this is
  "accept x with probability p(x), else zero p(x) and renormalize".
- typical (Medusa): accept x if p(x) > min(eps, delta * exp(-H(p))). LOSSY: the
  output no longer follows the target distribution; opt-in only.

Logits arrive as (n + 1, V): row 0 is the root's slot, row i + 1 node i's.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from drafters.base import DraftTree


@dataclass
class Sampling:
    """How tokens are chosen. temperature 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    acceptance: str = "exact"  # "exact" (lossless) or "typical" (Medusa, lossy)
    typical_eps: float = 0.09
    typical_delta: float = 0.3

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.acceptance not in ("exact", "typical"):
            raise ValueError(f"acceptance must be 'exact' or 'typical', got {self.acceptance!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def lossless(self) -> bool:
        return self.acceptance == "exact"


def target_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """(R, V) logits -> (R, V) p after temperature, top-k and top-p, in that order
    (the order transformers' sampling applies them). Plain sampling uses this too."""
    logits = logits.float() / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1)  # ascending
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum <= 1 - s.top_p
        drop_sorted[..., -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def greedy_accept(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest path matching argmax p, then the bonus argmax p. Returns (node indices, bonus)."""
    best = logits.argmax(-1).tolist()  # one sync for the whole tree
    tokens = tree.tokens.tolist()
    children, slot, accepted = tree.children, 0, []
    while True:
        want = best[slot]
        nxt = next((c for c in children[slot] if tokens[c - 1] == want), None)
        if nxt is None:
            return accepted, want
        accepted.append(nxt - 1)
        slot = nxt


def _draw(p: torch.Tensor, gen: torch.Generator | None) -> int:
    return int(torch.multinomial(p, 1, generator=gen))


def sample_accept(tree: DraftTree, p_all: torch.Tensor, gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """Lossless multi-draft speculative sampling over the tree. p_all is (n + 1, V)."""
    tokens = tree.tokens.tolist()
    children, slot, accepted = tree.children, 0, []
    while True:
        p = p_all[slot]
        nxt = None
        for c in children[slot]:
            x = tokens[c - 1]
            q = None if tree.q is None else tree.q[c - 1].float()
            ratio = p[x] if q is None else p[x] / q[x].clamp_min(1e-20)
            if torch.rand((), generator=gen) < ratio:
                nxt = c
                break
            residual = p.clone() if q is None else (p - q).clamp_min(0)
            if q is None:
                residual[x] = 0
            total = residual.sum()
            # total == 0 only if p == q, where rejection has probability 0; keep p then.
            p = residual / total if total > 0 else p
        if nxt is None:
            return accepted, _draw(p, gen)
        accepted.append(nxt - 1)
        slot = nxt


def typical_accept(tree: DraftTree, p_all: torch.Tensor, s: Sampling,
                   gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """Medusa's typical acceptance (lossy): most likely child above the entropy threshold."""
    entropy = -(p_all * p_all.clamp_min(1e-20).log()).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, s.typical_eps), s.typical_delta * torch.exp(-entropy)).tolist()
    tokens = tree.tokens.tolist()
    children, slot, accepted = tree.children, 0, []
    while True:
        kids = children[slot]
        probs = [float(p_all[slot, tokens[c - 1]]) for c in kids]
        ok = [(pr, c) for pr, c in zip(probs, kids) if pr > threshold[slot]]
        if not ok:
            return accepted, _draw(p_all[slot], gen)
        slot = max(ok)[1]
        accepted.append(slot - 1)


def accept(tree: DraftTree, logits: torch.Tensor, s: Sampling,
           gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """Dispatch on the sampling settings. logits: (n + 1, V) for the root and each node."""
    if s.greedy:
        return greedy_accept(tree, logits)
    p_all = target_probs(logits, s)
    if s.acceptance == "typical":
        return typical_accept(tree, p_all, s, gen)
    return sample_accept(tree, p_all, gen)
