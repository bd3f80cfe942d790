"""Several sequences decoded together: one target forward per step for all of them.

Two layouts of the verifier's KV buffer (verify/forward.py):
- rows (a batch of prompts): a row per sequence ("lane"). A step is a (lanes, width) batch: each lane's
  pending tokens (committed, not yet in the cache; the last one is the root) and its draft tree, padded to
  the widest lane's, each row attending over its own entries only. A lane that finishes gives its row to
  the last live lane, so steps run over the live lanes only; the batch planner prices a step by its width
  (verify/batch_plan.py).
- packed (best-of-N, static shapes): the lanes in ONE row. Every committed entry has an owner: the lane it
  belongs to, or SHARED for a prefix every lane sees (best-of-N's prompt: N samples are N branches of one
  tree hanging off the prompt, stored once). A step's input is the lanes' pieces back to back:

    input:   [pending_0 tree_0] [pending_1 tree_1] ...          (q tokens, one row)
    sees:    committed entries it owns or SHARED, then its own block (verify/tree.py)

  Lanes accept different numbers of tokens every step and finish at different steps, and neither leaves
  holes: a finished lane stops contributing tokens. The price is that attention runs over every lane's
  columns and masks the others' away (at 8 lanes it cost 60% more than rows, verify/forward.py).

Either way every lane's accepted entries are committed in place by one O(accepted) KV commit.
Single-sequence decoding (verify/decode.py) is this loop with one lane. Per step:
one upload of the step's layout and one read of every lane's accepted path
(verify/step.py); the KV commit, the owners, the lanes' token buffers, the fed
tokens and hidden rows handed to the drafters are all indexed on the device.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftkit.verify import sync
from draftkit.verify.accept import Sampling, drafter_generator, verifier_generator
from draftkit.verify.batch_plan import BatchPlanner
from draftkit.verify.budget import make_policy
from draftkit.verify.constraints import make_constraint
from draftkit.verify.contract import Budget, DecodeState, DraftTree, StepResult, require_int
from draftkit.verify.lanes import reset_lanes
from draftkit.verify.decode import GenerationOutput, as_prompt, check_room, eos_set, finish
from draftkit.verify.compiled import bucket
from draftkit.verify.forward import Verifier, static_verifier
from draftkit.verify.stats import DecodeStats, StepStats
from draftkit.verify.step import SHARED, Piece, StepInputs, read_walks, walk_tree
from draftkit.verify.timing import Carry, clock_for

__all__ = ["SHARED", "Lane", "PackedOutput", "generate_packed", "kv_entries_independent", "static_capacity"]


@dataclass
class Lane:
    """One sequence: its drafter and budget policy, what it committed, what it still has to feed."""

    index: int
    drafter: object
    policy: object
    prompt: torch.Tensor
    tokens: list[int]  # committed tokens on the host (prompt + generated)
    buf: torch.Tensor  # (room,) long on the device: the same tokens, what drafters read
    pending: list[int] | torch.Tensor = None  # committed tokens not yet in the cache; the last one is the root
    position: int = 0  # committed tokens of this lane already in the cache (its next position)
    stats: DecodeStats = field(default_factory=DecodeStats)
    logp: list[torch.Tensor] = field(default_factory=list)  # target log p of the generated tokens, on the device
    done: bool = False
    constraint: object = None  # its logits processors and grammar (verify/constraints.py), or None

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt.numel()


@dataclass
class PackedOutput:
    outputs: list[GenerationOutput]
    logprobs: list[list[float]]  # per lane: target log p (temperature 1) of each generated token ([] if not asked)
    kv_entries: int  # target KV entries the run committed (packed: all held at the end; rows: a finished lane's
    # row is handed on, verify/forward.py)
    kv_entries_peak: int  # the same including one step's draft-tree entries
    kv_bytes: int  # bytes of the target KV buffer as allocated
    kv_bytes_used: int  # bytes of those entries (what an exact-size cache holds)
    draft_kv_bytes: int  # bytes of the drafters' own KV buffers (standalone, EAGLE), all lanes
    buffer_bytes: int  # the step's tree buffers: attention mask buffer and the largest logits block


def _state(lane: Lane, ver: Verifier, sampling: Sampling, max_new_tokens: int, draws: torch.Generator | None,
           planned: Budget | None) -> tuple[DecodeState | None, Budget]:
    """The lane's budget (its policy's, or `planned` by the batch's planner), clipped to the tokens left and the
    context, and what its drafter reads to propose within it (None: no tree this step). draws: the drafters'
    random stream (DecodeState.generator)."""
    T = len(lane.tokens)
    given = (lane.policy.budget(T) if planned is None else planned).clip(max_new_tokens - lane.generated)
    if ver.max_len:  # a tree running past the context cannot be verified
        room = ver.max_len - T
        given = Budget(min(given.max_depth, room), min(given.max_nodes, room), given.min_path_prob, given.fixed)
    # after a jump-forward the forced tokens wait in pending: a drafter of the target's hidden states has no
    # features for them until this step's forward feeds them, so it sits this step out
    if given.empty or (getattr(lane.drafter, "hidden_layers", ()) and len(lane.pending) > 1):
        return None, given
    return DecodeState(lane.buf[:T], lane.prompt.numel(), given, sampling.greedy, sampling.temperature or 1.0,
                       None if sampling.greedy else sampling, draws), given


def _proposals(live: list[Lane], states: list[DecodeState | None], groups, clock) -> tuple[list, list]:
    """Each live lane's tree (empty for a None state) and its drafting span: (start stamp, end stamp, lanes that
    share it), read into seconds after the step's read. Lanes whose drafters draft as a group
    (verify/lanes.py lane_groups) propose together, each charged an equal share of the group's time."""
    trees: list[DraftTree | None] = [None] * len(live)
    spans: list = [None] * len(live)
    where = {ln.index: i for i, ln in enumerate(live)}
    for members, group in groups:
        at = [where.get(m) for m in members]  # None: a lane that is done
        asked = [i for i in at if i is not None and states[i] is not None]
        if not asked:
            continue
        t0 = clock.stamp()
        out = group.propose([None if i is None else states[i] for i in at])
        span = (t0, clock.stamp(), len(asked))
        for i in asked:
            trees[i], spans[i] = out[at.index(i)], span
    for i, (ln, state) in enumerate(zip(live, states)):
        if trees[i] is None:
            t0 = clock.stamp()
            trees[i] = ln.drafter.propose(state) if state is not None else DraftTree.empty()
            spans[i] = (t0, clock.stamp(), 1)
    return trees, spans


