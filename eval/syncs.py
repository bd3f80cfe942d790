"""Count host <-> device transfers of a decoding run, split by who makes them.

    with SyncCounter(drafter) as c:
        out = dk.generate(target, ids, drafter)
    c.per_step(len(out.stats.steps))   # {"loop_upload": 1.0, "loop_read": 1.02, "drafter_read": 0.0, ...}

loop_*: the loop's own transfers (verify/sync.py: one upload, one read per step).
drafter_* / other_*: host reads of a tensor (tolist, item, int, float, bool) and
uploads (`torch.tensor(..., device=...)`, `Tensor.to` from the CPU to a device)
made inside the drafter's reset/propose/update, or anywhere else (the target's
own forward, validation, the controller). On a GPU only transfers that touch the device count
(`device_only`); on a CPU every read of a tensor counts, since the same code on
a GPU would read the device (a conservative count).
"""
from __future__ import annotations

import time
import types
from collections import Counter

import torch

from draftkit.verify import sync

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")


class SyncCounter:
    def __init__(self, *drafters, device_only: bool | None = None):
        self.drafters = drafters
        self.device_only = torch.cuda.is_available() if device_only is None else device_only
        self.counts: Counter = Counter()
        self._phase, self._inside_loop = "other", False
        self._saved: list[tuple[object, str, object, bool]] = []

    # -- patching --------------------------------------------------------------------------------
    def _patch(self, owner, name, wrapper) -> None:
        own = name in vars(owner) if isinstance(owner, type) else True
        self._saved.append((owner, name, getattr(owner, name), own))
        setattr(owner, name, wrapper)

    def __enter__(self) -> "SyncCounter":
        for name in READS:
            self._patch(torch.Tensor, name, self._read(getattr(torch.Tensor, name)))
        self._patch(torch.Tensor, "to", self._to(torch.Tensor.to))
        self._patch(torch, "tensor", self._tensor(torch.tensor))
        self._patch(sync, "to_device", self._loop("loop_upload", sync.to_device))
        self._patch(sync, "to_host", self._loop("loop_read", sync.to_host))
        self._patch(torch.cuda, "synchronize", self._synchronize(torch.cuda.synchronize))
        for d in self.drafters:
            for name in ("propose", "update", "reset"):
                self._patch(d, name, self._tagged(getattr(d, name)))
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original, own in reversed(self._saved):
            if own and not isinstance(owner, (type, types.ModuleType)):
                delattr(owner, name)  # an instance attribute over the class's method
            elif own:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._saved = []

    # -- wrappers --------------------------------------------------------------------------------
    def _count(self, kind: str, on_device: bool) -> None:
        if not self._inside_loop and (on_device or not self.device_only):
            self.counts[f"{self._phase}_{kind}"] += 1

    def _read(self, original):
        counter = self

        def read(tensor, *args, **kwargs):
            counter._count("read", tensor.device.type != "cpu")
            return original(tensor, *args, **kwargs)
        return read

    def _to(self, original):
        counter = self

        def to(tensor, *args, **kwargs):
            target = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device)) else None)
            if target is not None and tensor.device.type == "cpu" and torch.device(target).type != "cpu":
                counter._count("upload", True)
            return original(tensor, *args, **kwargs)
        return to

    def _tensor(self, original):
        counter = self

        def tensor(data, *args, **kwargs):
            device = kwargs.get("device")
            if device is not None:
                counter._count("upload", torch.device(device).type != "cpu")
            return original(data, *args, **kwargs)
        return tensor

    def _loop(self, kind: str, original):
        counter = self

        def transfer(*args, **kwargs):
            counter.counts[kind] += 1
            counter._inside_loop = True
            try:
                return original(*args, **kwargs)
            finally:
                counter._inside_loop = False
        return transfer

    def _synchronize(self, original):
        counter = self

        def synchronize(device=None):
            counter.counts["synchronize"] += 1
            return original(device)
        return synchronize

    def _tagged(self, method):
        counter = self

        def call(*args, **kwargs):
            outer, counter._phase = counter._phase, "drafter"
            try:
                return method(*args, **kwargs)
            finally:
                counter._phase = outer
        return call

    def per_step(self, steps: int) -> dict[str, float]:
        keys = ("loop_upload", "loop_read", "drafter_upload", "drafter_read", "other_upload", "other_read")
        return {k: self.counts[k] / max(steps, 1) for k in keys}


