"""Phase timings of the decoding loop that cost no wait on a GPU.

On a GPU, kernels run asynchronously: `time.perf_counter()` read right after a forward is launched measures the
launch, and a `synchronize()` at every phase boundary to fix that stalls the host about eight times a step (the
one-upload-one-read design undone). The loop therefore marks its phase boundaries with `StepClock.stamp()`: on a
GPU a timing event recorded on the model's device (queued like a kernel: no wait), on a CPU `perf_counter()`.
`StepClock.seconds(a, b)` turns two stamps into seconds. The loop asks for it only for stamps recorded before the
step's one read (verify/sync.to_host): that read has waited for everything queued before it, so the events are
complete and reading them waits for nothing. What the loop stamps after the read (the KV commit, the drafters'
updates) is settled at the next step's read (`Carry`), and at the end of a run once.

`StepClock.now()` is for measurement code (cost profiles, benchmarks), not the loop: it waits for the model's own
device (`synchronize(device)`, not the current device: a model on cuda:1 would otherwise be timed against cuda:0),
then reads the clock.
"""
from __future__ import annotations

import time

import torch

from draftkit.verify import sync


def synchronize(device) -> None:
    """Wait for the work queued on `device` (a no-op on the CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def device_event(device):
    """A timing event recorded now on `device`'s current stream (returns at once)."""
    event = torch.Event(device=torch.device(device), enable_timing=True)
    event.record()
    return event


class StepClock:
    """Stamps of phase boundaries; seconds between two of them, read without waiting once the device is past both."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.events = not sync.is_host(self.device)

    def stamp(self):
        """A mark of this point in the queued work: an event on a device, perf_counter() on the host."""
        return device_event(self.device) if self.events else time.perf_counter()

    def seconds(self, start, end) -> float:
        """Seconds from `start` to `end`. On a device both should be complete (recorded before a read); one that is
        not is waited for (a stall the tests count)."""
        if not self.events:
            return end - start
        if not end.query():
            end.synchronize()
        return start.elapsed_time(end) / 1e3

    def now(self) -> float:
        """perf_counter() after the device has finished what was queued on it (measurement code only)."""
        if self.events:
            synchronize(self.device)
        return time.perf_counter()


class Carry:
    """Spans stamped after a step's read, settled at the next step's read: seconds owed to each lane's next
    drafting time (its update) and to the next step's verify time (the KV commit)."""

    def __init__(self, clock: StepClock):
        self.clock = clock
        self.draft: dict[int, list] = {}  # lane index -> [(start, end)]
        self.verify: list = []  # [(start, end)] of the whole step

    def draft_span(self, lane: int, start, end) -> None:
        self.draft.setdefault(lane, []).append((start, end))

    def verify_span(self, start, end) -> None:
        self.verify.append((start, end))

    def take_draft(self, lane: int) -> float:
        return sum(self.clock.seconds(a, b) for a, b in self.draft.pop(lane, []))

    def take_verify(self) -> float:
        spans, self.verify = self.verify, []
        return sum(self.clock.seconds(a, b) for a, b in spans)


def clock_for(model) -> StepClock:
    return StepClock(getattr(model, "device", "cpu"))
