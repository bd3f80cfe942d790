"""How far a run's own timings can be trusted: every speedup assumes a machine that does nothing else.

Three signals, each measured by the run itself:
- the load average (os.getloadavg, one minute) before the run and after it, less the run's own threads: other
  work competing for the cores;
- the CPU time the process got per second of wall time: under half a core means it waited for the CPU;
- the spread of plain decoding's time for the same prompt across repeats: the same work taking very different
  times is noise that no speedup can be read through.
A signal past its limit becomes a warning that names the cause; compare.py puts them into the table,
compare.json ("warnings") and its closing summary.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

BUSY_LOAD = 0.5  # other runnable work per core (load average less our own threads) that makes timings noisy
MIN_CPU_PER_WALL = 0.5  # the process got less than half a core
MAX_SPREAD = 0.25  # plain decoding's slowest repeat of a prompt over its fastest, minus 1


def free_cores(cores: int | None = None, load: float | None = None) -> int:
    """Cores not busy with other work: the core count less the one-minute load average (rounded), at least 1.
    A torch forward on CPU waits at the end of every parallel op for its slowest thread; a thread that shares
    its core with other work stalls every op, so on a shared machine fewer threads run faster (measured on 2
    cores with other work on both: plain decoding 6-11 tokens/s with 2 threads, 33 with 1)."""
    cores = cores or os.cpu_count() or 1
    load = load_average() if load is None else load
    return cores if load is None else max(1, min(cores, cores - round(load)))


def pick_threads(spec: str) -> tuple[int, str | None]:
    """--threads: a positive count, or "auto" (free_cores). Returns (threads, a note when auto chose fewer
    threads than torch's default) or raises ValueError naming the bad value."""
    import torch

    if spec != "auto":
        try:
            n = int(spec)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"--threads must be a positive count or auto, got {spec!r}")
        return n, None
    default, load = torch.get_num_threads(), load_average()
    n = min(default, free_cores(load=load))
    note = None if n == default else (f"note: {n} torch thread(s) instead of {default}: the load average was "
                                      f"{load:.1f} on {os.cpu_count()} cores at the start (other work); pass "
                                      f"--threads {default} to keep them all")
    return n, note


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every platform
        return None


@dataclass
class Probe:
    """Load, CPU and wall time from the start of a run to its end. The clocks can be replaced (tests)."""

    threads: int  # the threads the run computes with (its own share of the load average)
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    load: Callable[[], float | None] | None = None  # default: load_average
    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float] = time.process_time

    def __post_init__(self):
        self.load = self.load or load_average
        self.load_before, self.wall0, self.cpu0 = self.load(), self.wall(), self.cpu()

    def finish(self) -> dict:
        wall = self.wall() - self.wall0
        return {"load_before": self.load_before, "load_after": self.load(), "cores": self.cores,
                "threads": self.threads, "cpu_per_wall": (self.cpu() - self.cpu0) / wall if wall > 0 else None}


def plain_spread(rows: list[dict]) -> tuple[float, str] | None:
    """(median over prompts of slowest / fastest - 1, the worst prompt in words) of plain decoding's time for
    the same prompt across repeats; None with one repeat."""
    spreads = []
    for row in rows:
        if row.get("kind") != "baseline" or not row.get("seconds") or len(row["seconds"]) < 2:
            continue
        for i in range(len(row["seconds"][0])):
            times = [rep[i] for rep in row["seconds"] if rep[i]]
            if len(times) >= 2:
                spreads.append((max(times) / min(times) - 1, f"{row['task']} prompt {i}: {min(times):.2f}-"
                                                             f"{max(times):.2f} s"))
    if not spreads:
        return None
    return statistics.median(s for s, _ in spreads), max(spreads)[1]


def timing_warnings(timing: dict, rows: list[dict]) -> list[str]:
    """One line per signal past its limit, naming the cause and the figure."""
    out = []
    own = timing["threads"]
    for when in ("before", "after"):
        load = timing.get(f"load_{when}")
        if load is None:
            continue
        others = load - own if when == "after" else load  # after the run, its own threads are in the average
        if others > BUSY_LOAD * timing["cores"]:
            mine = f", less this run's {own} threads" if when == "after" else ""
            out.append(f"busy machine: load average {load:.1f} {when} the run on {timing['cores']} cores "
                       f"({others:.1f} runnable tasks of other work{mine}); timings and speedups are noise")
            break
    cpu = timing.get("cpu_per_wall")
    if cpu is not None and cpu < MIN_CPU_PER_WALL:
        out.append(f"busy machine: the run got {cpu:.2f} s of CPU per second of wall time (under half a core; "
                   f"it waited for the CPU); timings and speedups are noise")
    spread = plain_spread(rows)
    if spread is not None and spread[0] > MAX_SPREAD:
        out.append(f"noisy timings: plain decoding's time for the same prompt varied by {100 * spread[0]:.0f}% "
                   f"(median over prompts) across repeats (worst: {spread[1]}); speedups under about "
                   f"{1 + spread[0]:.2f}x cannot be told from noise")
    return out
