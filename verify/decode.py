"""The decoding loop: propose, verify in one forward, accept, compact, update.

Plain autoregressive decoding is this same loop with `NoDrafter` (the empty
tree), so the baseline and every method share every line but the drafter.
The first step is the prefill: the whole prompt goes in as the prefix and the
tree is empty; it commits the first new token.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from drafters.base import DecodeState, Drafter, DraftTree, NoDrafter, StepResult
from verify.accept import Sampling, accept
from verify.cache import compact
from verify.forward import Verifier
from verify.stats import DecodeStats, StepStats


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # (new,) long: generated tokens only
    sequence: torch.Tensor  # (prompt + new,) long
    stats: DecodeStats
    lossless: bool  # False only under typical acceptance


def _as_prompt(input_ids, vocab_size: int) -> torch.Tensor:
    ids = torch.as_tensor(input_ids)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"draftkit decodes one sequence at a time; got a batch of {ids.shape[0]}")
        ids = ids[0]
    if ids.dim() != 1 or ids.numel() == 0:
        raise ValueError(f"the prompt must hold at least one token; got shape {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"the prompt must be integer token ids, got {ids.dtype}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size}); got min {int(ids.min())}, max {int(ids.max())}")
    return ids.long()


def _finish(new: list[int], budget: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut at the budget and after the first EOS. Returns (tokens to commit, done)."""
    for i, t in enumerate(new[:budget]):
        if t in eos:
            return new[: i + 1], True
    return new[:budget], len(new) >= budget


def _eos_set(model, eos_token_id) -> set[int]:
    if eos_token_id is None:
        eos_token_id = getattr(model.generation_config, "eos_token_id", None) if hasattr(model, "generation_config") else None
    if eos_token_id is None:
        return set()
    return set(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else {int(eos_token_id)}


@torch.no_grad()
def generate(model, input_ids, drafter: Drafter | None = None, max_new_tokens: int = 64,
             sampling: Sampling | None = None, eos_token_id=None, seed: int | None = None) -> GenerationOutput:
    """Generate up to max_new_tokens after input_ids (1-D or (1, T)) with speculative decoding.

    eos_token_id: int, list or None (None: the model's generation_config; pass [] to never stop).
    """
    drafter = drafter or NoDrafter()
    sampling = sampling or Sampling()
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    verifier = Verifier(model)
    prompt = _as_prompt(input_ids, verifier.vocab_size).to(model.device)
    if verifier.max_len and prompt.numel() + max_new_tokens > verifier.max_len:
        raise ValueError(f"prompt ({prompt.numel()} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"model's context of {verifier.max_len} positions")
    eos = _eos_set(model, eos_token_id)
    gen = torch.Generator(device="cpu").manual_seed(seed) if seed is not None else None
    want_hidden = bool(getattr(drafter, "needs_hidden_states", False))

    drafter.reset(prompt)
    tokens = prompt.tolist()
    pending = prompt  # committed tokens not yet in the target cache; the last one is the root
    stats = DecodeStats()
    done = False
    while not done:
        budget = max_new_tokens - (len(tokens) - prompt.numel())
        t0 = time.perf_counter()
        if stats.steps:
            state = DecodeState(torch.tensor(tokens, device=prompt.device), prompt.numel(), budget, sampling.greedy,
                                sampling.temperature or 1.0)
            tree = drafter.propose(state).validate(verifier.vocab_size)
        else:
            tree = DraftTree.empty(prompt.device).validate()
        room = verifier.max_len - verifier.cache_len - pending.numel() if verifier.max_len else len(tree)
        if len(tree) > room:  # a tree running past the context: verify none of it rather than crash
            tree = DraftTree.empty(prompt.device).validate()
        t1 = time.perf_counter()
        logits, hidden = verifier.forward(pending, tree, want_hidden)
        acc, bonus = accept(tree, logits, sampling, gen)
        m = pending.numel()
        verifier.cache_len = compact(verifier.cache, verifier.cache_len, m, len(tree), acc)
        drafted = tree.tokens[acc].tolist() if acc else []
        new, done = _finish(drafted + [bonus], budget, eos)
        tokens.extend(new)
        t2 = time.perf_counter()
        stats.steps.append(StepStats(len(tree), max(tree.depth), len(acc), len(new), t1 - t0, t2 - t1,
                                     prefill=len(stats.steps) == 0))
        if done:
            break
        fed = torch.cat([pending, tree.tokens[acc]]) if acc else pending
        if hidden is not None:  # rows of the prefix and the accepted nodes only
            kept = torch.tensor(list(range(m)) + [m + a for a in acc], device=prompt.device)
            hidden = tuple(h.index_select(0, kept) for h in hidden)
        drafter.update(StepResult(
            new_tokens=torch.tensor(new, device=prompt.device), fed_tokens=fed, hidden=hidden,
            logits=logits, tree=tree, accepted=acc))
        stats.steps[-1].draft_s += time.perf_counter() - t2
        pending = torch.tensor([bonus], device=prompt.device)
    seq = torch.tensor(tokens, device=prompt.device)
    return GenerationOutput(seq[prompt.numel():], seq, stats, lossless=sampling.lossless)
