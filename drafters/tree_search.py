"""Autoregressive draft trees, shared by the standalone and EAGLE drafters.

EAGLE-2's dynamic tree: start from the root's top_k children; at each depth
expand the top_k frontier nodes by cumulative draft log-probability (one draft
forward for the whole frontier), then keep the first-ranked chain (the best
child at every level) and the best of everything else seen by score, `max_nodes`
in all. A chain is top_k = 1 (and may be sampled, giving q).

When sampling, `sampled_search` draws every node's children from q WITHOUT
replacement (Gumbel-top-k on log q at the sampling temperature; Jeon et al. 2024)
and returns q and draws=WITHOUT_REPLACEMENT, for the verifier's recursive
rejection sampling. That rule is exact only if, at every slot, the children are
the first m draws of that slot's sequence and m was decided before those draws
were seen (a stopping rule: it may depend on the slot's earlier draws and on
anything else in the tree, never on the draws it keeps or drops). EAGLE-2's final
rerank (keep the best max_nodes of everything drawn) breaks this: it keeps a
sibling because of its own probability. So the sampled tree fixes each slot's
count from numbers known before its draws: the j-th child of a slot is worth
score(slot) + (the j-th largest log q there), whichever token the j-th draw turns
out to be; each level keeps its best such children (level_widths sets how many per
level), and nothing kept is ever dropped. Its shape is fixed, so it is chosen on
the device like the top-k tree (measured against a best-first rule that read each
level back: the same acceptance within noise on the shipped EAGLE-2 and standalone
drafts). The
`DRAFTKIT_SAMPLED_TREES=0` environment variable turns this off (deterministic
top-k trees with one-hot q under sampling too, as before).

Each search is a generator (`Search`): it yields the draft forwards it needs and is sent their logits, so
one drafter runs them one after another (`draft`, `run_search`) and a drafter of several lanes answers the
same level of every lane's search with one batched forward (drafters/lanes.py). A forward request is
`(tokens, parent_rows, block, depths)`:
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

import os
from typing import Callable, Generator

import torch

from draftkit.verify import sync
from draftkit.verify.accept import Sampling, sample_from, target_probs
from draftkit.verify.contract import WITHOUT_REPLACEMENT, DraftTree

Forward = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor], torch.Tensor]
#: a search yields each draft forward it needs as (tokens, parent_rows, block, depths), is sent that forward's
#: (k, V) logits, and returns its DraftTree
Search = Generator[tuple, torch.Tensor, DraftTree]


def generator_on(gen: torch.Generator | None, device) -> torch.Generator | None:
    """A generator usable on `device`: the same object when its device matches, else a new one seeded
    from it (a CPU generator cannot drive torch.multinomial on a CUDA tensor), so a seeded run stays
    seeded whatever device the draft sits on."""
    if gen is None or gen.device == torch.device(device):
        return gen
    return torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))


def sampled_trees_enabled() -> bool:
    """Sampled (without-replacement) trees under sampling, unless DRAFTKIT_SAMPLED_TREES=0."""
    return os.environ.get("DRAFTKIT_SAMPLED_TREES", "1").strip().lower() not in ("0", "false", "no", "off")


def draft_probs(logits: torch.Tensor, temperature: float, sampling: Sampling | None = None) -> torch.Tensor:
    """q from draft logits (..., V): the processing p gets (temperature, then the top-k / top-p of
    `sampling` when given), so that q is as close to p as the draft allows."""
    if sampling is not None and (sampling.top_k or sampling.top_p < 1.0):
        return target_probs(logits, Sampling(temperature=temperature, top_k=sampling.top_k, top_p=sampling.top_p))
    return (logits.float() / temperature).softmax(-1)


def gumbel_order(q: torch.Tensor, k: int, gen: torch.Generator | None) -> torch.Tensor:
    """(R, k) tokens: k draws without replacement from each row of q (R, V), in draw order
    (Gumbel-top-k: the order of log q + Gumbel noise is that of successive draws without
    replacement). Positions past a row's support are meaningless; callers stop at the support."""
    noise = torch.empty_like(q).exponential_(generator=gen)  # -log(Exp(1)) is Gumbel(0, 1)
    return (q.log() - noise.clamp_min_(torch.finfo(noise.dtype).tiny).log()).topk(k, dim=-1).indices