class _ShimEvent:
    """A timing event as a GPU keeps it: complete only once the host has waited for the work queued after it."""

    def __init__(self, shim: "DeviceShim"):
        self.shim, self.time, self.epoch = shim, time.perf_counter(), shim.epoch

    def query(self) -> bool:
        return self.shim.epoch > self.epoch

    def synchronize(self) -> None:
        self.shim.wait("event_wait")

    def elapsed_time(self, end: "_ShimEvent") -> float:
        if not (self.query() and end.query()):  # what CUDA answers for an incomplete event
            raise RuntimeError("CUDA error: device not ready (elapsed_time of an event not yet complete)")
        return (end.time - self.time) * 1e3


class DeviceShim(SyncCounter):
    """The device code path run on a CPU, with every wait of the host for the device counted.

        with DeviceShim(drafter) as shim:
            out = dk.generate(target, ids, drafter)
        shim.waits                     # Counter: read, upload, synchronize, event_wait, shape

    Inside, `verify.sync.is_host` says no tensor is on the host, so the loop takes its device branches (timing
    events instead of perf_counter, device trees read with the step's one read), and its timing events are
    simulated as a GPU keeps them: an event completes only when the host later waits for the device. A wait is
    every tensor read (tolist, item, int, float, bool, index, cpu, numpy), an upload that blocks
    (`torch.tensor(..., device=...)`; `verify.sync.to_device` copies without blocking), `synchronize`, reading an
    incomplete event, and an op whose output size depends on the data (nonzero, masked_select, boolean indexing).
    Conservative like SyncCounter on a CPU: a read of a host tensor counts too."""

    SHAPE_OPS = ("nonzero", "masked_select")

    def __init__(self, *drafters):
        super().__init__(*drafters, device_only=False)
        self.waits: Counter = Counter()
        self.epoch = 0  # waits so far: an event recorded at epoch e is complete once epoch > e

    def wait(self, kind: str) -> None:
        self.waits[kind] += 1
        self.epoch += 1

    def __enter__(self) -> "DeviceShim":
        super().__enter__()
        from draftkit.verify import timing

        self._patch(sync, "is_host", lambda device: False)
        self._patch(timing, "device_event", lambda device: _ShimEvent(self))
        self._patch(timing, "synchronize", lambda device: self.wait("synchronize"))
        self._patch(torch.cuda, "synchronize", lambda device=None: self.wait("synchronize"))
        for name in ("cpu", "numpy"):
            self._patch(torch.Tensor, name, self._read(getattr(torch.Tensor, name)))
        for name in self.SHAPE_OPS:
            self._patch(torch.Tensor, name, self._shape(getattr(torch.Tensor, name)))
            self._patch(torch, name, self._shape(getattr(torch, name)))
        self._patch(torch.Tensor, "__getitem__", self._getitem(torch.Tensor.__getitem__))
        return self

    def _count(self, kind: str, on_device: bool) -> None:
        super()._count(kind, on_device)
        if not self._inside_loop:  # a read, or an upload that blocks: the host waits for the queue either way
            self.wait(kind)

    def _loop(self, kind: str, original):
        transfer = super()._loop(kind, original)
        shim = self

        def counted(*args, **kwargs):
            if kind == "loop_read":
                shim.wait("read")
            return transfer(*args, **kwargs)
        return counted

    def _shape(self, original):
        shim = self

        def op(*args, **kwargs):
            shim.wait("shape")
            return original(*args, **kwargs)
        return op

    def _getitem(self, original):
        shim = self

        def getitem(tensor, index):
            parts = index if isinstance(index, tuple) else (index,)
            if any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                shim.wait("shape")
            return original(tensor, index)
        return getitem

    def per_step_waits(self, steps: int) -> float:
        return sum(self.waits.values()) / max(steps, 1)
