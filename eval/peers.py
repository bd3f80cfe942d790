"""transformers' own generate paths: the peers users already have.

Plain greedy `generate`, assisted generation (`assistant_model`, a chain of
constant length) and prompt lookup (`prompt_lookup_num_tokens`), run on the
same models and prompts as draftkit's methods.
"""
from __future__ import annotations

import torch


def _run(model, ids: list[int], max_new_tokens: int, eos_token_id, **kwargs) -> list[int]:
    x = torch.tensor([ids], device=model.device)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos_token_id, pad_token_id=eos_token_id if eos_token_id is not None else 0,
                             **kwargs)
    return out[0, len(ids):].tolist()


def hf_plain(model, max_new_tokens: int, eos_token_id):
    return lambda ids: (_run(model, ids, max_new_tokens, eos_token_id), None)


def hf_assisted(model, draft, k: int, max_new_tokens: int, eos_token_id):
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return lambda ids: (_run(model, ids, max_new_tokens, eos_token_id, assistant_model=draft), None)


def hf_prompt_lookup(model, n: int, max_new_tokens: int, eos_token_id):
    return lambda ids: (_run(model, ids, max_new_tokens, eos_token_id, prompt_lookup_num_tokens=n), None)
