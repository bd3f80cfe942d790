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
  "accept x with probability p(x), else zero p(x) and renormalize". Children drawn
  from q without replacement use recursive rejection sampling instead: q loses
  each rejected sibling's token and is renormalized before the next sibling.
- typical (Medusa): accept x if p(x) > min(eps, delta * exp(-H(p))). LOSSY: the
  output no longer follows the target distribution; opt-in only.

Logits arrive as (n + 1, V): row 0 is the root's slot, row i + 1 node i's.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import torch

from draftkit.verify.contract import WITHOUT_REPLACEMENT, DraftTree


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
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):  # also rejects nan
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


def seeded_generator(seed: int | None, device, stream: str) -> torch.Generator | None:
    """A random stream on `device` from `seed`, salted (hashed with the stream's name) so that streams of one
    seed are independent. None without a seed (torch's global generator)."""
    if seed is None:
        return None
    salted = int.from_bytes(hashlib.sha256(f"draftkit-{stream}:{seed}".encode()).digest()[:8], "little") >> 1
    return torch.Generator(device=device).manual_seed(salted)


def verifier_generator(seed: int | None, device) -> torch.Generator | None:
    """The acceptance rule's random stream, on the logits' device. Independent of the drafter's stream of the
    same seed (`drafter_generator`): a draft sampled from the same uniforms that test it would no longer be
    tested fairly, and sampling would stop being exact."""
    return seeded_generator(seed, device, "verify")


def drafter_generator(seed: int | None, device) -> torch.Generator | None:
    """The drafters' random stream (DecodeState.generator): every sampled draft draw of a seeded run."""
    return seeded_generator(seed, device, "draft")


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
    """Longest path matching argmax p, then the bonus argmax p. Returns (node indices, bonus).
    One host read: argmax p per slot (with the node tokens when the tree was built on the device)."""
    best = logits.argmax(-1)
    if tree._tokens is None and len(tree):
        both = torch.cat([best, tree.tokens]).tolist()
        best, tree._tokens = both[:len(tree) + 1], both[len(tree) + 1:]
    else:
        best = best.tolist()
    tokens = tree.host_tokens
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


def _draw_table(tree: DraftTree, device):
    """The draws behind each slot's children, in test order: (slots with children, node (R, C) child node of
    each draw (-1 pads), row (R, C) its q row (-1: one-hot), fresh (R, C) a new group starts here,
    wor (R, C) its group drew without replacement, q (m, V) or None). A plain tree has one group per slot
    (its children in order, node i's q in row i); a merged tree lists its draws (contract.SiblingDraws)."""
    merged = tree.sibling_draws
    if merged is None:
        wor = tree.draws == WITHOUT_REPLACEMENT
        order = [[(c - 1, c - 1 if tree.q is not None else -1, 0) for c in kids] for kids in tree.children]
        q, group_wor = tree.q, [wor]
    else:
        order, q, group_wor = merged.order, merged.q, merged.without_replacement
    slots = [s for s, draws in enumerate(order) if draws]
    width = max(len(order[s]) for s in slots)
    pad = [(-1, -1, -1)] * width
    cells = [list(order[s]) + pad[:width - len(order[s])] for s in slots]
    node = [[d[0] for d in cell] for cell in cells]
    qrow = [[d[1] for d in cell] for cell in cells]
    fresh = [[j == 0 or cell[j][2] != cell[j - 1][2] for j in range(width)] for cell in cells]
    wor = [[d[2] >= 0 and group_wor[d[2]] for d in cell] for cell in cells]
    as_t = lambda x, dt: torch.tensor(x, dtype=dt, device=device)  # noqa: E731
    return (slots, as_t(node, torch.long), as_t(qrow, torch.long), as_t(fresh, torch.bool), as_t(wor, torch.bool),
            None if q is None else q.float())