def _checked(lane: Lane, tree: DraftTree, ver: Verifier, vocab: int):
    """The tree validated (empty if it runs past the context: a drafter that ignored its budget) and under the
    lane's constraint (its ConstrainedStep, or None)."""
    T = len(lane.tokens)
    if ver.max_len and len(tree) > ver.max_len - T:
        tree = DraftTree.empty()
    tree.validate(vocab)
    return tree, lane.constraint.prepare(tree, lane.buf[:T]) if lane.constraint else None


def _verify(ver: Verifier, lanes: list[Lane], trees: list[DraftTree], roots: list[int] | None, sampling, gen,
            layers, clock, logits_to_keep=None, checks=None, prefill=False):
    """One forward over the lanes' pending tokens and trees, the acceptance walks, ONE read. `roots`: the
    logits row of each lane's root when lanes share a piece (best-of-N's prefill); None: one piece per lane.
    checks: per lane, its ConstrainedStep (trees are then their forward trees) or None. prefill: the lanes' first
    forward (Verifier.run)
    Returns (step, logits, hidden, walks, results, top1 of every row, a stamp taken just before the read: every
    stamp before it is complete once the read returns)."""
    shared = roots is not None
    pieces = [Piece(SHARED, 0, lanes[0].pending, trees[0])] if shared else \
        [Piece(ln.index, ln.position, ln.pending, tree) for ln, tree in zip(lanes, trees)]
    step = StepInputs(pieces, ver.model.device) if shared else ver.inputs(pieces, prefill)  # the one upload
    logits, hidden = ver.run(step, layers, logits_to_keep, prefill)
    skip = step.q - logits.shape[0]  # rows whose logits were not kept
    width = step.max_depth
    top1 = logits.argmax(-1)  # (k,): greedy's choice, and what lookahead learns from
    walks = []
    for i, tree in enumerate(trees):
        root, first = (roots[i], step.q) if shared else step.rows(i)
        n, r = len(tree), root - skip
        topo = step.topology[0 if shared else i]
        anc = step.anc[first:first + n, first:first + n] if n else None
        if checks and checks[i]:  # processors and the grammar's mask first, then the rule (verify/constraints.py)
            walks.append(checks[i].walk(logits[r:r + n + 1], sampling, gen, width))
        else:
            walks.append(walk_tree(tree, logits[r:r + n + 1], sampling, gen, topo, anc, width, top1[r:r + n + 1]))
    read_at = clock.stamp()
    on_device = [tree for tree in trees if tree.topology_on_device]  # their topology comes back with the read
    results, host = read_walks(walks, torch.cat([top1] + [tree.payload() for tree in on_device]))  # the one read
    at = top1.numel()
    for tree in on_device:
        size = tree.payload_len
        tree.resolve(host[at:at + size])
        at += size
    return step, logits, hidden, walks, results, host[:top1.numel()], read_at


