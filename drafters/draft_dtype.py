"""The dtype a draft model runs in, and the target's LM head in that dtype.

A draft only proposes: the target's verification decides every token, so the draft's precision changes how often
its proposals pass, never the output (greedy output stays identical to plain decoding; under sampling q is
computed from the very logits the draft sampled from, so the rejection rule stays exact). Its cost, though, is
the step's overhead. By default ("auto") a draft runs in the target's dtype (a bf16 draft beside a bf16 target:
no casts in the hot path), except beside a float32 target on a CPU whose oneDNN runs bf16 matrix products
natively (AVX512-BF16 or AMX), when a draft forward reads BF16_MIN_BYTES of fp32 weights or more (its own and the
target head it reads): there it runs in bf16. On such a CPU (2 EPYC cores, measured) a (8, 576) x (576, 8192)
product, an EAGLE-3 draft head over 8 nodes, took 0.39 ms in bf16 against 3.4 ms in fp32, and a SmolLM2 EAGLE-3
draft step (depth 4, 8 nodes) 13 ms against 31 ms: beside SmolLM2-135M (drafts reading 40-130 MB) EAGLE-3 and
EAGLE-2 ran faster in bf16 on 16 of 16 task cells. The shipped 12M family's drafts read 6-9 MB, where the products
are small and the casts of every norm and attention call cost more than bf16 saves: the standalone draft ran 3-10%
slower in bf16 on every task, EAGLE-3 slower on most; they stay in fp32.

Drafts that read the target's own LM head (EAGLE-1/2 in draftkit's layout, DFlash) read a copy of it in the
draft's dtype (`head_in`): one per target, dtype and device, shared by every drafter of that target, counted in
each drafter's memory (SmolLM2-135M: 57 MB in bf16).
"""
from __future__ import annotations

import torch
from torch import nn

DRAFT_DTYPES = ("auto", "target", "bfloat16", "float16", "float32")
BF16_MIN_BYTES = 16 << 20  # fp32 weights a draft forward reads, from which "auto" takes bf16 (module docstring)


def check_draft_dtype(spec: str) -> str:
    if spec not in DRAFT_DTYPES:
        raise ValueError(f"draft_dtype must be one of {', '.join(DRAFT_DTYPES)}, got {spec!r}")
    return spec


def native_bf16(device: torch.device) -> bool:
    """bf16 matrix products run natively here: a CPU whose oneDNN supports them (AVX512-BF16, AMX)."""
    return device.type == "cpu" and torch.backends.mkldnn.is_available() \
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def draft_dtype(target, spec: str = "auto", reads: int = 0) -> torch.dtype:
    """The dtype a draft of `target` runs in (module docstring): spec "auto", "target" (the target's own), or a
    dtype's name. reads: the parameters one draft forward reads (its own, and the target head's if it reads it)."""
    own = target.get_output_embeddings().weight
    if check_draft_dtype(spec) == "target":
        return own.dtype
    if spec == "auto":
        big = 4 * reads >= BF16_MIN_BYTES
        return torch.bfloat16 if own.dtype == torch.float32 and big and native_bf16(own.device) else own.dtype
    return getattr(torch, spec)


def reads_of(draft, target, reads_head: bool) -> int:
    """Parameters one forward of `draft` reads: its own, and the target's LM head when it reads that."""
    return sum(p.numel() for p in draft.parameters()) + \
        (target.get_output_embeddings().weight.numel() if reads_head else 0)


def head_in(target, dtype: torch.dtype) -> nn.Module:
    """The target's LM head in `dtype`: the head itself when it is already, else a copy kept on the target (one per
    dtype and device, made again when the head's weights change)."""
    head = target.get_output_embeddings()
    w = head.weight
    if w.dtype == dtype:
        return head
    copies = target.__dict__.setdefault("_draftkit_draft_heads", {})
    key = (dtype, w.device)
    made = copies.get(key)
    if made is None or made[0] != (id(w), w._version):
        bias = getattr(head, "bias", None)
        copy = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None, device=w.device, dtype=dtype)
        with torch.no_grad():
            copy.weight.copy_(w)
            if bias is not None:
                copy.bias.copy_(bias)
        copy.requires_grad_(False)
        made = copies[key] = ((id(w), w._version), copy)
    return made[1]
