"""Run methods side by side, interleaved, and keep every timing per prompt.

Every repeat runs every prompt through every method, rotating the method order
per prompt, so slow drifts of the machine (other processes, thermal state)
hit all methods alike. Timings are kept per (repeat, prompt), so a method that
fails on one prompt is still compared with plain decoding on the prompts both
finished (eval/rows.py). A failure never stops the run: it is reported through
`on_error` and that (method, prompt) pair is not run again.
"""
from __future__ import annotations

import statistics
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

from draftkit.eval.cli_checks import error_message
from draftkit.verify.stats import DecodeStats

Runner = Callable[[list[int]], tuple[list[int], DecodeStats | None]]


@dataclass
class Method:
    name: str
    run: Runner
    kind: str = "draftkit"  # "draftkit" (our loop), "peer" (transformers' generate)
    footprint: Callable[[], dict] | None = None  # bytes the method holds beside the target (eval/footprint.py)
    about: str = ""  # its settings, for the table
    # the drafter's own running totals (a hybrid's accepted tokens per member)
    counters: Callable[[], dict] | None = None


@dataclass
class Result:
    outputs: list = field(default_factory=list)  # [prompt] -> tokens of the first repeat (None: failed)
    seconds: list[dict[int, float]] = field(default_factory=list)  # [repeat][prompt]
    tokens: list[dict[int, int]] = field(default_factory=list)  # [repeat][prompt]
    stats: DecodeStats = field(default_factory=DecodeStats)  # every repeat and prompt merged
    stats_by_prompt: dict[int, DecodeStats] = field(default_factory=dict)  # every repeat merged
    memory: dict[str, int] = field(default_factory=dict)  # largest footprint seen after a run
    failed: dict[int, str] = field(default_factory=dict)  # prompt -> error message
    counters: dict[str, float] = field(default_factory=dict)  # what the method's counters gained in these runs

    def tokens_per_s_over(self, prompts) -> list[float]:
        """Per repeat: tokens / seconds summed over `prompts`."""
        out = []
        for secs, toks in zip(self.seconds, self.tokens):
            s = sum(secs[i] for i in prompts if i in secs)
            out.append(sum(toks[i] for i in prompts if i in toks) / s if s else 0.0)
        return out

    @property
    def tokens_per_s(self) -> list[float]:
        """Per repeat, over every prompt that ran."""
        return self.tokens_per_s_over(range(len(self.outputs)))


def warm_up(methods: list[Method], ids: list[int], progress=None) -> None:
    """One untimed run of each method, so that one-time costs (allocations, a budget controller's cost
    profile) land in no timing. `ids` should not be an evaluation prompt: drafters that learn from past
    requests (suffix) would see its continuation early. A failure here shows again in the timed runs."""
    for m in methods:
        try:
            m.run(ids)
        except Exception:  # noqa: BLE001 - reported by measure() when it happens again
            pass
        if progress is not None:
            progress.update(1)


def measure(methods: list[Method], prompts: list[list[int]], repeats: int, progress=None,
            on_error: Callable[[str, int, str, str], None] | None = None) -> dict[str, Result]:
    """on_error(method name, prompt index, one-line message, traceback) is called once per failure."""
    results = {m.name: Result(outputs=[None] * len(prompts)) for m in methods}
    before = {m.name: m.counters() for m in methods if m.counters is not None}
    for r in range(repeats):
        for m in methods:
            results[m.name].seconds.append({})
            results[m.name].tokens.append({})
        for i, ids in enumerate(prompts):
            order = methods[i % len(methods):] + methods[:i % len(methods)]
            for m in order:
                res = results[m.name]
                if i not in res.failed:
                    try:
                        t0 = time.perf_counter()
                        out, stats = m.run(ids)
                        res.seconds[r][i] = time.perf_counter() - t0
                    except Exception as exc:  # noqa: BLE001 - one bad pair must not end the run
                        res.failed[i] = error_message(exc)
                        if on_error is not None:
                            on_error(m.name, i, res.failed[i], traceback.format_exc())
                    else:
                        res.tokens[r][i] = len(out)
                        if r == 0:
                            res.outputs[i] = out
                        if stats is not None:  # every repeat: the speedup is a median over all of them
                            old = res.stats_by_prompt.get(i)
                            res.stats_by_prompt[i] = stats if old is None else old.merge(stats)
                            res.stats = res.stats.merge(stats)
                        if m.footprint is not None:
                            res.memory = {k: max(res.memory.get(k, 0), v) for k, v in m.footprint().items()}
                if progress is not None:
                    progress.update(1)
    for m in methods:
        if m.counters is not None:
            now = m.counters()
            results[m.name].counters = {k: v - before[m.name].get(k, 0) for k, v in now.items()}
    return results


def speedups(res: Result, base: Result, prompts=None) -> list[float]:
    """Per repeat: the method's tokens/s over plain's, both summed over the same prompts (default: all)."""
    prompts = range(len(base.outputs)) if prompts is None else prompts
    return [a / b if b else 0.0 for a, b in zip(res.tokens_per_s_over(prompts), base.tokens_per_s_over(prompts))]


def median_spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def lossless_check(res: Result, base: Result, prompts) -> tuple[int, int]:
    """(identical outputs, prompts compared) against plain greedy decoding."""
    same = sum(res.outputs[i] == base.outputs[i] for i in prompts)
    return same, len(prompts)