def static_capacity(stored: int, lanes: int, max_new_tokens: int, widest: int) -> int:
    """KV entries a static run needs: the stored prompts, each lane's new tokens and widest tree (and its root and
    a forced token), and the padding of the largest bucket a step of all lanes can reach."""
    return stored + lanes * (max_new_tokens + widest + 2) + bucket(lanes * (widest + 2))


@torch.no_grad()
def generate_packed(model, prompts, drafters, max_new_tokens: int = 64, sampling: Sampling | None = None,
                    eos_token_id=None, seed: int | None = None, budget="auto",
                    shared_prompt: bool = False, logprobs: bool = True, logits_processor=None, grammar=None,
                    tokenizer=None, jump_forward: bool = True, static: bool = False,
                    compile: bool = False) -> PackedOutput:
    """Decode len(drafters) lanes together. shared_prompt: every lane continues prompts[0], stored once
    (best-of-N); otherwise lane i continues prompts[i] (a batch of prompts of any lengths). logprobs: keep
    the target's log-probability of every generated token (read once per lane at the end).
    logits_processor, grammar, tokenizer, jump_forward: each lane's constraint (verify/decode.generate); each
    lane follows the grammar with a matcher of its own. static: the target's forwards run with static shapes
    (verify/forward.py); compile: and compiled with torch.compile, one graph per bucket (implies static)."""
    sampling = sampling or Sampling()
    require_int("max_new_tokens", max_new_tokens)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    n = len(drafters)
    if n < 1:
        raise ValueError("decode at least one sequence")
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = [as_prompt(p, vocab, "the prompt" if len(prompts) == 1 else f"prompt {i}").to(model.device)
               for i, p in enumerate(prompts)]
    if shared_prompt:
        prompts = prompts[:1] * n
    elif len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompts for {n} drafters")
    for i, d in enumerate(drafters):  # a method's name, say, passed where a drafter goes: one line, before any forward
        if isinstance(d, type):
            raise TypeError(f"drafter {i} is the class {d.__name__}, not a drafter: build one ({d.__name__}(...) or "
                            f"draftkit.make_drafter(name, target))")
        if not all(callable(getattr(d, call, None)) for call in ("reset", "propose", "update")):
            raise TypeError(f"drafter {i} is a {type(d).__name__}, not a drafter: build one with "
                            f"draftkit.make_drafter(name, target)")
    policies = [make_policy(budget, d, model) for d in drafters]
    widest = max(p.cap.max_nodes for p in policies)
    deepest = max(p.cap.max_depth for p in policies)
    stored = prompts[0].numel() if shared_prompt else sum(p.numel() for p in prompts)
    if static or compile:
        ver = static_verifier(model, static_capacity(stored, n, max_new_tokens, widest), compile)
    elif shared_prompt or n == 1:
        ver = Verifier(model, capacity=stored + n * (max_new_tokens + widest + 2))
    else:  # a batch of prompts: a KV row per lane (verify/forward.py, the rows layout)
        ver = Verifier(model, capacity=max(p.numel() for p in prompts) + max_new_tokens + widest + 2, lanes=n)
    for p in prompts:
        check_room(ver, p.numel(), max_new_tokens)
    if widest:  # a drafting run: the checks of its first hand-built mask happen before anything is timed
        ver.check_masks_early()
    for pol in policies:  # a cost-aware policy prices steps on this run's forward path (verify/cost_profile.py)
        if hasattr(pol, "price_on"):
            pol.price_on(ver)
    planner = BatchPlanner.over(policies, ver.rows)  # the lanes' budgets chosen together (verify/batch_plan.py)
    eos = eos_set(model, eos_token_id)
    constraints = [make_constraint(logits_processor, grammar, tokenizer, vocab, eos, jump_forward) for _ in drafters]
    if constraints[0] is not None and (shared_prompt or logprobs):
        raise ValueError("logits processors and grammars apply to lanes of their own prompts without log-probabilities "
                         "(generate, generate_batch), not to best-of-N")
    gen = verifier_generator(seed, model.device)
    draws = drafter_generator(seed, model.device)  # the drafter's stream
    layers = tuple(sorted({i for d in drafters for i in getattr(d, "hidden_layers", ())}))
    clock = clock_for(model)
    carry = Carry(clock)  # what was stamped after a read, settled at the next one
    lanes = []
    for i, (d, pol, p) in enumerate(zip(drafters, policies, prompts)):
        buf = torch.empty(p.numel() + max_new_tokens + deepest + 1, dtype=torch.long, device=model.device)
        buf[:p.numel()] = p
        lanes.append(Lane(i, d, pol, p, sync.to_host(p) if i == 0 or not shared_prompt else list(lanes[0].tokens),
                          buf, pending=p, constraint=constraints[i]))
        pol.start(p.numel())
    if n == 1 and getattr(policies[0], "profile", None) is not None:  # one sequence: its steps padded as measured
        ver.use_row_padding(policies[0].profile.row_padding())
    groups = reset_lanes(drafters, prompts)  # drafters of one draft model propose together (verify/lanes.py)

    # prefill: the shared prompt once, or each lane's prompt on its own (no lane sees another's)
    for group in [lanes] if shared_prompt else [[lane] for lane in lanes]:
        t0 = clock.stamp()
        m = group[0].prompt.numel()
        empty = [DraftTree.empty().validate() for _ in group]
        checks = [ln.constraint.prepare(e, ln.prompt) if ln.constraint else None for ln, e in zip(group, empty)]
        step, logits, hidden, walks, results, _, read_at = _verify(
            ver, group, empty, [m - 1] * len(group) if shared_prompt else None, sampling, gen, layers, clock,
            logits_to_keep=1, checks=checks, prefill=True)
        prefill_s = clock.seconds(t0, read_at)
        c0 = clock.stamp()
        keep = torch.arange(m, device=model.device)
        ver.commit_rows(step, keep, list(range(m)))
        carry.verify_span(c0, clock.stamp())
        for ln, w, (_, _, first) in zip(group, walks, results):
            _commit(ln, [first], w, logits[-1:], None, max_new_tokens, eos, logprobs)
            forced = _jump_forward(ln, [first], max_new_tokens, eos)
            ln.position, ln.pending = m, [first] + forced
            ln.stats.steps.append(StepStats(0, 0, 0, 1 + len(forced), 0.0, prefill_s, prefill=True,
                                            forced=len(forced)))
            if not ln.done:
                sel = _pick(hidden, layers, ln.drafter)
                ln.drafter.update(StepResult(ln.buf[m:m + 1 + len(forced)], ln.prompt, sel, logits[-1:], empty[0], [],
                                             top1=None, new_token_ids=[first] + forced, forced=len(forced)))
            else:
                ver.release(ln.index)

    last_live = lanes
    while True:
        live = ver.in_row_order([ln for ln in lanes if not ln.done])
        if not live:
            break
        last_live = live
        t0 = clock.stamp()
        planning = planner is not None and len(live) > 1  # the last lane alone goes by its own policy
        planned = planner.budgets([ln.policy for ln in live], [len(ln.pending) for ln in live],
                                  [max_new_tokens - ln.generated for ln in live],
                                  [ln.generated / max(len(ln.stats.steps), 1) for ln in live]) \
            if planning else [None] * len(live)
        states, givens = zip(*[_state(ln, ver, sampling, max_new_tokens, draws, plan)
                               for ln, plan in zip(live, planned)])
        budgeted = clock.stamp()
        proposed, spans = _proposals(live, list(states), groups, clock)  # each lane's own drafting span
        trees, checks = [], []
        for ln, tree in zip(live, proposed):
            tree, check = _checked(ln, tree, ver, vocab)
            trees.append(check.forward_tree if check else tree)  # without the nodes its grammar forbids
            checks.append(check)
        t1 = clock.stamp()
        step, logits, hidden, walks, results, top1, read_at = _verify(ver, live, trees, None, sampling, gen,
                                                                      layers, clock, checks=checks)
        # every stamp so far is complete (the read waited for it): read them now, with what the last step owes
        budget_s = clock.seconds(t0, budgeted) / len(live)
        draft_s = [budget_s + carry.take_draft(ln.index) + clock.seconds(a, b) / n  # every lane has its span
                   for ln, (a, b, n) in zip(live, spans)]
        verify_s = clock.seconds(t1, read_at) + carry.take_verify()
        c0 = clock.stamp()
        keep, keep_host = [], []
        for i, (ln, (acc, _, _)) in enumerate(zip(live, results)):
            start, (_, first) = step.starts[i], step.rows(i)
            keep += [torch.arange(start, first, device=model.device), first + walks[i].path[:len(acc)]]
            keep_host += list(range(start, first)) + [first + a for a in acc]
        keep = torch.cat(keep)
        ver.commit_rows(step, keep, keep_host)
        carry.verify_span(c0, clock.stamp())  # the commit: part of the next step's verify time
        if planning:
            planner.observe(step.q, verify_s, any(len(t) for t in trees))  # rows: the padded (lanes, width) batch
        kept = 0
        for i, (ln, tree, given, w, (acc, acc_tokens, bonus)) in enumerate(zip(live, trees, givens, walks, results)):
            root, first = step.rows(i)
            m, rows = first - step.starts[i], logits[root:first + len(tree)]  # the root slot and each node
            own = keep[kept:kept + m + len(acc)]  # this lane's kept rows
            kept += m + len(acc)
            T = len(ln.tokens)
            new = _commit(ln, acc_tokens + [bonus], w, rows, first, max_new_tokens, eos, logprobs, logits)
            forced, check = _jump_forward(ln, new, max_new_tokens, eos), checks[i]
            row_top1 = top1[root:first + len(tree)]
            if check is not None:  # the drafter learns about its own tree
                rows, row_top1 = check.drafter_logits(rows), None if check.walk_nodes is not None else row_top1
                tree, acc = check.tree, check.drafter_nodes(acc)
            ln.stats.steps.append(StepStats(len(tree), tree.max_depth, len(acc), len(new) + len(forced), draft_s[i],
                                            verify_s * (m + len(tree)) / step.used, budget_depth=given.max_depth,
                                            budget_nodes=given.max_nodes,
                                            rejected=bool(tree.children[acc[-1] + 1 if acc else 0]),
                                            lanes=len(live), forced=len(forced),
                                            first_accepted=tree.first_children(acc)))
            if check is not None:
                ln.stats.steps[-1].drafted, ln.stats.steps[-1].pruned = len(trees[i]), check.pruned
            ln.position += m + len(acc)
            sel = _pick(hidden, layers, ln.drafter, own)
            t2 = clock.stamp()
            ln.drafter.update(StepResult(ln.buf[T:T + len(new) + len(forced)], step.ids[own], sel, rows, tree, acc,
                                         top1=row_top1, new_token_ids=new + forced, forced=len(forced)))
            carry.draft_span(ln.index, t2, clock.stamp())  # the update: part of this lane's next drafting time
            if ln.done:  # the drafter saw its last tokens; nothing more to feed
                ver.release(ln.index)
                continue
            ln.policy.observe(ln.stats.steps[-1], len(ln.tokens))
            ln.pending = new[-1:] + forced  # the bonus, then the tokens the grammar forced: fed next
    _settle(carry, lanes, last_live)
    outs = []
    for ln in lanes:
        ln.stats.grammar_complete = ln.constraint.grammar_complete if ln.constraint else None
        seq = ln.buf[:len(ln.tokens)].clone()
        lossless = sampling.lossless or not any(s.drafted for s in ln.stats.steps)  # no draft: target samples only
        outs.append(GenerationOutput(seq[ln.prompt.numel():], seq, ln.stats, lossless=lossless))
    committed = ver.entries()
    caches = {id(d.cache): d.cache for d in drafters if hasattr(getattr(d, "cache", None), "nbytes")}
    draft_kv = sum(c.nbytes() for c in caches.values())  # a group's lanes share one buffer (KV or DFlash context)
    buffers = ver.masks.nbytes() + ver.peak_logits_bytes
    logps = [[float(x) for x in sync.to_host(torch.cat(ln.logp))] if ln.logp else [] for ln in lanes]
    return PackedOutput(outs, logps, committed, ver.peak_entries, ver.kv.nbytes(), ver.kv.used_bytes(committed),
                        draft_kv, buffers)


