"""train/export.py --check: the written folder loaded back as draftkit's own drafter, beside the source.

An engine's folder that loads but drafts differently (a weight under the wrong name, a transposed projection, a
lost token map) still decodes losslessly, just slower, so a load alone proves little. The check decodes a few
prompts greedily with the drafter's fixed cap (deterministic drafts: the cost-aware budget depends on timings)
three ways: plain, the source drafter, the export loaded back. It passes when both drafted outputs equal plain
decoding and, when the export keeps the dtype the source stores its weights in, the export accepts exactly what
the source accepts at every step (same weights, same drafts); across dtypes only the first holds, and the taus
are printed side by side.
"""
from __future__ import annotations

import glob
import os

import torch

CHECK_TOKENS = 48  # new tokens per prompt
CHAT_REQUESTS = ("Write a Python function that returns the n-th Fibonacci number.",
                 "Explain in two sentences why the sky looks blue.")
TEXT_PROMPTS = ("def fibonacci(n):\n    ", "import os\n\n\ndef list_files(path):\n    ")
SAFETENSORS_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32}


class CheckFailed(RuntimeError):
    """The export loads back wrong: its output differs from plain decoding, or its drafts from the source's."""


def stored_dtype(folder: str) -> torch.dtype | None:
    """The dtype of the first floating-point tensor of the drafter's weights (model.safetensors; a Medusa-2
    folder's adapter beside it is the target's, not the export's), else of any safetensors file; None: none."""
    from safetensors import safe_open

    main = os.path.join(folder, "model.safetensors")
    for path in [main] if os.path.exists(main) else sorted(glob.glob(os.path.join(folder, "*.safetensors"))):
        with safe_open(path, "pt") as fh:
            for name in fh.keys():
                dtype = SAFETENSORS_DTYPES.get(fh.get_slice(name).get_dtype())
                if dtype is not None:
                    return dtype
    return None


def check_prompts(tokenizer, vocab: int) -> list[torch.Tensor]:
    """Two short requests, chat-templated when the target has a template; raw code without one; fixed random
    ids for a target without a tokenizer."""
    if tokenizer is None:
        gen = torch.Generator().manual_seed(0)
        return [torch.randint(1, vocab, (24,), generator=gen) for _ in range(2)]
    if getattr(tokenizer, "chat_template", None):
        return [torch.tensor(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                           add_generation_prompt=True, return_dict=True)["input_ids"])
                for text in CHAT_REQUESTS]
    return [torch.tensor(tokenizer(text)["input_ids"]) for text in TEXT_PROMPTS]


def _tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):  # a target folder without tokenizer files
        return None


def check_export(method: str, source: str, out: str, target_path: str, dtype: torch.dtype) -> str:
    """Decode check_prompts plain, with the source drafter and with the export (method: the draftkit drafter
    name that loads both); the one-line verdict, or CheckFailed naming the first difference."""
    import draftkit as dk
    from draftkit.models import load_model

    target = load_model(target_path)
    prompts = check_prompts(_tokenizer(target_path), target.get_output_embeddings().weight.shape[0])
    exact = stored_dtype(source) == dtype
    drafters = {"source": dk.make_drafter(method, target, path=source), "export": dk.make_drafter(method, target, path=out)}
    taus = {name: [] for name in drafters}
    for i, prompt in enumerate(prompts):
        plain = dk.generate(target, prompt, max_new_tokens=CHECK_TOKENS, eos_token_id=[]).tokens.tolist()
        accepted = {}
        for name, drafter in drafters.items():
            out_i = dk.generate(target, prompt, drafter=drafter, max_new_tokens=CHECK_TOKENS, eos_token_id=[],
                                budget="fixed")
            if out_i.tokens.tolist() != plain:
                raise CheckFailed(f"prompt {i}: the {name} drafter's output differs from plain decoding")
            accepted[name] = [s.accepted for s in out_i.stats.steps if not s.prefill]
            taus[name].append(sum(a + 1 for a in accepted[name]) / max(len(accepted[name]), 1))
        export, src = accepted["export"], accepted["source"]
        if exact and export != src:
            j = next((j for j, (a, b) in enumerate(zip(export, src)) if a != b), min(len(export), len(src)))
            raise CheckFailed(f"prompt {i}: the export drafts differently from the source though both hold the same "
                              f"weights (step {j}: accepted {export[j:j + 1]} against {src[j:j + 1]})")
    tau = " / ".join(f"{t:.2f}" for t in taus["export"])
    same = "the same drafts as the source at every step" if exact else \
        "tau of the source " + " / ".join(f"{t:.2f}" for t in taus["source"]) + " (another dtype: drafts may differ)"
    return (f"check: {out} loads back as draftkit's {method}; {len(prompts)} prompts x {CHECK_TOKENS} tokens greedy "
            f"at its fixed cap: identical to plain decoding, tau {tau}, {same}")
