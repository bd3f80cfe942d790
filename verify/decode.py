"""The decoding loop: budget, propose, verify in one forward, accept, commit, update.

Plain autoregressive decoding is this same loop with `NoDrafter` (the empty
tree), so the baseline and every method share every line but the drafter.
The first step is the prefill: the whole prompt goes in as the prefix and the
tree is empty; it commits the first new token.

One sequence is the batch-of-one case of the packed loop (verify/packed.py):
per step one target forward, one upload of the step's layout, one host read
(every lane's accepted path and bonus token), and an O(accepted) KV commit
indexed on the device. This module holds what that loop checks and cuts.
"""
from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from draftkit.verify.accept import Sampling
from draftkit.verify.budget import BudgetPolicy
from draftkit.verify.contract import Budget, Drafter, NoDrafter
from draftkit.verify.stats import DecodeStats


@dataclass
class GenerationOutput:
    tokens: torch.Tensor  # (new,) long: generated tokens only
    sequence: torch.Tensor  # (prompt + new,) long
    stats: DecodeStats
    lossless: bool  # False only when typical acceptance judged drafts under sampling


def as_prompt(input_ids, vocab_size: int, name: str = "the prompt") -> torch.Tensor:
    """A 1-D long tensor of valid token ids, or a ValueError / TypeError that says what is wrong (`name`: which
    prompt)."""
    if isinstance(input_ids, str):
        raise TypeError(f"{name} is text; pass its token ids (tokenizer(text).input_ids)")
    if isinstance(input_ids, Mapping):  # a tokenizer's output (BatchEncoding) or another dict
        raise TypeError(f"{name} is a {type(input_ids).__name__}; pass token ids (its ['input_ids'])")
    try:
        ids = torch.as_tensor(input_ids)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be token ids (a list, tensor or array of ints); got a "
                        f"{type(input_ids).__name__}") from None
    shape = tuple(ids.shape)
    if ids.dim() == 2:
        if ids.shape[0] != 1:
            raise ValueError(f"generate decodes one sequence; got a batch of {ids.shape[0]}")
        ids = ids[0]
    if ids.dim() != 1:
        raise ValueError(f"{name} must be 1-D or (1, T) token ids; got shape {shape}")
    if ids.numel() == 0:
        raise ValueError(f"{name} must hold at least one token; got shape {shape}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be integer token ids, got {ids.dtype}")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"{name}'s token ids must lie in [0, {vocab_size}); got min {int(ids.min())}, "
                         f"max {int(ids.max())}")
    return ids.long()


def finish(new: list[int], remaining: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut at the tokens still allowed and after the first EOS. Returns (tokens to commit, done)."""
    for i, t in enumerate(new[:remaining]):
        if t in eos:
            return new[: i + 1], True
    return new[:remaining], len(new) >= remaining


def eos_set(model, eos_token_id) -> set[int]:
    """The stop tokens: eos_token_id (an id, or any collection of ids: list, tuple, set, tensor), or None for the
    model's generation_config's. A given id outside the vocabulary (-1, say) could never stop: an error."""
    given = eos_token_id is not None
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return set()
    ids = eos_token_id.reshape(-1).tolist() if isinstance(eos_token_id, torch.Tensor) else eos_token_id
    try:
        out = {operator.index(i) for i in ids} if isinstance(ids, Iterable) else {operator.index(ids)}
    except TypeError:
        raise TypeError(f"eos_token_id must be a token id or a collection of token ids, got {eos_token_id!r}") from None
    vocab = model.get_output_embeddings().weight.shape[0]
    bad = sorted(i for i in out if not 0 <= i < vocab)
    if given and bad:
        raise ValueError(f"eos_token_id {bad[0]} is not a token id of this model (0..{vocab - 1}); pass [] to never "
                         "stop")
    return out


def check_room(verifier, prompt_len: int, max_new_tokens: int) -> None:
    if verifier.max_len and prompt_len + max_new_tokens > verifier.max_len:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                         f"model's context of {verifier.max_len} positions")


def generate(model, input_ids, drafter: Drafter | None = None, max_new_tokens: int = 64,
             sampling: Sampling | None = None, eos_token_id=None, seed: int | None = None,
             budget: BudgetPolicy | Budget | str = "auto", logits_processor=None, grammar=None, tokenizer=None,
             jump_forward: bool = True, compile: bool = False) -> GenerationOutput:
    """Generate up to max_new_tokens after input_ids (1-D or (1, T)) with speculative decoding.

    eos_token_id: int, list or None (None: the model's generation_config; pass [] to never stop).
    budget: how much the drafter may draft each step: "auto" (default: the cost-aware controller of
    verify/controller.py, never above the drafter's cap), "fixed" (the drafter's cap every step), a Budget
    (`Budget(max_depth, max_nodes)` every step, within the drafter's cap) or a BudgetPolicy. This is the packed
    loop (verify/packed.py) with one lane.
    logits_processor: a transformers LogitsProcessorList (or list), applied at every tree node with that node's
    own prefix as `generate` applies it (verify/constraints.py). grammar: a draftkit Grammar (or a JSON-schema
    dict) the output must follow; it needs `tokenizer` (the target's) to compile. jump_forward: commit the
    tokens the grammar forces without a forward.
    compile: run the target's verify forward with static shapes (the step padded to a bucket of 1, 2, 4, ..., 64,
    then multiples of 64 rows; a KV buffer and mask of fixed width) compiled by torch.compile, CUDA graphs on a
    GPU. The first steps of each bucket pay its compile; the output is the same as without it.
    """
    from draftkit.verify.packed import generate_packed

    vocab = model.get_output_embeddings().weight.shape[0]
    prompt = as_prompt(input_ids, vocab)
    return generate_packed(model, [prompt], [drafter or NoDrafter()], max_new_tokens, sampling, eos_token_id, seed,
                           budget, logprobs=False, logits_processor=logits_processor, grammar=grammar,
                           tokenizer=tokenizer, jump_forward=jump_forward, compile=compile).outputs[0]