def chain_search(root_logits: torch.Tensor, depth: int, greedy: bool, gen: torch.Generator | None = None,
                 temperature: float = 1.0, sampling: Sampling | None = None) -> Search:
    """A chain of `depth` tokens; sampled from q = draft_probs(logits) unless greedy (then q is None)."""
    dev = root_logits.device
    gen = generator_on(gen, dev)
    picked, qs, logits = [], [], root_logits
    rows = torch.arange(-1, depth + 1, device=dev)  # parent rows and depths as slices: no upload per level
    for d in range(depth):
        if greedy:
            tok = logits.argmax()[None]
        else:
            q = draft_probs(logits, temperature, sampling)
            tok = sample_from(q[None], gen)
            qs.append(q)
        picked.append(tok)
        if d + 1 == depth:
            break
        logits = (yield tok, rows[d:d + 1], None, rows[d + 2:d + 3])[0]
    # the tokens stay on the device (a chain's topology is known): the verifier reads them with its one read;
    # node d went through the draft as its d-th row; the last one did not
    return DraftTree.on_device(torch.cat(picked), list(range(-1, depth - 1)), torch.stack(qs) if qs else None,
                               extra=list(range(depth - 1)) + [-1])


class RunRows:
    """The nodes of one step's search that went through the draft, in run order, and who sees whom among them:
    builds each level's forward request on the device (no boolean index, whose size would depend on the data: a
    wait on a GPU)."""

    def __init__(self, n_nodes: int, dev):
        self.dev = dev
        self.run = torch.zeros(0, dtype=torch.long, device=dev)  # node ids in run order
        self.anc = torch.zeros(0, 0, dtype=torch.bool, device=dev)  # (E, E) ancestors among run rows
        self.row_of = torch.full((n_nodes,), -1, dtype=torch.long, device=dev)  # a node's run row (-1: not run)

    def request(self, frontier: torch.Tensor, toks: torch.Tensor, pars: torch.Tensor, depth: int) -> tuple:
        """The forward request for the frontier's node ids (k,), given every node's token and parent id so far
        (-1: the root); records them as run. A frontier node sees its parent's ancestors (rows already run) and
        itself."""
        dev, k, e = self.dev, frontier.numel(), self.run.numel()
        parent_rows = self.row_of[pars[frontier].clamp_min(0)].where(pars[frontier] >= 0, -1)
        new = torch.zeros(k, e + k, dtype=torch.bool, device=dev)
        if e:
            new[:, :e] = self.anc[parent_rows.clamp_min(0)] & (parent_rows >= 0)[:, None]
        new[:, e:] = torch.eye(k, dtype=torch.bool, device=dev)
        self.anc = torch.cat([torch.cat([self.anc, torch.zeros(e, k, dtype=torch.bool, device=dev)], 1), new], 0)
        self.row_of[frontier] = torch.arange(e, e + k, device=dev)
        self.run = torch.cat([self.run, frontier])
        return toks[frontier], parent_rows, new, torch.full((k,), depth, device=dev)