def _settle(carry: Carry, lanes: list[Lane], last_live: list[Lane]) -> None:
    """The spans stamped after the last step's read, into the stats of the steps that made them (once per run: on
    a device this may wait for the last updates)."""
    for ln in lanes:
        if ln.stats.steps:
            ln.stats.steps[-1].draft_s += carry.take_draft(ln.index)
    commit = carry.take_verify() / len(last_live)
    for ln in last_live:
        ln.stats.steps[-1].verify_s += commit


def _pick(hidden, layers, drafter, rows: torch.Tensor | None = None):
    """The hidden-state layers this drafter asked for, in its order, from the union the forward returned (rows:
    this lane's kept rows); None for a drafter that reads none, also when another lane of the batch does."""
    wanted = tuple(getattr(drafter, "hidden_layers", ()))
    if hidden is None or not wanted:
        return None
    return tuple(hidden[layers.index(i)] if rows is None else hidden[layers.index(i)].index_select(0, rows)
                 for i in wanted)


def _commit(lane: Lane, new: list[int], w, rows: torch.Tensor, first: int | None, max_new_tokens: int,
            eos: set[int], logprobs: bool, logits: torch.Tensor | None = None) -> list[int]:
    """Append the step's committed tokens (new: the accepted tokens, then the bonus; cut at the budget and
    after EOS) on the host and, from the walk's device tensors, to the lane's device buffer; keep their
    target log p on the device if asked. rows[0] is the root slot's logits; node slots sit at `first` on."""
    accepted = len(new) - 1
    new, done = finish(new, max_new_tokens - lane.generated, eos)
    k, T = len(new), len(lane.tokens)
    lane.buf[T:T + k] = torch.cat([w.tokens[:accepted], w.bonus[None]])[:k]
    if logprobs:  # token j was drawn at the root slot (j = 0) or at the j-th accepted node's slot
        slots = rows[:1] if first is None else torch.cat([rows[:1], logits[first + w.path[:k - 1]]])
        lane.logp.append(slots[:k].float().log_softmax(-1).gather(1, lane.buf[T:T + k, None])[:, 0])
    lane.tokens += new
    lane.done = done
    return new


def _jump_forward(lane: Lane, new: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    """Advance the lane's grammar by the step's committed tokens `new` (already appended) and append the tokens
    it then forces (committed without a forward; none once the lane is done). Returns those tokens."""
    if lane.constraint is None:
        return []
    T = len(lane.tokens) - len(new)
    forced = lane.constraint.commit(lane.buf[:T], new, max_new_tokens - (T - lane.prompt.numel()), eos)
    if forced:
        k = len(lane.tokens)
        lane.buf[k:k + len(forced)] = torch.tensor(forced, device=lane.buf.device)
        lane.tokens += forced
        lane.done = bool(eos & set(forced)) or lane.generated >= max_new_tokens
    return forced


def kv_entries_independent(prompt_len: int, lengths: list[int]) -> int:
    """Entries N independent sequences would hold: each its own prompt and its generated tokens but the last."""
    return sum(prompt_len + max(l - 1, 0) for l in lengths)
