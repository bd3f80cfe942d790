"""Loading models by name: the shipped zoo (None / "default"), a local folder or a hub id."""
from __future__ import annotations

import torch

from draftkit.zoo import verified_path


def resolve(name_or_path: str | None, default: str) -> str:
    return verified_path(default) if name_or_path in (None, "", "default") else name_or_path


def load_model(name_or_path: str | None = None, default: str = "target", dtype=torch.float32):
    """A causal LM from the zoo (None), a local folder or a Hugging Face hub id; eval mode."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve(name_or_path, default), dtype=dtype).eval()


def load_target(name_or_path: str | None = None, dtype=torch.float32):
    """(model, tokenizer) for the target."""
    from transformers import AutoTokenizer

    path = resolve(name_or_path, "target")
    return load_model(path, dtype=dtype), AutoTokenizer.from_pretrained(path)