def topk_search(root_logits: torch.Tensor, depth: int, top_k: int, max_nodes: int,
                tree_temperature: float = 1.0) -> Search:
    """EAGLE-2 style tree of at most max_nodes deterministic nodes (q is None: lossless with one-hot q): each
    level expands the top_k best paths so far; the budget's depth, chosen from measured acceptance, ends it.
    A path's score is the sum of its log softmax(logits / tree_temperature): the draft's confidence calibrated
    so that it estimates the chance the target keeps the path (train/calibrate.py fits it)."""
    dev = root_logits.device

    def scores_of(logits: torch.Tensor) -> torch.Tensor:  # no division at T = 1 (one op less per level)
        logits = logits.float()
        return (logits if tree_temperature == 1.0 else logits / tree_temperature).log_softmax(-1)

    top = scores_of(root_logits).topk(top_k)
    toks, scores = [top.indices], [top.values]  # per expansion: (k,) tokens and cumulative log-probs
    pars, depths = [torch.full((top_k,), -1, device=dev)], [torch.ones(top_k, dtype=torch.long, device=dev)]
    frontier = torch.arange(top_k, device=dev)  # node ids (into the concatenation of toks) to run next
    rows = RunRows(top_k + (depth - 1) * top_k * top_k, dev)
    for d in range(1, depth):
        all_toks = torch.cat(toks)
        k = frontier.numel()
        logits = yield rows.request(frontier, all_toks, torch.cat(pars), d)
        child = scores_of(logits).topk(top_k)  # (k, top_k)
        cand = torch.cat(scores)[frontier][:, None] + child.values  # (k, top_k)
        first_new = all_toks.numel()
        toks.append(child.indices.flatten())
        scores.append(cand.flatten())
        pars.append(frontier.repeat_interleave(top_k))
        depths.append(torch.full((k * top_k,), d + 1, device=dev))
        best = cand.flatten().topk(min(top_k, cand.numel()))
        frontier = first_new + best.indices
    parts = (torch.cat(toks), torch.cat(pars), torch.cat(scores), torch.cat(depths), rows.run)
    if not sync.is_host(dev):  # no read: the verifier reads the tree with its one read
        return select_on_device(*parts, max_nodes, depth, top_k)
    # on the host reading is free, and list operations beat select_on_device's ~40 tensor ops (measured on the
    # shipped EAGLE-2, 2 CPU cores: 4% of the speedup); the same rule, checked equal (tests/test_tree_select.py)
    flat = torch.cat([t.double() for t in parts]).tolist()  # ids are exact in float64
    host, at = [], 0
    for i, t in enumerate(parts):
        host.append(flat[at:at + t.numel()] if i == 2 else [int(x) for x in flat[at:at + t.numel()]])
        at += t.numel()
    return select_on_host(*host, max_nodes, dev)


def level_widths(max_nodes: int, depth: int, top_k: int) -> list[int]:
    """Nodes a sampled tree keeps at each depth (1..depth): one per level first (the chain), then the rest of
    max_nodes one at a time from the root down, round after round, each level capped by what it can draw
    (top_k at the root, top_k children of each of its parent level's top_k best nodes below)."""
    widths = [1] * depth
    extra = max_nodes - depth
    while extra > 0:
        grew = False
        for d in range(depth):
            cap = top_k * (1 if d == 0 else min(top_k, widths[d - 1]))
            if extra > 0 and widths[d] < cap:
                widths[d] += 1
                extra -= 1
                grew = True
        if not grew:
            break
    return widths


