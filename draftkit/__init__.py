"""draftkit: speculative decoding with four drafters behind one lossless tree verifier.

    import draftkit as dk
    target, tok = dk.load_target()                      # the shipped default, or any HF id / path
    out = dk.generate(target, tok("def add(a, b):").input_ids, dk.make_drafter("eagle", target), max_new_tokens=64)
    print(tok.decode(out.tokens), out.stats.tau)

This module only wires names to classes; the work happens in drafters/ and verify/.
"""
from __future__ import annotations

import torch

from drafters.base import DecodeState, Drafter, DraftTree, NoDrafter, StepResult
from verify.accept import Sampling
from verify.decode import GenerationOutput, generate

from draftkit.zoo import ZooError, verified_path

DRAFTERS = ("standalone", "medusa", "eagle", "lookahead")

__all__ = ["DRAFTERS", "DecodeState", "DraftTree", "Drafter", "GenerationOutput", "NoDrafter", "Sampling",
           "StepResult", "ZooError", "generate", "load_model", "load_target", "make_drafter"]


def _resolve(name_or_path: str | None, default: str) -> str:
    return verified_path(default) if name_or_path in (None, "", "default") else name_or_path


def load_model(name_or_path: str | None = None, default: str = "target", dtype=torch.float32):
    """A causal LM from the zoo (None), a local folder or a Hugging Face hub id; eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(_resolve(name_or_path, default), dtype=dtype).eval()


def load_target(name_or_path: str | None = None, dtype=torch.float32):
    """(model, tokenizer) for the target."""
    from transformers import AutoTokenizer

    path = _resolve(name_or_path, "target")
    return load_model(path, dtype=dtype), AutoTokenizer.from_pretrained(path)


def make_drafter(method: str, target, path: str | None = None, tokenizer=None, **flags) -> Drafter:
    """A drafter by method name. `path`: the draft model / heads to load (None: the shipped default).
    `tokenizer`: the target's, to check a standalone draft's tokenizer against it.
    Flags go to the drafter's constructor (k, top_k, total_tokens, depth, tree_size, ngram, window, ...)."""
    if method in ("none", "plain"):
        return NoDrafter()
    if method == "lookahead":
        from drafters.lookahead import LookaheadDrafter

        return LookaheadDrafter(**flags)
    if method == "standalone":
        from drafters.standalone import StandaloneDrafter, check_same_vocabulary

        from transformers import AutoTokenizer

        draft_path = _resolve(path, "draft")
        draft = load_model(draft_path, dtype=target.dtype).to(target.device)
        draft_tok = AutoTokenizer.from_pretrained(draft_path) if tokenizer is not None else None
        check_same_vocabulary(target, draft, tokenizer, draft_tok, target_name="target",
                              draft_name=path or "the default draft")
        return StandaloneDrafter(draft, **flags)  # vocabularies checked just above
    if method == "medusa":
        from drafters.medusa import MedusaDrafter

        return MedusaDrafter.from_pretrained(_resolve(path, "medusa"), target, **flags)
    if method == "eagle":
        from drafters.eagle import EagleDrafter

        return EagleDrafter.from_pretrained(_resolve(path, "eagle"), target, **flags)
    raise ValueError(f"unknown drafter {method!r}; choose one of {', '.join(DRAFTERS)}")
