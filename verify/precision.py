"""TF32: whether float32 matrix products on an NVIDIA GPU (Ampere and later) run with TF32's 10-bit mantissa.

PyTorch's own default differs by operation (matrix products in full fp32, cuDNN convolutions in TF32) and any
library a user imports may change it. With TF32 on, a float32 target computes other numbers than with it off,
in plain decoding and in verification alike; speculative decoding stays lossless against plain decoding with the
same setting, but a tree's and a single row's kernels then round differently, so greedy near-ties flip more
often (eval/divergence.py tells a near-tie from a bug). draftkit's benchmarks therefore set it explicitly
(`--tf32`, default off: IEEE fp32) and print it in the machine line; the library itself never changes it. A CPU
has no TF32: the setting changes nothing there.
"""
from __future__ import annotations

import torch

TF32_SETTINGS = ("off", "on", "keep")


def set_tf32(setting: str) -> None:
    """off: float32 products and convolutions in IEEE fp32 on CUDA; on: in TF32; keep: leave them as they are."""
    if setting not in TF32_SETTINGS:
        raise ValueError(f"tf32 must be one of {', '.join(TF32_SETTINGS)}, got {setting!r}")
    if setting == "keep":
        return
    precision = "tf32" if setting == "on" else "ieee"
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.conv.fp32_precision = precision


def tf32_matmul() -> bool:
    """float32 matrix products on CUDA run in TF32 now."""
    own = torch.backends.cuda.matmul.fp32_precision
    return own == "tf32" or (own == "none" and torch.get_float32_matmul_precision() != "highest")
