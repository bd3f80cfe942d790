"""How far a run's own timings can be trusted: every speedup assumes a machine that does nothing else.

Three signals, each measured by the run itself:
- the cores other processes keep busy just before the run and just after it (a half-second sample of
  /proc/stat less this process's own CPU time), or where that cannot be read the one-minute load average less
  the run's own threads (which lags: it still holds a run that ended a minute ago): other work competing for
  the cores;
- the CPU time the process got per second of wall time: under half a core means it waited for the CPU;
- the spread of plain decoding's time for the same prompt across repeats, beside each repeat's pace (a whole
  repeat running faster or slower cancels in its speedups): the same work taking very different times is noise
  that no speedup can be read through.
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
MIN_PACE_PROMPTS = 3  # prompts of a task whose median gives a repeat's pace (plain_spread)


def busy_elsewhere(seconds: float = 0.5) -> float | None:
    """Cores other processes kept busy over a short sample: the machine's busy time (Linux /proc/stat) less
    this process's own CPU time, per second of the sample. None where /proc/stat cannot be read. Sharper than
    the one-minute load average, which still holds a run that just ended for about a minute."""
    def sample():
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
        own = os.times()
        return sum(ticks), ticks[3] + (ticks[4] if len(ticks) > 4 else 0), own.user + own.system, time.monotonic()

    try:
        total0, idle0, own0, t0 = sample()
        time.sleep(seconds)
        total1, idle1, own1, t1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    if total1 <= total0 or t1 <= t0:
        return None
    busy = (1 - (idle1 - idle0) / (total1 - total0)) * (os.cpu_count() or 1)  # cores busy, this process included
    return max(0.0, busy - (own1 - own0) / (t1 - t0))


def free_cores(cores: int | None = None, busy: float | None = None) -> int:
    """Cores not busy with other work: the core count less the cores other work keeps busy (busy_elsewhere, or
    the one-minute load average where that cannot be read), rounded, at least 1. A torch forward on CPU waits at
    the end of every parallel op for its slowest thread; a thread that shares its core with other work stalls
    every op, so on a shared machine fewer threads run faster (measured on 2 cores with other work on both:
    plain decoding 6-11 tokens/s with 2 threads, 33 with 1)."""
    cores = cores or os.cpu_count() or 1
    if busy is None:
        busy = busy_elsewhere()
    if busy is None:
        busy = load_average()
    return cores if busy is None else max(1, min(cores, cores - round(busy)))


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
    default = torch.get_num_threads()
    busy = busy_elsewhere()
    source = "other processes kept {:.1f} cores busy" if busy is not None else "the load average was {:.1f}"
    if busy is None:
        busy = load_average()
    n = min(default, free_cores(busy=busy)) if busy is not None else default
    note = None if n == default else (f"note: {n} torch thread(s) instead of {default}: {source.format(busy)} "
                                      f"of {os.cpu_count()} cores at the start; pass --threads {default} to keep "
                                      "them all")
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
    busy: Callable[[], float | None] | None = None  # default: busy_elsewhere
    wall: Callable[[], float] = time.perf_counter
    cpu: Callable[[], float] = time.process_time

    def __post_init__(self):
        self.load, self.busy = self.load or load_average, self.busy or busy_elsewhere
        self.load_before, self.busy_before = self.load(), self.busy()
        self.wall0, self.cpu0 = self.wall(), self.cpu()

    def finish(self) -> dict:
        wall = self.wall() - self.wall0
        cpu = self.cpu() - self.cpu0
        return {"load_before": self.load_before, "load_after": self.load(), "busy_before": self.busy_before,
                "busy_after": self.busy(), "cores": self.cores,
                "threads": self.threads, "cpu_per_wall": cpu / wall if wall > 0 else None}


def plain_spread(rows: list[dict]) -> tuple[float, str] | None:
    """(median over prompts of the slowest / fastest repeat - 1, the worst prompt in words) of plain decoding's
    time for the same prompt, each repeat's times divided by that repeat's pace (the median over prompts of its
    time over the prompt's median time): a machine that runs a whole repeat faster or slower moves every method
    of the repeat alike, which cancels in the repeat's speedup (measure.speedups, methods interleaved prompt by
    prompt), while a prompt whose time moves apart from its repeat's pace is noise the speedups carry. A pace
    needs three prompts or more: with two, a prompt moving alone would set half the pace and read as half its
    spread, so with one or two prompts the times are compared as they are. None with one repeat."""
    spreads = []
    for row in rows:
        secs = row.get("seconds")
        if row.get("kind") != "baseline" or not secs or len(secs) < 2:
            continue
        prompts = [i for i in range(len(secs[0])) if all(rep[i] for rep in secs)]
        mid = {i: statistics.median(rep[i] for rep in secs) for i in prompts}
        paced = len(prompts) >= MIN_PACE_PROMPTS
        pace = [statistics.median(rep[i] / mid[i] for i in prompts) if paced else 1.0 for rep in secs]
        for i in prompts:
            scaled = [rep[i] / p for rep, p in zip(secs, pace)]
            times = [rep[i] for rep in secs]
            spreads.append((max(scaled) / min(scaled) - 1, f"{row['task']} prompt {i}: {min(times):.2f}-"
                                                           f"{max(times):.2f} s"))
    if not spreads:
        return None
    return statistics.median(s for s, _ in spreads), max(spreads)[1]


def timing_warnings(timing: dict, rows: list[dict]) -> list[str]:
    """One line per signal past its limit, naming the cause and the figure."""
    out = []
    own = timing["threads"]
    for when in ("before", "after"):
        busy = timing.get(f"busy_{when}")
        if busy is not None:  # measured over a short sample: what other processes ran just then
            spare = max(0, timing["cores"] - own)  # the cores this run left to other work (--threads)
            if busy > spare + BUSY_LOAD:
                out.append(f"busy machine: other processes kept {busy:.1f} of {timing['cores']} cores busy {when} "
                           f"the run, beside its {own} thread(s); timings and speedups are noise")
                break
            continue
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
        out.append(f"noisy timings: plain decoding's time for the same prompt, beside its repeat's pace, varied "
                   f"by {100 * spread[0]:.0f}% (median over prompts) across repeats (worst: {spread[1]}); speedups "
                   f"under about {1 + spread[0]:.2f}x cannot be told from noise")
    return out
