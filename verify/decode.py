"""The decoding loop: budget, propose, verify in one forward, accept, commit, update.

Plain autoregressive decoding is this same loop with `NoDrafter` (the empty
tree), so the baseline and every method share every line but the drafter.
The first step is the prefill: the whole prompt goes in as the prefix and the
tree is empty; it commits the first new token.

Per step the loop itself does: one target forward, one host read (inside the
acceptance rule: the accepted path and the bonus token), one small copy of the
committed tokens into a preallocated token buffer, and an O(accepted) KV
commit. Everything else it touches is host-side Python over a handful of ints.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from draftkit.verify.accept import Sampling, accept, drafter_generator, verifier_generator
from draftkit.verify.budget import BudgetPolicy, make_policy
from draftkit.verify.contract import DecodeState, Drafter, DraftTree, NoDrafter, StepResult
from draftkit.verify.forward import Verifier
from draftkit.verify.stats import DecodeStats, StepStats
from draftkit.verify.timing import clock_for


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # (new,) long: generated tokens only
    sequence: torch.Tensor  # (prompt + new,) long
    stats: DecodeStats
    lossless: bool  # False only under typical acceptance


def as_prompt(input_ids, vocab_size: int) -> torch.Tensor:
    """A 1-D long tensor of valid token ids, or a ValueError that says what is wrong."""
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"generate decodes one sequence; got a batch of {ids.shape[0]}")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"the prompt must hold at least one token; got shape {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"the prompt must be integer token ids, got {ids.dtype}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size}); got min {int(ids.min())}, "
                         f"max {int(ids.max())}")
    return ids.long()


def finish(new: list[int], remaining: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut at the tokens still allowed and after the first EOS. Returns (tokens to commit, done)."""
    for i, t in enumerate(new[:remaining]):
        if t in eos:
            return new[: i + 1], True
    return new[:remaining], len(new) >= remaining


def eos_set(model, eos_token_id) -> set[int]:
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    return set(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else {int(eos_token_id)}


def hidden_rows(hidden, prefix_len: int, accepted: list[int]):
    """The hidden-state rows of the prefix and the accepted nodes: a view when they are a prefix."""
    if hidden is None:
        return None
    if accepted == list(range(len(accepted))):
        return tuple(h[:prefix_len + len(accepted)] for h in hidden)
    kept = torch.tensor(list(range(prefix_len)) + [prefix_len + a for a in accepted], device=hidden[0].device)
    return tuple(h.index_select(0, kept) for h in hidden)


def check_room(verifier: Verifier, prompt_len: int, max_new_tokens: int) -> None:
    if verifier.max_len and prompt_len + max_new_tokens > verifier.max_len:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"model's context of {verifier.max_len} positions")


@torch.no_grad()
def generate(model, input_ids, drafter: Drafter | None = None, max_new_tokens: int = 64,
             sampling: Sampling | None = None, eos_token_id=None, seed: int | None = None,
             budget: BudgetPolicy | str = "auto") -> GenerationOutput:
    """Generate up to max_new_tokens after input_ids (1-D or (1, T)) with speculative decoding.

    eos_token_id: int, list or None (None: the model's generation_config; pass [] to never stop).
    budget: how much the drafter may draft each step: "auto" (default: the cost-aware controller of
    verify/controller.py, never above the drafter's cap), "fixed" (the drafter's cap every step)
    or a BudgetPolicy.
    """
    drafter = drafter or NoDrafter()
    sampling = sampling or Sampling()
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    policy = make_policy(budget, drafter, model)
    cap = policy.cap
    verifier = Verifier(model, capacity=0)
    prompt = as_prompt(input_ids, verifier.vocab_size).to(model.device)
    check_room(verifier, prompt.numel(), max_new_tokens)
    verifier.kv.reserve(prompt.numel() + max_new_tokens + cap.max_nodes + 1)
    eos = eos_set(model, eos_token_id)
    gen = verifier_generator(seed, model.device)
    draws = drafter_generator(seed, model.device)  # the drafter's stream
    layers = tuple(getattr(drafter, "hidden_layers", ()))
    clock = clock_for(model)

    drafter.reset(prompt)
    policy.start(prompt.numel())
    T0 = prompt.numel()
    buf = torch.empty(T0 + max_new_tokens + cap.max_depth + 1, dtype=torch.long, device=prompt.device)
    buf[:T0] = prompt
    T = T0  # committed tokens in buf
    pending = prompt  # committed tokens not yet in the target cache; the last one is the root
    stats = DecodeStats()
    done = False
    while not done:
        remaining = max_new_tokens - (T - T0)
        t0 = clock.now()
        given = None
        tree = DraftTree.empty(prompt.device)
        if stats.steps:
            given = policy.budget(T).clip(remaining)
            if verifier.max_len:  # a tree running past the context cannot be verified
                room = verifier.max_len - T
                given.max_nodes = min(given.max_nodes, room)
                given.max_depth = min(given.max_depth, room)
            if not given.empty:
                state = DecodeState(buf[:T], T0, given, sampling.greedy, sampling.temperature or 1.0,
                                    None if sampling.greedy else sampling, draws)
                tree = drafter.propose(state)
                if verifier.max_len and len(tree) > verifier.max_len - T:  # a drafter that ignored the budget
                    tree = DraftTree.empty(prompt.device)
        tree.validate(verifier.vocab_size)
        t1 = clock.now()
        m = pending.numel()
        logits, hidden = verifier.forward(pending, tree, layers)
        acc, bonus = accept(tree, logits, sampling, gen)
        verifier.commit(m, acc)
        tokens = tree.host_tokens
        new, done = finish([tokens[a] for a in acc] + [bonus], remaining, eos)
        buf[T:T + len(new)] = torch.tensor(new, device=buf.device) if len(new) > 1 else new[0]
        T += len(new)
        t2 = clock.now()
        step = StepStats(len(tree), tree.max_depth, len(acc), len(new), t1 - t0, t2 - t1,
                         prefill=len(stats.steps) == 0, budget_depth=given.max_depth if given else 0,
                         budget_nodes=given.max_nodes if given else 0,
                         rejected=bool(tree.children[acc[-1] + 1 if acc else 0]))
        stats.steps.append(step)
        fed = torch.cat([pending, tree.tokens[acc]]) if acc else pending
        drafter.update(StepResult(new_tokens=buf[T - len(new):T], fed_tokens=fed,
                                  hidden=hidden_rows(hidden, m, acc), logits=logits, tree=tree, accepted=acc))
        step.draft_s += clock.now() - t2
        if done:  # the drafter saw the last tokens too (a global cache keeps them for later requests)
            break
        policy.observe(step, T)
        pending = buf[T - 1:T]
    seq = buf[:T].clone()
    return GenerationOutput(seq[T0:], seq, stats, lossless=sampling.lossless)
