"""The decoding step's host <-> device transfers, in one place.

A step of the loop (verify/packed.py) uploads what the host decided (the input
tokens that are known on the host, positions, the tree's topology) with ONE
`to_device` and reads what the target decided (the accepted paths, their
tokens, the bonus tokens) with ONE `to_host`. On a GPU each of these waits for
the device or queues a copy; every other transfer in a step is a stall that
gpt-fast-style loops avoid. Routing them through these two functions lets a test
(tests/test_syncs.py) and eval/gpu_check.py count them per step.

`counts` holds the running totals; tests patch the functions instead.
"""
from __future__ import annotations

import torch

counts = {"upload": 0, "read": 0}


def is_host(device) -> bool:
    """True where tensors live in host memory: reading one waits for nothing. The one place the loop and the
    drafters ask, so that a test can run the device code path on a CPU (eval/syncs.DeviceShim)."""
    return torch.device(device).type == "cpu"


def to_device(values: list[int], device) -> torch.Tensor:
    """(len(values),) long on `device`: one host-to-device copy."""
    counts["upload"] += 1
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def to_host(tensor: torch.Tensor) -> list:
    """tensor.tolist(): one device-to-host read (waits for the work that produces it)."""
    counts["read"] += 1
    return tensor.tolist()
