"""Wall-clock readings that mean the same on a CPU and on a GPU.

On a GPU, kernels run asynchronously: `time.perf_counter()` read right after a
forward is launched measures the launch, and the forward's time is charged to
whatever phase next waits for the device (usually the acceptance rule's read).
The controller would then learn that verifying is free and drafting expensive.
`StepClock.now()` first waits for the work queued on the model's own device
(`torch.cuda.synchronize(device)`, not the current device: a model on cuda:1
would otherwise be timed against cuda:0), then reads the clock. On a CPU it is
`perf_counter()`.

The waits sit at phase boundaries the step passes anyway (the drafter reads its
tree, the verifier reads its result), so they add almost no stall of their own.
"""
from __future__ import annotations

import time

import torch


def synchronize(device) -> None:
    """Wait for the work queued on `device` (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


class StepClock:
    """Seconds since an arbitrary origin, after the device has finished what was queued on it."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.waits = self.device.type != "cpu"

    def now(self) -> float:
        if self.waits:
            synchronize(self.device)
        return time.perf_counter()


def clock_for(model) -> StepClock:
    return StepClock(getattr(model, "device", "cpu"))