def keep_prefixes(q: torch.Tensor, base: torch.Tensor, width: int, k: int, gen) -> tuple:
    """`width` children of f slots drawn without replacement: each slot keeps the first m_s of its own draws,
    the m_s fixed before the draws are seen. q (f, V) the slots' q rows, base (f,) their scores.
    The count: the j-th child of slot s is worth base[s] + (the j-th largest log q at s), a number that does
    not depend on which token the j-th draw turns out to be; the `width` best of these over all slots are kept
    (a prefix of every slot, as values fall with j). Returns (slot, token, score) (width,) each, grouped by slot
    in draw order. Draws past a slot's support get log q = -inf: kept only when nothing else is left, never
    accepted (verify/accept.py rejects a draw of q = 0)."""
    f = q.shape[0]
    order = gumbel_order(q, k, gen)  # (f, k) tokens in draw order
    drawn = base[:, None] + q.gather(1, order).log()  # (f, k) each draw's path score
    worth = (base[:, None] + q.topk(k, dim=-1).values.log()).flatten()  # (f * k,) known before the draws
    m = torch.zeros(f, dtype=torch.long, device=q.device).scatter_add_(
        0, worth.topk(width).indices // k, torch.ones(width, dtype=torch.long, device=q.device))
    kept = torch.arange(k, device=q.device)[None] < m[:, None]  # (f, k) a prefix per slot
    at = (~kept).flatten().to(torch.uint8).argsort(stable=True)[:width]  # kept cells, row-major: no wait
    return at // k, order.flatten()[at], drawn.flatten()[at]


def sampled_search(root_logits: torch.Tensor, depth: int, top_k: int, max_nodes: int,
                   gen: torch.Generator | None = None, temperature: float = 1.0,
                   sampling: Sampling | None = None) -> Search:
    """A tree of depth `depth` whose siblings are drawn from q without replacement, grown one level per draft
    forward and chosen on the device (nothing read: the verifier reads it with its one read). Level d keeps
    level_widths(...)[d - 1] nodes (keep_prefixes: how many of each slot's draws, decided before the draws);
    the next level's slots are that level's top_k best nodes by path score. No draw is ever dropped once kept,
    so the tree obeys the stopping rule the verifier's recursive rejection sampling needs (module notes)."""
    dev = root_logits.device
    gen = generator_on(gen, dev)
    k = min(top_k, root_logits.shape[-1])
    widths = level_widths(max_nodes, depth, k)
    q = draft_probs(root_logits[None], temperature, sampling)  # (1, V)
    slot, tok, score = keep_prefixes(q, torch.zeros(1, device=dev), widths[0], k, gen)
    toks, pars, qs, qrows = [tok], [torch.full_like(tok, -1)], [q], [slot]
    depths = [torch.ones_like(tok)]
    n_q = 1  # rows of q so far
    rows = RunRows(sum(widths), dev)
    for d in range(1, depth):  # level d + 1 from the best nodes of level d (ids from sum(widths[:d - 1]) on)
        best = score.topk(min(k, widths[d - 1]))
        frontier = sum(widths[:d - 1]) + best.indices  # (f,) node ids
        logits = yield rows.request(frontier, torch.cat(toks), torch.cat(pars), d)
        q = draft_probs(logits, temperature, sampling)  # (f, V)
        slot, tok, score = keep_prefixes(q, best.values, widths[d], k, gen)
        toks.append(tok), pars.append(frontier[slot]), qs.append(q)
        qrows.append(n_q + slot), depths.append(torch.full_like(tok, d + 1))
        n_q += frontier.numel()
    # level order: parents come first, siblings in draw order (the order the verifier tests them in); a node's
    # extra is its row in run order (-1: never ran)
    return DraftTree.on_device_topology(torch.cat(toks), torch.cat(pars), torch.cat(depths), depth, k, rows.row_of,
                                        q=torch.cat(qs)[torch.cat(qrows)], draws=WITHOUT_REPLACEMENT)


def select_on_device(toks, pars, scores, depths, run, total: int, max_depth: int, top_k: int) -> DraftTree:
    """The top-k search's tree, chosen on the device (nothing read: the verifier reads it with its one read).
    toks, pars (-1: the root), scores (cumulative log-probs), depths (N,) over every candidate node, run (E,) the
    candidates run through the draft, in run order. Keeps the first-ranked chain (the best-scored child at every
    level, the first of equal ones) and then the best candidates by (score, depth, index), min(total, N) in all.
    Node order: the chain first (a fully accepted chain commits without moving KV entries), then the rest in that
    order; so every node follows its parent and siblings come best first.

    Why the chain first: cumulative draft probabilities alone would drop the chain's deep nodes for siblings near
    the root (a product of four 0.6s ranks below a 0.2 sibling), where the verifier passes the chain far more
    often: measured on code with the EAGLE-2 draft, the tree's depth-4 acceptance was 0.21 against its own chain's
    0.56. Why nothing else is needed to keep the tree whole: a child's score is its parent's plus a log-probability
    (<= 0), so in that order every node comes after its ancestors and the best nodes include their ancestors."""
    n_all, dev = toks.numel(), toks.device
    total = min(total, n_all)
    idx = torch.arange(n_all, device=dev)
    key = scores.float().clamp_min(torch.finfo(torch.float32).min)  # -inf scores still rank among children
    slot = pars + 1  # (N,) the parent's slot: 0 the root, i + 1 candidate i
    top = torch.full((n_all + 1,), -torch.inf, device=dev).scatter_reduce(0, slot, key, "amax")
    first = torch.full((n_all + 1,), n_all, device=dev).scatter_reduce(
        0, slot, torch.where(key == top[slot], idx, n_all), "amin")
    best = first[slot] == idx  # (N,) the best-scored child of its parent
    chain = best & (pars < 0)
    for _ in range(max_depth - 1):  # the chain grows one level per pass
        chain = best & ((pars < 0) | chain[pars.clamp_min(0)])
    chain &= depths <= total
    order = depths.argsort(stable=True)
    order = order[(-key[order]).argsort(stable=True)]  # by score, then depth, then index
    rest = ~chain[order]
    taken = rest & (rest.cumsum(0) <= total - chain.sum())  # in that order
    place = torch.full((n_all,), n_all + 1, device=dev)
    place[order] = torch.where(taken, idx, n_all + 1)
    tree_order = torch.where(chain, depths - (max_depth + 1), place).argsort(stable=True)[:total]
    where = torch.full((n_all,), -1, dtype=torch.long, device=dev)
    where[tree_order] = torch.arange(total, device=dev)
    entry = torch.full((n_all,), -1, dtype=torch.long, device=dev)
    entry[run] = torch.arange(run.numel(), device=dev)  # a node's row in run order (-1: never ran)
    parent = pars[tree_order]
    return DraftTree.on_device_topology(toks[tree_order], torch.where(parent >= 0, where[parent.clamp_min(0)], -1),
                                        depths[tree_order], max_depth, top_k, entry[tree_order])


def select_on_host(toks, pars, scores, depths, run, total: int, device) -> DraftTree:
    """select_on_device's rule on host lists (the same tree, built from lists)."""
    n = len(toks)
    total = min(total, n)
    best: dict[int, int] = {}  # parent -> its best-scored child (the first of equal ones)
    for i, p in enumerate(pars):
        if p not in best or scores[i] > scores[best[p]]:
            best[p] = i
    chain, at = [], -1
    while at in best and len(chain) < total:
        at = best[at]
        chain.append(at)
    on_chain = set(chain)
    rest = [i for i in sorted(range(n), key=lambda i: (-scores[i], depths[i], i)) if i not in on_chain]
    flat = chain + rest[:total - len(chain)]
    where = {old: new for new, old in enumerate(flat)}
    entry = {c: e for e, c in enumerate(run)}
    return DraftTree.from_lists([toks[i] for i in flat], [where[pars[i]] if pars[i] >= 0 else -1 for i in flat],
                                device, extra=[entry.get(i, -1) for i in flat])


def depth_first(parents: list[int], best_first: list[int]) -> list[int]:
    """The nodes of `best_first` (a tree: every parent among them, -1 the root) depth-first, each node's
    children best first: a fully accepted best branch then commits without moving KV entries."""
    kids: dict[int, list[int]] = {}
    for i in best_first:
        kids.setdefault(parents[i], []).append(i)
    flat, stack = [], list(reversed(kids.get(-1, [])))
    while stack:
        i = stack.pop()
        flat.append(i)
        stack.extend(reversed(kids.get(i, [])))
    return flat


def kept_entries(tree: DraftTree, accepted: list[int]) -> list[int]:
    """Draft-cache rows (pending offsets) of the accepted path that went through the draft (a prefix of the path)."""
    entries = []
    for a in accepted:
        if tree.extra[a] < 0:
            break
        entries.append(tree.extra[a])
    return entries


def run_search(search: Search, forward: Forward) -> DraftTree:
    """Drive a search with one drafter's draft forward: every request it yields is answered at once."""
    try:
        request = next(search)
        while True:
            request = search.send(forward(*request))
    except StopIteration as done:
        return done.value


def draft(root_logits: torch.Tensor, forward: Forward, state, top_k: int, temperature: float | None = None,
          sampling=None, tree_temperature: float = 1.0) -> DraftTree:
    """The proposal of an autoregressive drafter within state.budget (see `search`), its forwards run one after
    another by `forward`."""
    return run_search(search(root_logits, state, top_k, temperature, sampling, tree_temperature), forward)


def search(root_logits: torch.Tensor, state, top_k: int, temperature: float | None = None, sampling=None,
           tree_temperature: float = 1.0) -> Search:
    """The search for an autoregressive drafter's proposal within state.budget: a chain (top_k 1, sampled from
    q when sampling), a tree sampled without replacement (sampling), or the EAGLE-2 top-k tree (greedy, its
    scores at tree_temperature). Sampled draws come from state.generator (the run's seed). A drafter of several
    lanes drives one search per lane and answers each level's requests of every lane with one draft forward."""
    budget, gen = state.budget, state.generator
    depth = min(budget.max_depth, budget.max_nodes)
    temperature = temperature or state.temperature
    sampling = sampling or state.sampling
    if top_k == 1 or budget.max_nodes <= depth:  # a chain, or a budget with one node per level: the chain
        # (the controller's chain shape for a tree drafter, verify/controller.py; a tree search cut to it costs
        # more to draft: EAGLE under sampling, depth 4, 7.2 ms against 6.0 ms a step)
        return (yield from chain_search(root_logits, depth, state.greedy, gen, temperature, sampling))
    # budget.min_path_prob is not applied here: a draft trained to regress the target's features (EAGLE) gives
    # soft distributions whose path probabilities sit far below the acceptance measured for them (measured on the
    # shipped EAGLE-2: depth-2 acceptance 0.43 at full depth, 0.06 once paths were cut at the floor), so the
    # controller's per-depth rates, measured on accepted tokens, choose the depth instead
    if not state.greedy and sampled_trees_enabled():
        return (yield from sampled_search(root_logits, depth, top_k, budget.max_nodes, gen, temperature, sampling))
    return (yield from topk_search(root_logits, depth, top_k, budget.max_nodes, tree_temperature))


def depth_lookup(depth_logits: torch.Tensor) -> Forward:
    """A `forward` for drafters whose distribution at depth d does not depend on the tokens drafted above it
    (P-EAGLE and DFlash draft every depth in one pass): a node's children are drawn from the next depth's
    logits whatever the node is, so the tree needs no further draft forward. depth_logits (D, V): row d - 1
    holds the logits of depth d; a depth-d node asks for row d."""
    def forward(tokens, parent_rows, block, depths):
        return depth_logits[depths.to(depth_logits.device)]
    return forward


def draft_from_depths(depth_logits: torch.Tensor, state, top_k: int, temperature: float | None = None,
                      sampling=None, tree_temperature: float = 1.0) -> DraftTree:
    """A chain or tree (as `draft`) from per-depth logits (D, V) computed in one draft forward. The budget's
    depth is capped at D. Under sampling each node's q is its depth's distribution: the one its token was drawn
    from, so the verifier's rule stays exact."""
    depth = min(state.budget.max_depth, state.budget.max_nodes, depth_logits.shape[0])
    if depth < 1:
        return DraftTree.empty(depth_logits.device)
    if state.budget.max_depth > depth:
        state = _with_depth(state, depth)
    return draft(depth_logits[0], depth_lookup(depth_logits), state, top_k, temperature, sampling, tree_temperature)


def _with_depth(state, depth: int):
    from dataclasses import replace

    return replace(state, budget=replace(state.budget, max_depth=depth))
