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

from draftkit.verify.contract import WITHOUT_REPLACEMENT, DraftTree, require_int


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
        require_int("top_k", self.top_k)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.acceptance not in ("exact", "typical"):
            raise ValueError(f"acceptance must be 'exact' or 'typical', got {self.acceptance!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def lossless(self) -> bool:
        """Whether acceptance keeps the target's distribution: exact acceptance, or greedy decoding (whose rule is
        argmax whatever `acceptance` says)."""
        return self.acceptance == "exact" or self.greedy


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


def sample_from(probs: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """(R,) one token per row of probs (R, V) (rows need not sum to 1), by inverse CDF: one uniform per row
    against the row's running sum. Exactly the row's distribution, like torch.multinomial, at a fraction of
    its cost on a CPU (a cumsum and a binary search, instead of multinomial's per-row setup): a step samples
    its bonus at every slot of the tree."""
    cdf = probs.float().cumsum(-1)  # (R, V), non-decreasing: a token of probability 0 is never the first above u
    u = torch.rand(probs.shape[0], 1, generator=gen, device=probs.device) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp_max(probs.shape[-1] - 1)


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


def greedy_choice(tokens: torch.Tensor, logits: torch.Tensor, pslot: torch.Tensor, best: torch.Tensor | None = None):
    """Greedy: a node is chosen when its token is argmax p at its parent's slot (the first such sibling).
    tokens, pslot (n,); logits (S, V); best (S,) argmax p if already known. Returns chosen (n,) bool and the
    bonus at each slot (S,) = argmax p."""
    best = logits.argmax(-1) if best is None else best  # (S,)
    n = tokens.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.bool, device=best.device), best
    match = tokens == best[pslot]
    idx = torch.arange(n, device=tokens.device)
    first = torch.full((n + 1,), n, dtype=torch.long, device=tokens.device).scatter_reduce(
        0, pslot, torch.where(match, idx, n), "amin")
    return match & (first[pslot] == idx), best


def sample_ranks(tree: DraftTree, p_all: torch.Tensor, gen: torch.Generator | None, kids: torch.Tensor,
                 rows: torch.Tensor, draws=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lossless multi-draft speculative sampling over the tree, every slot at once. p_all is (S, V) with
    S = n + 1; kids (R, C) the node tested at each draw of the R slots that have children (-1 padded: a plain
    tree's children in order, a merged tree's draws), rows (R,) those slots; draws: a merged tree's
    (qrow, fresh, wor) (R, C) tables (merged_draw_tables), None for a plain tree. Returns rank (R,): the draw
    accepted at each such slot (-1: none), and the bonus token drawn at every slot (S,) from what remains of p.

    The outcome at a slot depends only on that slot's p, its children and fresh randomness, so every slot
    is decided at once, one sibling rank at a time with tensor ops; uniforms drawn for slots off the
    accepted path are simply never used. Per sibling j of a slot, with p the slot's current (residual) p:
      iid draws (SpecInfer):  accept x_j w.p. min(1, p(x_j) / q(x_j)); else p <- norm(max(p - q, 0))
      without replacement (recursive rejection sampling, Jeon et al. 2024): q_j is q with the
        earlier siblings' tokens removed and renormalized; accept w.p. min(1, p(x_j) / q_j(x_j));
        else p <- norm(max(p - q_j, 0)). Exact when a slot's children, in order, are its first
        draws and their number was fixed before they were seen (it may depend on earlier
        siblings, never on the kept or dropped draws themselves: see drafters/tree_search.py)
      one-hot q (q is None): accept w.p. p(x_j); else p(x_j) <- 0 and renormalize.
    A merged tree (contract.SiblingDraws) mixes these per group: each group's draws follow their own rule,
    groups follow each other (independent draws with different q: SpecInfer's multi-step rule), and a node
    drawn by several groups is tested at each of its draws, with that draw's q.
    """
    dev = p_all.device
    final = p_all.float().clone()  # (S, V): the distribution each slot's bonus is drawn from
    rank = torch.full((rows.numel(),), -1, dtype=torch.long, device=dev)
    if rows.numel():
        p = final[rows]  # (R, V)
        xs = tree.tokens[kids.clamp_min(0)]  # (R, C) sibling tokens
        u = torch.rand(kids.shape, generator=gen, device=dev)
        if draws is None:  # a plain tree: node i's q in row i, one group per slot
            q_all, qrow = (None, None) if tree.q is None else (tree.q.float(), kids)
            fresh = torch.zeros_like(kids, dtype=torch.bool)
            fresh[:, 0] = True
            any_wor = tree.draws == WITHOUT_REPLACEMENT  # known on the host: nothing read
            wor = torch.full_like(kids, any_wor, dtype=torch.bool)
        else:
            q_all = None if tree.sibling_draws.q is None else tree.sibling_draws.q.float()
            qrow, fresh, wor = draws
            any_wor = any(tree.sibling_draws.without_replacement)
        removed = torch.zeros_like(p) if q_all is not None and any_wor else None
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
                qx = q_j.gather(1, x)[:, 0]
                # a draw of q = 0 (past a slot's support: sampled trees keep a fixed number of nodes) is never
                # accepted and, with q_j zero there, leaves p as it was: as if it were not in the tree
                ratio = torch.where(qx > 0, px / qx.clamp_min(1e-30), 0.0)
            ok = live & (u[:, j] < ratio)
            rank = torch.where(ok, j, rank)
            residual = p.scatter(1, x, 0.0) if q_j is None else (p - q_j).clamp_min(0)
            total = residual.sum(-1, keepdim=True)
            # total == 0 only if p == q, where rejection has probability 0; keep p then
            residual = torch.where(total > 0, residual / total.clamp_min(1e-30), p)
            p = torch.where((live & ~ok)[:, None], residual, p)
        final[rows] = p
    return rank, sample_from(final, gen)


def merged_draw_tables(tree: DraftTree, kids: torch.Tensor):
    """(qrow, fresh, wor) (R, C) of a merged tree's draws, in kids' layout (one more upload, merged trees only)."""
    from draftkit.verify import sync

    merged = tree.sibling_draws
    cells = [draws for draws in merged.order if draws]
    width = kids.shape[1]
    ints = []
    for draws in cells:
        pad = width - len(draws)
        ints += [r for _, r, _ in draws] + [-1] * pad
        ints += [int(j == 0 or draws[j][2] != draws[j - 1][2]) for j in range(len(draws))] + [0] * pad
        ints += [int(merged.without_replacement[g]) for _, _, g in draws] + [0] * pad
    up = sync.to_device(ints, kids.device).view(len(cells), 3, width) if cells else \
        torch.zeros(0, 3, width, dtype=torch.long, device=kids.device)
    return up[:, 0], up[:, 1].bool(), up[:, 2].bool()


def sample_choice(tree: DraftTree, p_all: torch.Tensor, gen, pslot, sib, kids, rows):
    """Exact sampling as (chosen (n,) bool, bonus per slot (S,)): a node is chosen when its parent's slot
    accepted a draw of it."""
    draws = merged_draw_tables(tree, kids) if tree.sibling_draws is not None and rows.numel() else None
    rank, bonus = sample_ranks(tree, p_all, gen, kids, rows, draws)
    n = pslot.numel()
    if tree.sibling_draws is None:
        at_slot = torch.full((p_all.shape[0],), -1, dtype=torch.long, device=p_all.device).scatter(0, rows, rank)
        return at_slot[pslot] == sib, bonus
    node = kids.gather(1, rank.clamp_min(0)[:, None])[:, 0]  # (R,) the node of each slot's accepted draw
    chosen = torch.zeros(n + 1, dtype=torch.bool, device=p_all.device)
    chosen = chosen.scatter(0, torch.where(rank >= 0, node, n), True)  # index n: slots that accepted none
    return chosen[:n], bonus


def typical_choice(tokens, p_all: torch.Tensor, s: Sampling, gen, pslot):
    """Medusa's typical acceptance (lossy): at each slot the most likely child above the entropy threshold
    min(eps, delta * exp(-H(p))) (ties: the later sibling). Returns (chosen (n,), bonus per slot (S,))."""
    entropy = -(p_all * p_all.clamp_min(1e-20).log()).sum(-1)
    threshold = torch.minimum(torch.full_like(entropy, s.typical_eps), s.typical_delta * torch.exp(-entropy))
    n, S = tokens.numel(), p_all.shape[0]
    pc = p_all[pslot, tokens]  # (n,) p of each child at its parent's slot
    ok = pc > threshold[pslot]
    top = torch.full((S,), -1.0, device=p_all.device).scatter_reduce(0, pslot, torch.where(ok, pc, -1.0), "amax")
    cand = ok & (pc == top[pslot])
    idx = torch.arange(n, device=tokens.device)
    last = torch.full((S,), -1, dtype=torch.long, device=tokens.device).scatter_reduce(
        0, pslot, torch.where(cand, idx, -1), "amax")
    return cand & (last[pslot] == idx), sample_from(p_all, gen)


def choose(tree: DraftTree, logits: torch.Tensor, s: Sampling, gen, topo,
           best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule the sampling settings name, on the device: (chosen (n,) bool, bonus per slot (S,) long).
    logits (S, V) unprocessed, for the root slot and each node; topo: tree_topology's tensors; best (S,):
    argmax of logits when the caller has it."""
    pslot, sib, _, kids, rows = topo
    if s.greedy:
        return greedy_choice(tree.tokens, logits, pslot, best)
    p_all = target_probs(logits, s)
    if s.acceptance == "typical":
        return typical_choice(tree.tokens, p_all, s, gen, pslot)
    return sample_choice(tree, p_all, gen, pslot, sib, kids, rows)


def tested_nodes(tree: DraftTree) -> list[list[int]]:
    """Per slot, the node tested at each draw, in test order: a plain tree's children, a merged tree's draws
    (a node several members drew is listed at each of its draws)."""
    if tree.sibling_draws is not None:
        return [[node for node, _, _ in draws] for draws in tree.sibling_draws.order]
    return [[c - 1 for c in kids] for kids in tree.children]


def topology_ints(tree: DraftTree) -> list[int]:
    """Host ints the device rules need, for the step's one upload: parent slot (n), sibling rank (n),
    depth (n), then the draw table (R * C: the node tested at each draw, -1 pads) and the slots that have
    children (R)."""
    children = tree.children
    n = len(tree)
    pslot, sib = [0] * n, [0] * n
    for s, kids in enumerate(children):
        for r, c in enumerate(kids):
            pslot[c - 1], sib[c - 1] = s, r
    tested = tested_nodes(tree)
    slots = [s for s, nodes in enumerate(tested) if nodes]
    width = max((len(tested[s]) for s in slots), default=0)
    table = [t for s in slots for t in tested[s] + [-1] * (width - len(tested[s]))]
    return pslot + sib + tree.depth[1:] + table + slots


def topology_from(tree: DraftTree, ints: torch.Tensor):
    """Device tensors (pslot, sib, depth, kids (R, C), rows (R,)) from topology_ints uploaded."""
    n = len(tree)
    tested = tested_nodes(tree)
    slots = [s for s, nodes in enumerate(tested) if nodes]
    width = max((len(tested[s]) for s in slots), default=0)
    pslot, sib, depth = ints[:n], ints[n:2 * n], ints[2 * n:3 * n]
    kids = ints[3 * n:3 * n + len(slots) * width].view(len(slots), width)
    return pslot, sib, depth, kids, ints[3 * n + len(slots) * width:]


def device_topology(tree: DraftTree):
    """topology_from's tensors for a tree whose topology is on the device (DraftTree.on_device_topology),
    computed there: every slot gets a row of the draw table, max_children wide (slots without children test
    nothing). Siblings are tested in node order, as a host tree's are."""
    t, n, parents = tree.device_topology, len(tree), tree.parents
    dev = parents.device
    idx = torch.arange(n, device=dev)
    pslot = parents + 1
    sib = ((parents[None] == parents[:, None]) & (idx[None] < idx[:, None])).sum(1)  # earlier siblings
    kids = torch.full((n + 1, max(t.max_children, 1)), -1, dtype=torch.long, device=dev)
    kids[pslot, sib] = idx
    return pslot, sib, t.depth, kids, torch.arange(n + 1, device=dev)


def tree_topology(tree: DraftTree, dev):
    """tree_topology's tensors on `dev` in one upload (with the tree's tokens, when they are still on the host)."""
    from draftkit.verify import sync

    ints = topology_ints(tree)
    host_tokens = tree.tokens.device != torch.device(dev)
    up = sync.to_device(ints + (tree.host_tokens if host_tokens else []), dev)
    if host_tokens:
        tree.tokens = up[len(ints):]
    return topology_from(tree, up[:len(ints)])


def accept(tree: DraftTree, logits: torch.Tensor, s: Sampling,
           gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """One tree on its own: (accepted node indices, bonus token). logits: (n + 1, V) for the root and each
    node. One upload (the topology) and one read (the walk); the decoding loop does the same for every lane
    of a step at once (verify/step.py)."""
    return _accept_one(tree, logits, lambda topo: choose(tree, logits, s, gen, topo))


def greedy_accept(tree: DraftTree, logits: torch.Tensor) -> tuple[list[int], int]:
    """Longest path matching argmax p, then the bonus argmax p. Returns (node indices, bonus)."""
    return accept(tree, logits, Sampling())


def sample_accept(tree: DraftTree, p_all: torch.Tensor, gen: torch.Generator | None = None) -> tuple[list[int], int]:
    """Lossless multi-draft speculative sampling (see `sample_ranks`) over p_all (n + 1, V), already processed."""
    return _accept_one(tree, p_all, lambda topo: sample_choice(tree, p_all, gen, topo[0], topo[1], topo[3], topo[4]))


def _accept_one(tree: DraftTree, rows: torch.Tensor, rule) -> tuple[list[int], int]:
    from draftkit.verify.step import ancestors, read_walks, walk

    tree.validate()
    topo = tree_topology(tree, rows.device)
    chosen, bonus = rule(topo)
    anc = ancestors(topo[0] - 1, tree.max_depth - 1)
    walks, _ = read_walks([walk(chosen, bonus, topo[2], anc, tree.tokens, max(tree.max_depth, 1))])
    path, _, bonus = walks[0]
    return path, bonus
