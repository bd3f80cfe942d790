"""Autoregressive draft trees, shared by the standalone and EAGLE drafters.

EAGLE-2's dynamic tree: start from the root's top_k children; at each depth
expand the top_k frontier nodes by cumulative draft log-probability (one draft
forward for the whole frontier), then keep the best `max_nodes` nodes of
everything seen. A chain is top_k = 1 (and may be sampled, giving q).

The drafter supplies `forward(tokens, parent_rows, block, depths)`:
    tokens      (k,) long   the frontier nodes to run
    parent_rows (k,) long   each node's parent's row in run order (-1: the root)
    block       (k, E + k) bool  what each node may see among the E nodes already run this step
                plus the k new ones (ancestors and itself), or None for a chain (causal)
    depths      (k,) long   1 for a child of the root
and returns (k, V) logits for the children of each node. Nodes go through the
draft in "run order"; tree.extra[i] is node i's row in that order (-1 if it
never ran), which is also its offset among the draft cache's pending entries.
"""
from __future__ import annotations

from typing import Callable

import torch

from verify.contract import DraftTree

Forward = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor], torch.Tensor]


def _generator(gen: torch.Generator | None, device) -> torch.Generator | None:
    """A generator usable on `device`: the same object when its device matches, else a new one seeded
    from it (a CPU generator cannot drive torch.multinomial on a CUDA tensor)."""
    if gen is None or gen.device == torch.device(device):
        return gen
    return torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))


def sample_chain(root_logits: torch.Tensor, forward: Forward, depth: int, greedy: bool,
                 gen: torch.Generator | None = None, temperature: float = 1.0) -> DraftTree:
    """A chain of `depth` tokens; sampled from q = softmax(logits / T) unless greedy (then q is None)."""
    dev = root_logits.device
    gen = _generator(gen, dev)
    picked, qs, logits = [], [], root_logits
    for d in range(depth):
        if greedy:
            tok = logits.argmax()[None]
        else:
            q = (logits.float() / temperature).softmax(-1)
            tok = torch.multinomial(q, 1, generator=gen)
            qs.append(q)
        picked.append(tok)
        if d + 1 == depth:
            break
        logits = forward(tok, torch.tensor([d - 1], device=dev), None, torch.tensor([d + 1], device=dev))[0]
    tokens = torch.cat(picked).tolist()  # the drafter's one read of its chain
    # node d went through the draft as its d-th row; the last one did not
    return DraftTree.from_lists(tokens, list(range(-1, depth - 1)), dev, torch.stack(qs) if qs else None,
                                extra=list(range(depth - 1)) + [-1])


def dynamic_tree(root_logits: torch.Tensor, forward: Forward, depth: int, top_k: int,
                 max_nodes: int) -> DraftTree:
    """EAGLE-2 style tree of at most max_nodes deterministic nodes (q is None: lossless with one-hot q)."""
    dev = root_logits.device
    top = root_logits.float().log_softmax(-1).topk(top_k)
    toks, scores = [top.indices], [top.values]  # per expansion: (k,) tokens and cumulative log-probs
    pars, depths = [torch.full((top_k,), -1, device=dev)], [torch.ones(top_k, dtype=torch.long, device=dev)]
    frontier = torch.arange(top_k, device=dev)  # node ids (into the concatenation of toks) to run next
    run = torch.zeros(0, dtype=torch.long, device=dev)  # node ids in run order
    anc = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # (E, E) ancestors among run rows
    row_of = torch.full((top_k + (depth - 1) * top_k * top_k,), -1, dtype=torch.long, device=dev)
    for d in range(1, depth):
        all_toks, all_pars = torch.cat(toks), torch.cat(pars)
        k, e = frontier.numel(), run.numel()
        parent_rows = row_of[all_pars[frontier].clamp_min(0)].where(all_pars[frontier] >= 0, -1)
        # a frontier node sees its parent's ancestors (rows already run) and itself
        new = torch.zeros(k, e + k, dtype=torch.bool, device=dev)
        has_par = parent_rows >= 0
        new[has_par, :e] = anc[parent_rows[has_par]]
        new[:, e:] = torch.eye(k, dtype=torch.bool, device=dev)
        anc = torch.cat([torch.cat([anc, torch.zeros(e, k, dtype=torch.bool, device=dev)], 1), new], 0)
        row_of[frontier] = torch.arange(e, e + k, device=dev)
        logits = forward(all_toks[frontier], parent_rows, new, torch.full((k,), d, device=dev))
        run = torch.cat([run, frontier])
        child = logits.float().log_softmax(-1).topk(top_k)  # (k, top_k)
        cand = torch.cat(scores)[frontier][:, None] + child.values  # (k, top_k)
        first_new = all_toks.numel()
        toks.append(child.indices.flatten())
        scores.append(cand.flatten())
        pars.append(frontier.repeat_interleave(top_k))
        depths.append(torch.full((k * top_k,), d + 1, device=dev))
        frontier = first_new + cand.flatten().topk(min(top_k, cand.numel())).indices
    host = [t.tolist() for t in (torch.cat(toks), torch.cat(pars), torch.cat(scores), torch.cat(depths), run)]
    return _select(*host, max_nodes, dev)


def _select(toks, pars, scores, depths, run_order, total: int, device) -> DraftTree:
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
    # depth-first along the best child first, so a fully accepted best branch commits without copies
    kids: dict[int, list[int]] = {}
    for i in sorted(keep, key=lambda i: -scores[i]):
        kids.setdefault(pars[i], []).append(i)
    flat, stack = [], list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        flat.append(i)
        stack.extend(reversed(kids.get(i, [])))
    index = {old: new for new, old in enumerate(flat)}
    entry = {nid: e for e, nid in enumerate(run_order)}
    return DraftTree.from_lists([toks[i] for i in flat], [index[pars[i]] if pars[i] >= 0 else -1 for i in flat],
                                device, extra=[entry.get(i, -1) for i in flat])


def kept_entries(tree: DraftTree, accepted: list[int]) -> list[int]:
    """Draft-cache rows (pending offsets) of the accepted path that went through the draft (a prefix of the path)."""
    entries = []
    for a in accepted:
        if tree.extra[a] < 0:
            break
        entries.append(tree.extra[a])
    return entries