def sample_accept(tree: DraftTree, p_all: torch.Tensor, gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """Lossless multi-draft speculative sampling over the tree. p_all is (n + 1, V).

    The outcome at a slot depends only on that slot's p, its draws and fresh randomness, so
    every slot is decided at once, one draw rank at a time with tensor ops (R slots with
    children, C the most draws at one slot); the walk from the root then reads the results
    back once. Uniforms drawn for slots off the accepted path are simply never used.
    Per draw j of a slot (a child x_j with its q_j), with p the slot's current (residual) distribution:
      iid draws (SpecInfer):  accept x_j w.p. min(1, p(x_j) / q_j(x_j)); else p <- norm(max(p - q_j, 0))
      without replacement (recursive rejection sampling, Jeon et al. 2024): q_j is q with the
        earlier siblings' tokens removed and renormalized; accept w.p. min(1, p(x_j) / q_j(x_j));
        else p <- norm(max(p - q_j, 0)). Exact when a slot's children, in order, are its first
        draws and their number was fixed before they were seen (it may depend on earlier
        siblings, never on the kept or dropped draws themselves: see drafters/tree_search.py)
      one-hot q (deterministic): accept w.p. p(x_j); else p(x_j) <- 0 and renormalize.
    A merged tree (contract.SiblingDraws) mixes these per group: each group's draws follow their own
    rule, groups follow each other (independent draws with different q: SpecInfer's multi-step rule),
    and a node drawn by several groups is tested at each of its draws.
    The bonus is drawn from what remains of p at the slot where the walk stops.
    """
    dev = p_all.device
    final = p_all.float().clone()  # (S, V): the distribution each slot's bonus is drawn from
    rank = None
    if len(tree):
        slots, kids, qrow, fresh, wor, q_all = _draw_table(tree, dev)  # (R, C) each
        rows = torch.tensor(slots, device=dev)
        p = final[rows]  # (R, V)
        xs = tree.tokens[kids.clamp_min(0)]  # (R, C) drawn tokens
        u = torch.rand(kids.shape, generator=gen, device=dev)
        rank = torch.full((len(slots),), -1, dtype=torch.long, device=dev)
        removed = torch.zeros_like(p) if q_all is not None and bool(wor.any()) else None
        for j in range(kids.shape[1]):
            live = (kids[:, j] >= 0) & (rank < 0)
            x = xs[:, j:j + 1]
            px = p.gather(1, x)[:, 0]
            if q_all is None:  # every draw deterministic
                ratio, q_j = px, None
            else:
                one_hot = torch.zeros_like(p).scatter_(1, x, 1.0)
                q_j = torch.where((qrow[:, j] < 0)[:, None], one_hot, q_all[qrow[:, j].clamp_min(0)])
                if removed is not None:  # the group's earlier draws cannot be drawn again
                    removed = torch.where(fresh[:, j, None], 0.0, removed)
                    w = wor[:, j, None]
                    kept = q_j * (1 - removed)
                    q_j = torch.where(w, kept / kept.sum(-1, keepdim=True).clamp_min(1e-30), q_j)
                    removed = torch.where(w, removed.scatter(1, x, 1.0), removed)
                ratio = px / q_j.gather(1, x)[:, 0].clamp_min(1e-20)
            ok = live & (u[:, j] < ratio)
            rank = torch.where(ok, j, rank)
            residual = p.scatter(1, x, 0.0) if q_j is None else (p - q_j).clamp_min(0)
            total = residual.sum(-1, keepdim=True)
            # total == 0 only if p == q, where rejection has probability 0; keep p then
            residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p)
            p = torch.where((live & ~ok)[:, None], residual, p)
        final[rows] = p
    bonus = torch.multinomial(final, 1, generator=gen)[:, 0]  # (S,)
    if rank is None:
        return [], int(bonus[0])
    host = torch.cat([rank, bonus]).tolist()  # the one host read of the step
    rank_of, bonus = dict(zip(slots, host[:len(slots)])), host[len(slots):]
    merged = tree.sibling_draws
    slot, accepted = 0, []
    while rank_of.get(slot, -1) >= 0:
        j = rank_of[slot]
        slot = merged.order[slot][j][0] + 1 if merged is not None else tree.children[slot][j]
        accepted.append(slot - 1)
    return accepted, bonus[slot]


def typical_accept(tree: DraftTree, p_all: torch.Tensor, s: Sampling,
                   gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """Medusa's typical acceptance (lossy): most likely child above the entropy threshold."""
    entropy = -(p_all * p_all.clamp_min(1e-20).log()).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, s.typical_eps), s.typical_delta * torch.exp(-entropy)).tolist()
    tokens = tree.host_tokens
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
