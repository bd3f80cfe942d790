"""transformers' own generate paths: the peers users already have.

Plain greedy `generate`, assisted generation (`assistant_model`, a chain of
constant length), prompt lookup (`prompt_lookup_num_tokens`) and constrained
`generate` (a logits processor that applies xgrammar's mask), run on the same
models and prompts as draftkit's methods.
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


def hf_static_compiled(model, max_new_tokens: int, eos_token_id):
    """`generate` with a static cache and the model's forward compiled with static shapes: transformers' own
    fastest plain decoding. The compiled forward is made once per model and swapped in for each call only.
    Each prompt length compiles a prefill graph of its own (and the decoding step one more), more than dynamo
    keeps per function by default: the limit is raised for these calls, and callers warm up on every length."""
    compiled = getattr(model, "_draftkit_hf_compiled", None)
    if compiled is None:
        compiled = model._draftkit_hf_compiled = torch.compile(model.forward, dynamic=False)

    def run(ids):
        eager = model.forward
        model.forward = compiled
        try:
            with torch._dynamo.config.patch(recompile_limit=64):
                return _run(model, ids, max_new_tokens, eos_token_id, cache_implementation="static"), None
        finally:
            model.forward = eager
    return run


def hf_assisted(model, draft, k: int, max_new_tokens: int, eos_token_id):
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    return lambda ids: (_run(model, ids, max_new_tokens, eos_token_id, assistant_model=draft), None)


def hf_prompt_lookup(model, n: int, max_new_tokens: int, eos_token_id):
    return lambda ids: (_run(model, ids, max_new_tokens, eos_token_id, prompt_lookup_num_tokens=n), None)


def hf_grammar(model, tokenizer, max_new_tokens: int, eos_token_id):
    """generate under the current task's grammar (set through `run.new_task`), through xgrammar's own
    transformers logits processor (a fresh one per call: it keeps one matcher per row)."""
    from xgrammar.contrib.hf import LogitsProcessor

    from draftkit.verify.decode import eos_set
    from draftkit.verify.forward import output_vocab
    from draftkit.verify.grammar import compile_grammar

    task = {"grammar": None}

    def run(ids):
        extra = {}
        if task["grammar"] is not None:
            compiled = compile_grammar(task["grammar"], tokenizer, output_vocab(model), eos_set(model, eos_token_id))
            extra["logits_processor"] = [LogitsProcessor(compiled)]
        return _run(model, ids, max_new_tokens, eos_token_id, **extra), None

    def new_task(first_ids, keep_memory: bool, grammar=None):
        task["grammar"] = grammar

    run.new_task = new_task
    return run
