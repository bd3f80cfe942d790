"""draftkit: speculative decoding with several drafters behind one lossless tree verifier.

    import draftkit as dk
    target, tok = dk.load_target()                      # the shipped default, or any HF id / path
    out = dk.generate(target, tok("def add(a, b):").input_ids, dk.make_drafter("eagle", target), max_new_tokens=64)
    print(tok.decode(out.tokens), out.stats.tau)

This module only wires names to classes; the work happens in drafters/ and verify/.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

# In a checkout (scripts run as `python eval/compare.py`, tests, `pip install -e .`), the repository's top-level
# folders verify/, drafters/, train/ and eval/ are this package's subpackages draftkit.verify, ...; an installed
# wheel holds them inside draftkit/ (pyproject's package-dir), so nothing else lands in site-packages.
_CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isfile(os.path.join(_CHECKOUT, "verify", "contract.py")) and _CHECKOUT not in __path__:
    __path__.append(_CHECKOUT)

from draftkit.verify.contract import Budget, DecodeState, Drafter, DraftTree, NoDrafter, StepResult
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import GenerationOutput
from draftkit.verify.decode import generate as _generate
from draftkit.verify.grammar import Grammar, GrammarError

from draftkit.zoo import ZooError

from draftkit.drafters.registry import REGISTRY, build
from draftkit.models import load_model, load_target

DRAFTERS = tuple(REGISTRY)

__all__ = ["BestOfN", "Budget", "DRAFTERS", "best_of_n", "generate_batch", "lane_drafters", "DecodeState", "DraftTree",
           "Drafter", "GenerationOutput", "Grammar", "GrammarError", "NoDrafter", "Sampling", "StepResult", "ZooError",
           "generate", "load_model", "load_target", "make_drafter"]


def make_drafter(method: str, target, path: str | None = None, tokenizer=None, **flags) -> Drafter:
    """A drafter by method name (see `DRAFTERS`). `path`: the draft model / heads to load (None: the
    shipped default). `tokenizer`: the target's, to check a standalone draft's tokenizer against it.
    Flags are the method's settings (drafters.registry): max_depth, max_nodes, and its own."""
    if method in ("none", "plain"):
        return NoDrafter()
    return build(method, target, path, tokenizer, **flags)


@functools.wraps(_generate)
def generate(target, input_ids, drafter=None, *args, **kwargs) -> GenerationOutput:
    if isinstance(drafter, str):  # a method's name, as generate_batch takes it: its shipped draft
        drafter = make_drafter(drafter, target)
    return _generate(target, input_ids, drafter, *args, **kwargs)


generate.__doc__ = _generate.__doc__ + """
    drafter: a Drafter, a method's name (`DRAFTERS`: built with its shipped draft, learning nothing across calls;
    build it once with `make_drafter` to keep what its controller learns), or None (plain decoding)."""
generate.__module__ = __name__  # help(dk.generate) names draftkit, where users call it from


def lane_drafters(method: str, target, n: int, path: str | None = None, tokenizer=None, **flags) -> list[Drafter]:
    """n drafters of one method for the n lanes of a batch, each with a state of its own. Drafters that can
    (`lane()`: EAGLE) share the first one's model, which loads once and lets the lanes draft together."""
    if n < 1:
        raise ValueError(f"lane_drafters needs n >= 1 lanes, got {n}")
    first = make_drafter(method, target, path, tokenizer, **flags)
    more = getattr(first, "lane", None)
    return [first] + [more() if more else make_drafter(method, target, path, tokenizer, **flags)
                      for _ in range(n - 1)]


def _lanes(drafter, target, n: int) -> list:
    """n drafters: `drafter` is a method name, a callable returning a fresh drafter, or None (plain)."""
    if drafter is None:
        return [NoDrafter() for _ in range(n)]
    if isinstance(drafter, str):
        return lane_drafters(drafter, target, n)
    if callable(drafter) and not isinstance(drafter, Drafter):
        return [drafter() for _ in range(n)]
    raise TypeError("pass a drafter name or a callable that returns a fresh drafter: each sequence needs its own")


def generate_batch(target, prompts, drafter=None, max_new_tokens: int = 64, sampling: Sampling | None = None,
                   eos_token_id=None, seed: int | None = None, budget="auto", logits_processor=None, grammar=None,
                   tokenizer=None, jump_forward: bool = True, compile: bool = False) -> list[GenerationOutput]:
    """Decode a batch of prompts of any lengths together: one target forward per step for all rows, each row
    accepting its own number of tokens and finishing on its own (verify/packed.py). `drafter`: a method name
    or a callable returning a fresh drafter (one per row). logits_processor, grammar, tokenizer, jump_forward:
    as in `generate`, applied to every row (each row follows the grammar with a matcher of its own). compile: as in
    `generate` (the whole batch's step is one bucket)."""
    from draftkit.verify.packed import generate_packed

    prompts = list(prompts)
    if not prompts:  # before a drafter is built (and its model loaded)
        raise ValueError("generate_batch needs at least one prompt, got none")
    return generate_packed(target, prompts, _lanes(drafter, target, len(prompts)), max_new_tokens, sampling,
                           eos_token_id, seed, budget, logprobs=False, logits_processor=logits_processor,
                           grammar=grammar, tokenizer=tokenizer, jump_forward=jump_forward, compile=compile).outputs


@dataclass
class BestOfN:
    samples: list[GenerationOutput]  # all N continuations
    rewards: list[float]
    best: int  # index of the highest reward
    kv_entries: int  # target KV entries held (the prompt once + each sample's tokens)
    kv_entries_independent: int  # what N independent sequences would hold


def mean_logprob(sample: GenerationOutput, logprobs: list[float]) -> float:
    """The default reward: the target's mean log-probability of the sample's tokens (temperature 1)."""
    return sum(logprobs) / max(len(logprobs), 1)


def best_of_n(target, prompt, n: int, reward=None, drafter=None, sampling: Sampling | None = None,
              max_new_tokens: int = 64, eos_token_id=None, seed: int | None = None, budget="auto",
              compile: bool = False) -> BestOfN:
    """N sampled continuations of one prompt whose KV is stored once (N branches of one tree hanging off the
    prompt), each drafted and verified speculatively and losslessly; the best by `reward(sample)` (default:
    the target's mean log-probability of the continuation). `drafter`: a method name or a factory. compile: as in
    `generate`."""
    from draftkit.verify.packed import generate_packed, kv_entries_independent

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    sampling = sampling or Sampling(temperature=1.0)
    out = generate_packed(target, [prompt], _lanes(drafter, target, n), max_new_tokens, sampling, eos_token_id,
                          seed, budget, shared_prompt=True, compile=compile)
    rewards = [float(reward(s)) if reward is not None else mean_logprob(s, lp)
               for s, lp in zip(out.outputs, out.logprobs)]
    best = max(range(n), key=rewards.__getitem__)
    p = out.outputs[0].sequence.numel() - out.outputs[0].tokens.numel()
    independent = kv_entries_independent(p, [s.tokens.numel() for s in out.outputs])
    return BestOfN(out.outputs, rewards, best, out.kv_entries, independent)
