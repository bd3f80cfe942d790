"""Autoregressive draft trees, shared by the standalone and EAGLE drafters.

EAGLE-2's dynamic tree: start from the root's top_k children; at each depth
expand the top_k frontier nodes by cumulative draft log-probability (one draft
forward for the whole frontier), then keep the best `total_tokens` nodes of
everything seen. A chain is top_k = 1 (and may be sampled, giving q).

The drafter supplies `forward(tokens, parent_ids, tree_mask, depths)`:
    tokens     (k,) long   the frontier nodes to run
    parent_ids list[int]   each node's parent id (-1: the root)
    tree_mask  (k, E + k) bool  what each node may see among the E nodes already run
               plus the k new ones (ancestors and itself); the drafter adds its cache columns
    depths     (k,) long   1 for a child of the root
and returns (k, V) logits for the children of each node.
"""
from __future__ import annotations

from typing import Callable

import torch

from drafters.base import DraftTree

Forward = Callable[[torch.Tensor, list, torch.Tensor, torch.Tensor], torch.Tensor]


def sample_chain(root_logits: torch.Tensor, forward: Forward, depth: int, greedy: bool,
                 gen: torch.Generator | None = None, temperature: float = 1.0) -> DraftTree:
    """A chain of `depth` tokens; sampled from q = softmax(logits / T) unless greedy (then q is None)."""
    tokens, qs, logits = [], [], root_logits
    for d in range(depth):
        if greedy:
            tok = int(logits.argmax())
        else:
            q = (logits.float() / temperature).softmax(-1)
            tok = int(torch.multinomial(q, 1, generator=gen))
            qs.append(q)
        tokens.append(tok)
        if d + 1 == depth:
            break
        mask = torch.ones(1, d + 1, dtype=torch.bool)  # a chain node sees every earlier node
        logits = forward(torch.tensor([tok]), [d - 1], mask, torch.tensor([d + 1]))[0]
    tree = DraftTree.chain(torch.tensor(tokens, device=root_logits.device))
    tree.extra = list(range(depth - 1)) + [-1]  # node d went through the draft as its d-th entry; the last did not
    if qs:
        tree.q = torch.stack(qs)
    return tree


def dynamic_tree(root_logits: torch.Tensor, forward: Forward, depth: int, top_k: int,
                 total_tokens: int) -> DraftTree:
    """EAGLE-2 style tree of at most total_tokens deterministic nodes (q is None: lossless with one-hot q)."""
    logp = root_logits.float().log_softmax(-1)
    top = logp.topk(top_k)
    # every node seen: token, parent id, cumulative score, depth
    toks, pars, scores, depths = top.indices.tolist(), [-1] * top_k, top.values.tolist(), [1] * top_k
    frontier = list(range(top_k))
    run_order: list[int] = []  # node ids in the order they went through the draft (its cache order)
    ancestors: dict[int, list[int]] = {}
    for d in range(1, depth):
        for nid in frontier:
            par = pars[nid]
            ancestors[nid] = (ancestors[par] if par >= 0 else []) + [nid]
        slot = {nid: i for i, nid in enumerate(run_order + frontier)}
        mask = torch.zeros(len(frontier), len(slot), dtype=torch.bool)
        for row, nid in enumerate(frontier):
            mask[row, [slot[a] for a in ancestors[nid]]] = True
        logits = forward(torch.tensor([toks[n] for n in frontier]), [pars[n] for n in frontier], mask,
                         torch.full((len(frontier),), d))
        run_order += frontier
        child = logits.float().log_softmax(-1).topk(top_k)  # (k, top_k)
        cand = torch.tensor([scores[n] for n in frontier])[:, None] + child.values  # (k, top_k)
        first_new = len(toks)
        for row, nid in enumerate(frontier):
            toks += child.indices[row].tolist()
            pars += [nid] * top_k
            depths += [d + 1] * top_k
        scores += cand.flatten().tolist()
        best = cand.flatten().topk(min(top_k, cand.numel())).indices.tolist()
        frontier = [first_new + b for b in best]
    return _select(toks, pars, scores, depths, total_tokens, run_order, root_logits.device)


def _select(toks, pars, scores, depths, total: int, run_order: list[int], device) -> DraftTree:
    """Best `total` nodes by score with every ancestor kept, in topological order."""
    order = sorted(range(len(toks)), key=lambda i: (-scores[i], depths[i]))
    keep: set[int] = set()
    for i in order:
        if len(keep) >= total:
            break
        chain = []
        while i >= 0 and i not in keep:
            chain.append(i)
            i = pars[i]
        if len(keep) + len(chain) <= total:
            keep.update(chain)
    # depth-first along the best child first, so a fully accepted best branch compacts as a crop
    kids: dict[int, list[int]] = {}
    for i in sorted(keep, key=lambda i: -scores[i]):
        kids.setdefault(pars[i], []).append(i)
    flat, stack = [], list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        flat.append(i)
        stack.extend(reversed(kids.get(i, [])))
    index = {old: new for new, old in enumerate(flat)}
    tokens = torch.tensor([toks[i] for i in flat], dtype=torch.long, device=device)
    parents = torch.tensor([index[pars[i]] if pars[i] >= 0 else -1 for i in flat], dtype=torch.long, device=device)
    entry = {nid: e for e, nid in enumerate(run_order)}
    # extra[i]: the draft-cache entry (in run order) holding node i, or -1 if it never went through the draft
    return DraftTree(tokens, parents, extra=[entry.get(i, -1) for i in flat])


def kept_entries(tree: DraftTree, accepted: list[int]) -> list[int]:
    """Draft-cache entries of the accepted path that went through the draft (a prefix of the path)."""
    entries = []
    for a in accepted:
        if tree.extra[a] < 0:
            break
        entries.append(tree.extra[a])
    return entries
