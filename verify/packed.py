"""Several sequences decoded together: one target forward per step for all of them.

The sequences are packed into ONE row of the KV buffer. Every committed entry has an
owner: the sequence ("lane") it belongs to, or SHARED for a prefix every lane sees
(best-of-N's prompt: N samples are N branches of one tree hanging off the prompt,
stored once). A step's input is the concatenation, lane by lane, of each live lane's
pending tokens and draft tree:

    input:   [pending_0 tree_0] [pending_1 tree_1] ...          (q tokens, one row)
    sees:    committed entries it owns or SHARED, then its own block (verify/tree.py)

Packing instead of padding: lanes accept different numbers of tokens every step
(ragged) and finish at different steps, and neither leaves holes to pad: a lane that
finished simply stops contributing tokens, and every lane's accepted entries are
committed in place by one O(accepted) KV commit. The price is that attention runs
over every lane's columns and masks the others' away, which is cheap while q and the
total context stay small (CPU, small batches) and is what per-row buffers would fix
at large batch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from draftkit.verify.accept import Sampling, accept, drafter_generator, verifier_generator
from draftkit.verify.budget import make_policy
from draftkit.verify.cache import KVBuffer
from draftkit.verify.contract import DecodeState, DraftTree, StepResult
from draftkit.verify.decode import GenerationOutput, as_prompt, check_room, eos_set, finish
from draftkit.verify.forward import Verifier
from draftkit.verify.stats import DecodeStats, StepStats
from draftkit.verify.timing import clock_for
from draftkit.verify.tree import verify_block, verify_offsets

SHARED = -1


@dataclass
class Lane:
    """One sequence: its drafter and budget policy, what it committed, what it still has to feed."""

    index: int
    drafter: object
    policy: object
    prompt: torch.Tensor
    tokens: list[int]
    pending: torch.Tensor  # committed tokens not yet in the cache; the last one is the root
    position: int  # committed tokens of this lane already in the cache (its next position)
    stats: DecodeStats = field(default_factory=DecodeStats)
    logprobs: list[float] = field(default_factory=list)  # target log p of each generated token (temperature 1)
    done: bool = False

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt.numel()


class PackedVerifier(Verifier):
    """A Verifier whose one KV row holds many lanes, with an owner per committed entry."""

    def __init__(self, model, capacity: int):
        super().__init__(model, capacity=capacity)
        self.owner = torch.full((capacity,), SHARED, dtype=torch.long, device=model.device)
        self.peak_entries = 0
        self.peak_logits_bytes = 0

    def forward_lanes(self, inputs: torch.Tensor, lane_of: torch.Tensor, block: torch.Tensor,
                      position_ids: torch.Tensor, hidden_layers, logits_to_keep: int):
        """inputs (q,) tokens of every lane; lane_of (q,) their lane; block (q, q) bool (block diagonal)."""
        w = self.kv.lengths[0]
        owner = self.owner[:w]
        past = (owner[None, :] == lane_of[:, None]) | (owner[None, :] == SHARED)  # (q, W)
        allowed = torch.cat([past, block], 1)
        masks = self.masks
        masks._room(1, allowed.shape[0], allowed.shape[1])
        view = masks.buf[0, 0, :allowed.shape[0], :allowed.shape[1]]
        view.zero_().masked_fill_(~allowed, masks.min)
        masks.dirty = [(0, allowed.shape[0], 0, allowed.shape[1])]
        out = self.model(input_ids=inputs[None], cache=self.kv, use_cache=True, position_ids=position_ids[None],
                         attention_mask=masks.buf[:1, :, :allowed.shape[0], :allowed.shape[1]],
                         logits_to_keep=logits_to_keep, output_hidden_states=bool(hidden_layers))
        self.kv.end_forward()
        self.peak_entries = max(self.peak_entries, self.kv.lengths[0] + self.kv.pending)
        self.peak_logits_bytes = max(self.peak_logits_bytes, out.logits.numel() * out.logits.element_size())
        states = tuple(out.hidden_states[i][0] for i in hidden_layers) if hidden_layers else None
        return out.logits[0], states

    def commit_lanes(self, keep: list[int], owners: list[int]) -> None:
        w = self.kv.lengths[0]
        if w + len(keep) > self.owner.numel():
            grown = torch.full((2 * (w + len(keep)),), SHARED, dtype=torch.long, device=self.owner.device)
            grown[:self.owner.numel()] = self.owner
            self.owner = grown
        self.kv.commit(keep)
        if owners:
            self.owner[w:w + len(owners)] = torch.tensor(owners, device=self.owner.device)


@dataclass
class PackedOutput:
    outputs: list[GenerationOutput]
    logprobs: list[list[float]]  # per lane: target log p (temperature 1) of each generated token
    kv_entries: int  # the most target KV entries held at once (between steps)
    kv_entries_peak: int  # the same including one step's draft-tree entries
    kv_bytes: int  # bytes of the target KV buffer as allocated
    kv_bytes_used: int  # bytes of the target KV entries held at the end (what an exact-size cache holds)
    draft_kv_bytes: int  # bytes of the drafters' own KV buffers (standalone, EAGLE), all lanes
    buffer_bytes: int  # the step's tree buffers: attention mask buffer and the largest logits block


def _first_tokens(logits_last: torch.Tensor, lanes, sampling: Sampling, gen) -> list[int]:
    """The token each lane commits at the end of its prompt (the prefill's bonus)."""
    empty = DraftTree.empty(logits_last.device).validate()
    return [accept(empty, logits_last[None], sampling, gen)[1] for _ in lanes]


@torch.no_grad()
def generate_packed(model, prompts, drafters, max_new_tokens: int = 64, sampling: Sampling | None = None,
                    eos_token_id=None, seed: int | None = None, budget="auto",
                    shared_prompt: bool = False) -> PackedOutput:
    """Decode len(drafters) lanes together. shared_prompt: every lane continues prompts[0], stored once
    (best-of-N); otherwise lane i continues prompts[i] (a batch of prompts of any lengths)."""
    sampling = sampling or Sampling()
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    n = len(drafters)
    if n < 1:
        raise ValueError("decode at least one sequence")
    vocab = model.get_output_embeddings().weight.shape[0]
    prompts = [as_prompt(p, vocab).to(model.device) for p in prompts]
    if shared_prompt:
        prompts = prompts[:1] * n
    elif len(prompts) != n:
        raise ValueError(f"got {len(prompts)} prompts for {n} drafters")
    policies = [make_policy(budget, d, model) for d in drafters]
    widest = max(p.cap.max_nodes for p in policies)
    stored = prompts[0].numel() if shared_prompt else sum(p.numel() for p in prompts)
    ver = PackedVerifier(model, capacity=stored + n * (max_new_tokens + widest + 2))
    for p in prompts:
        check_room(ver, p.numel(), max_new_tokens)
    eos = eos_set(model, eos_token_id)
    gen = verifier_generator(seed, model.device)
    draws = drafter_generator(seed, model.device)  # the drafter's stream
    layers = tuple(sorted({i for d in drafters for i in getattr(d, "hidden_layers", ())}))
    lanes = [Lane(i, d, pol, p, p.tolist(), p, 0) for i, (d, pol, p) in enumerate(zip(drafters, policies, prompts))]

    clock = clock_for(model)
    # prefill: the shared prompt once, or each lane's prompt on its own (no lane sees another's)
    t0 = clock.now()
    groups = [lanes] if shared_prompt else [[lane] for lane in lanes]
    for group in groups:
        lane = group[0]
        m = lane.prompt.numel()
        owner = SHARED if shared_prompt else lane.index
        lane_of = torch.full((m,), owner, device=model.device)
        block = torch.ones(m, m, dtype=torch.bool, device=model.device).tril_()
        logits, hidden = ver.forward_lanes(lane.prompt, lane_of, block, torch.arange(m, device=model.device), layers, 1)
        ver.commit_lanes(list(range(m)), [owner] * m)
        for ln, tok in zip(group, _first_tokens(logits[-1], group, sampling, gen)):
            ln.position, ln.pending = m, torch.tensor([tok], device=model.device)
            _commit_tokens(ln, [tok], logits[-1:], [0], max_new_tokens, eos)
            ln.drafter.reset(ln.prompt)
            ln.policy.start(m)
            ln.stats.steps.append(StepStats(0, 0, 0, 1, 0.0, clock.now() - t0, prefill=True))
            if not ln.done:
                sel = None if hidden is None else _pick(hidden, layers, ln.drafter)
                ln.drafter.update(StepResult(torch.tensor([tok], device=model.device), ln.prompt, sel, logits[-1:],
                                             DraftTree.empty(model.device).validate(), []))

    while True:
        live = [ln for ln in lanes if not ln.done]
        if not live:
            break
        trees, givens, draft_s = [], [], []  # each lane's own drafting time, not the batch's
        for ln in live:
            t0 = clock.now()
            remaining = max_new_tokens - ln.generated
            given = ln.policy.budget(len(ln.tokens)).clip(remaining)
            tree = DraftTree.empty(model.device)
            if not given.empty:
                state = DecodeState(torch.tensor(ln.tokens, device=model.device), ln.prompt.numel(), given,
                                    sampling.greedy, sampling.temperature or 1.0,
                                    None if sampling.greedy else sampling, draws)
                tree = ln.drafter.propose(state)
            trees.append(tree.validate(vocab))
            givens.append(given)
            draft_s.append(clock.now() - t0)
        t1 = clock.now()
        ids, lane_of, blocks, pos, starts = [], [], [], [], []
        for ln, tree in zip(live, trees):
            m = ln.pending.numel()
            starts.append(sum(len(x) for x in ids))
            ids.append(torch.cat([ln.pending, tree.tokens]) if len(tree) else ln.pending)
            lane_of.append(torch.full((m + len(tree),), ln.index, device=model.device))
            blocks.append(verify_block(tree, m))
            pos.append(ln.position + verify_offsets(tree, m))
        inputs = torch.cat(ids)
        logits, hidden = ver.forward_lanes(inputs, torch.cat(lane_of), torch.block_diag(*blocks), torch.cat(pos),
                                           layers, inputs.numel())
        keep, owners = [], []
        for ln, tree, given, start in zip(live, trees, givens, starts):
            m = ln.pending.numel()
            rows = logits[start + m - 1:start + m + len(tree)]  # the root slot and each node
            acc, bonus = accept(tree, rows, sampling, gen)
            keep += [start + i for i in range(m)] + [start + m + a for a in acc]
            owners += [ln.index] * (m + len(acc))
            slots = [0] + [a + 1 for a in acc]
            new = _commit_tokens(ln, [tree.host_tokens[a] for a in acc] + [bonus], rows, slots, max_new_tokens, eos)
            ln.stats.steps.append(StepStats(len(tree), tree.max_depth, len(acc), len(new), 0.0, 0.0,
                                            budget_depth=given.max_depth, budget_nodes=given.max_nodes,
                                            rejected=bool(tree.children[acc[-1] + 1 if acc else 0]),
                                            lanes=len(live)))
            ln._step = (tree, acc, start, m, rows, new)
        ver.commit_lanes(keep, owners)
        verify_s = clock.now() - t1
        for ln, own_draft_s, tree in zip(live, draft_s, trees):  # a lane's share of the forward: its tokens' share
            step = ln.stats.steps[-1]
            step.draft_s, step.verify_s = own_draft_s, verify_s * (ln.pending.numel() + len(tree)) / inputs.numel()
        for ln in live:
            tree, acc, start, m, rows, new = ln._step
            ln.position += m + len(acc)
            fed = torch.cat([ln.pending, tree.tokens[acc]]) if acc else ln.pending
            sel = None
            if hidden is not None:
                idx = torch.tensor([start + i for i in range(m)] + [start + m + a for a in acc], device=model.device)
                sel = tuple(h.index_select(0, idx) for h in _pick(hidden, layers, ln.drafter))
            t2 = clock.now()
            ln.drafter.update(StepResult(torch.tensor(new, device=model.device), fed, sel, rows, tree, acc))
            ln.stats.steps[-1].draft_s += clock.now() - t2
            if ln.done:  # the drafter saw its last tokens; nothing more to feed
                continue
            ln.policy.observe(ln.stats.steps[-1], len(ln.tokens))
            ln.pending = torch.tensor(new[-1:], device=model.device)
    outs = []
    for ln in lanes:
        seq = torch.tensor(ln.tokens, device=model.device)
        outs.append(GenerationOutput(seq[ln.prompt.numel():], seq, ln.stats, lossless=sampling.lossless))
    committed = ver.kv.lengths[0]
    draft_kv = sum(d.cache.nbytes() for d in drafters if isinstance(getattr(d, "cache", None), KVBuffer))
    buffers = ver.masks.buf.numel() * ver.masks.buf.element_size() + ver.peak_logits_bytes
    return PackedOutput(outs, [ln.logprobs for ln in lanes], committed, ver.peak_entries, ver.kv.nbytes(),
                        ver.kv.used_bytes(), draft_kv, buffers)


def _pick(hidden, layers, drafter):
    """The hidden-state layers this drafter asked for, in its order, from the union the forward returned."""
    wanted = tuple(getattr(drafter, "hidden_layers", ()))
    return tuple(hidden[layers.index(i)] for i in wanted) if wanted else None


def _commit_tokens(lane: Lane, new: list[int], rows: torch.Tensor, slots: list[int], max_new_tokens: int,
                   eos: set[int]) -> list[int]:
    """Append the step's committed tokens (cut at the budget and after EOS) and their target log p."""
    new, done = finish(new, max_new_tokens - lane.generated, eos)
    logp = rows[slots[:len(new)]].float().log_softmax(-1)
    lane.logprobs += logp.gather(1, torch.tensor(new, device=rows.device)[:, None])[:, 0].tolist()
    lane.tokens += new
    lane.done = done
    return new


def kv_entries_independent(prompt_len: int, lengths: list[int]) -> int:
    """Entries N independent sequences would hold: each its own prompt and its generated tokens but the last."""
    return sum(prompt_len + max(l - 1, 0) for l in lengths)
