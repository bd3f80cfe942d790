"""Run methods side by side, interleaved, and turn the timings into figures.

Every repeat runs every prompt through every method, rotating the method order
per prompt, so slow drifts of the machine (other processes, thermal state)
hit all methods alike. Speedup is computed within each repeat (method tokens/s
over plain tokens/s of that same repeat); we report the median and the spread.
"""
from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import psutil
import torch

from verify.stats import DecodeStats

Runner = Callable[[list[int]], tuple[list[int], DecodeStats | None]]


@dataclass
class Method:
    name: str
    run: Runner
    kind: str = "draftkit"  # "draftkit" (our loop), "peer" (transformers' generate)
    draft_params: int = 0  # parameters the method adds beside the target


@dataclass
class Result:
    outputs: list[list[int]] = field(default_factory=list)  # first repeat, per prompt
    seconds: list[float] = field(default_factory=list)  # per repeat, all prompts
    tokens: list[int] = field(default_factory=list)  # per repeat
    stats: DecodeStats = field(default_factory=DecodeStats)  # first repeat
    peak_rss_mb: float = 0.0

    @property
    def tokens_per_s(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.seconds)]


class PeakRSS:
    """Highest resident memory of this process while the block runs (sampled every 2 ms);
    on CUDA, torch's own peak allocation instead."""

    def __enter__(self):
        self.proc, self.peak, self.stop = psutil.Process(), 0, False
        self.base = self.proc.memory_info().rss
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.002)

    def __exit__(self, *exc):
        self.stop = True
        self.thread.join()
        if torch.cuda.is_available():
            self.mb = torch.cuda.max_memory_allocated() / 2**20
        else:
            self.mb = max(self.peak, self.base) / 2**20


def measure(methods: list[Method], prompts: list[list[int]], repeats: int, progress=None) -> dict[str, Result]:
    results = {m.name: Result() for m in methods}
    for r in range(repeats):
        secs = {m.name: 0.0 for m in methods}
        toks = {m.name: 0 for m in methods}
        for i, ids in enumerate(prompts):
            order = methods[i % len(methods):] + methods[:i % len(methods)]
            for m in order:
                with PeakRSS() as mem:
                    t0 = time.perf_counter()
                    out, stats = m.run(ids)
                    secs[m.name] += time.perf_counter() - t0
                res = results[m.name]
                res.peak_rss_mb = max(res.peak_rss_mb, mem.mb)
                toks[m.name] += len(out)
                if r == 0:
                    res.outputs.append(out)
                    if stats is not None:
                        res.stats = res.stats.merge(stats)
                if progress is not None:
                    progress.update(1)
        for m in methods:
            results[m.name].seconds.append(secs[m.name])
            results[m.name].tokens.append(toks[m.name])
    return results


def speedups(res: Result, base: Result) -> list[float]:
    return [a / b for a, b in zip(res.tokens_per_s, base.tokens_per_s)]


def median_spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def predicted_speedup(alpha: float, k: int, phi: float) -> float:
    """Leviathan et al.: (1 - alpha^(K+1)) / ((1 - alpha)(K phi + 1))."""
    if k <= 0:
        return 1.0
    gain = (k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return gain / (k * phi + 1)


def lossless_check(res: Result, base: Result) -> tuple[int, int]:
    """(identical outputs, prompts) against plain greedy decoding."""
    same = sum(a == b for a, b in zip(res.outputs, base.outputs))
    return same, len(base.outputs)
