"""Grouped-query attention over the shared key/value heads on a CPU, under a hand-built mask too.

A model with fewer key/value heads than query heads (SmolLM2: 9 query heads, 3 key/value heads) runs its
attention through transformers' `sdpa_attention_forward`. Without a mask (the plain decoding step) it groups the
query heads over the shared key/value heads; with one (every tree, every batch, every chain on top of a cache)
it copies each key/value head once per query head first (`repeat_kv`), because on a GPU a mask sends a grouped
call to the slow math kernel. On a CPU the grouped call takes the mask at the same speed and gives bit-identical
outputs, and the copies were most of a verify step's extra time at long contexts: SmolLM2, 2 EPYC cores, per
layer at context 1024, 2 query rows: 371 us copied, 169 us grouped; at context 4096: 1,668 us and 601 us; the same
numbers to the last bit (verify/cost_profile.py's curve shows the step).

transformers reads `TRANSFORMERS_SDPA_FORCE_GQA` on every attention call; `grouped_attention` sets it for the
duration of one forward on the CPU only, and puts back what was there; `cpu_kernels` is what every eager forward
enters (a verify forward, verify/forward.py, and a draft model's, verify/tree.py `run_model`: an EAGLE layer of
SmolLM2's shape has its grouped heads), this and the Linears' layout together.
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

from draftkit.verify.linear_layout import rows_first

FLAG = "TRANSFORMERS_SDPA_FORCE_GQA"
_TORCH_GROUPS = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)  # enable_gqa


def groups_on_cpu(model) -> bool:
    """Whether `model` (a target or a draft module) runs on the CPU, where a masked grouped SDPA call is as fast as
    an unmasked one (the switch reaches only SDPA attention; eager attention reads no such thing)."""
    weight = next(model.parameters(), None)
    return _TORCH_GROUPS and weight is not None and weight.device.type == "cpu"


@contextmanager
def cpu_kernels(model):
    """For one eager forward of `model` (the verifier's, a draft model's): the layouts measured or known faster on
    a CPU, the Linears by rows (verify/linear_layout.py) and grouped attention under a mask; nothing off the CPU."""
    with rows_first(model), grouped_attention(model):
        yield


@contextmanager
def grouped_attention(model):
    """For one forward of `model`: grouped-query attention under a mask too, where `groups_on_cpu`."""
    if not groups_on_cpu(model) or os.environ.get(FLAG) == "1":
        yield
        return
    before = os.environ.get(FLAG)
    os.environ[FLAG] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[FLAG]
        else:
            os.environ[FLAG] = before
