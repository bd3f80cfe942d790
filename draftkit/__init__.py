"""draftkit: speculative decoding with several drafters behind one lossless tree verifier.

    import draftkit as dk
    target, tok = dk.load_target()                      # the shipped default, or any HF id / path
    out = dk.generate(target, tok("def add(a, b):").input_ids, dk.make_drafter("eagle", target), max_new_tokens=64)
    print(tok.decode(out.tokens), out.stats.tau)

This module only wires names to classes; the work happens in drafters/ and verify/.
"""
from __future__ import annotations

import torch

from verify.contract import Budget, DecodeState, Drafter, DraftTree, NoDrafter, StepResult
from verify.accept import Sampling
from verify.decode import GenerationOutput, generate

from draftkit.zoo import ZooError

from drafters.registry import REGISTRY, build
from draftkit.models import load_model, load_target

DRAFTERS = tuple(REGISTRY)

__all__ = ["Budget", "DRAFTERS", "DecodeState", "DraftTree", "Drafter", "GenerationOutput", "NoDrafter", "Sampling",
           "StepResult", "ZooError", "generate", "load_model", "load_target", "make_drafter"]


def make_drafter(method: str, target, path: str | None = None, tokenizer=None, **flags) -> Drafter:
    """A drafter by method name (see `DRAFTERS`). `path`: the draft model / heads to load (None: the
    shipped default). `tokenizer`: the target's, to check a standalone draft's tokenizer against it.
    Flags are the method's settings (drafters.registry): max_depth, max_nodes, and its own."""
    if method in ("none", "plain"):
        return NoDrafter()
    return build(method, target, path, tokenizer, **flags)
