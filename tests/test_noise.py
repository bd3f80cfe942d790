"""compare.py judges its own timings: a busy machine (load average, CPU per wall second) or plain decoding's time
for one prompt varying across repeats becomes a warning that names the cause, in the table, compare.json and the
summary; an idle machine with steady timings gets none."""
import itertools
import json

import pytest

from draftkit.eval import compare, noise
from draftkit.eval.report import format_table


def probe(loads, cpu_per_wall=1.8, threads=2, cores=2, busy=(None, None)):
    """A Probe on fake clocks: the load average reads `loads` in turn, the busy sample `busy` (None: cannot be
    read, so the load average decides); 10 s of wall time pass."""
    walls, cpus = iter([0.0, 10.0]), iter([0.0, 10.0 * cpu_per_wall])
    it, busies = iter(loads), iter(busy)
    return noise.Probe(threads=threads, cores=cores, load=lambda: next(it), busy=lambda: next(busies),
                       wall=lambda: next(walls), cpu=lambda: next(cpus))


def plain_row(seconds):
    return {"drafter": "plain", "task": "code", "kind": "baseline", "seconds": seconds}


STEADY = plain_row([[1.30, 2.00, 0.90], [1.35, 1.96, 0.93]])


def test_an_idle_machine_with_steady_timings_gets_no_warning():
    timing = probe([0.2, 2.3]).finish()  # after the run: its own 2 threads and a little more
    assert timing["cpu_per_wall"] == 1.8
    assert noise.timing_warnings(timing, [STEADY]) == []


def test_a_busy_machine_is_named_by_its_load_average():
    timing = probe([4.6, 6.1]).finish()
    (warning,) = noise.timing_warnings(timing, [STEADY])
    assert warning.startswith("busy machine: load average 4.6 before the run on 2 cores"), warning
    timing = probe([0.3, 5.0]).finish()  # busy only after it started: 3 tasks beside the run's own 2 threads
    (warning,) = noise.timing_warnings(timing, [STEADY])
    assert "5.0 after the run" in warning and "3.0 runnable tasks" in warning, warning


def test_the_busy_sample_wins_over_a_load_average_left_by_an_earlier_run():
    """A run just ended leaves a load average of 2.3 for a minute: the half-second sample sees an idle machine,
    so no warning; other work seen by the sample is named with it."""
    assert noise.timing_warnings(probe([2.3, 2.4], busy=(0.05, 0.1)).finish(), [STEADY]) == []
    (warning,) = noise.timing_warnings(probe([0.2, 0.3], busy=(1.6, 0.1)).finish(), [STEADY])
    assert warning.startswith("busy machine: other processes kept 1.6 of 2 cores busy before the run"), warning
    # one core of other work: noise beside 2 threads, none beside 1 thread (the core left to it: --threads auto)
    assert noise.timing_warnings(probe([1.0, 1.0], busy=(1.0, 1.0)).finish(), [STEADY])
    assert noise.timing_warnings(probe([1.0, 1.0], threads=1, busy=(1.0, 1.0)).finish(), [STEADY]) == []


def test_a_starved_process_is_named_by_its_cpu_time():
    timing = probe([0.1, 2.0], cpu_per_wall=0.3).finish()
    (warning,) = noise.timing_warnings(timing, [STEADY])
    assert "0.30 s of CPU per second of wall time" in warning


def test_a_noisy_timer_is_named_with_its_worst_prompt():
    noisy = plain_row([[1.3, 2.0, 0.9], [3.9, 2.0, 0.45]])  # one prompt three times as slow, one twice as fast
    (warning,) = noise.timing_warnings(probe([0.1, 2.0]).finish(), [noisy])
    assert warning.startswith("noisy timings: plain decoding's time for the same prompt, beside its repeat's pace, "
                              "varied by 100%"), warning
    assert "code prompt 0: 1.30-3.90 s" in warning
    one_repeat = plain_row([[1.3, 2.0, 0.9]])
    assert noise.plain_spread([one_repeat]) is None  # nothing to compare: no claim either way


def test_a_whole_repeat_running_slower_is_not_noise():
    """Every prompt 30% slower in the second repeat: the machine's pace moved, and every method of that repeat with
    it (speedups are taken repeat by repeat), so no warning; one prompt moving apart from its repeat still warns,
    and with one or two prompts the pace cannot be told from noise."""
    drift = plain_row([[1.3, 2.0, 0.9, 1.1], [1.69, 2.6, 1.17, 1.43]])
    assert noise.plain_spread([drift])[0] == pytest.approx(0.0)
    assert noise.timing_warnings(probe([0.1, 2.0]).finish(), [drift]) == []
    apart = plain_row([[1.3, 2.0, 0.9, 1.1], [1.69, 2.6, 1.17, 2.2]])
    assert noise.plain_spread([apart])[1] == "code prompt 3: 1.10-2.20 s"
    lone = plain_row([[1.3], [1.69]])
    assert noise.plain_spread([lone])[0] == pytest.approx(0.3)
    pair = plain_row([[1.0, 2.0], [1.6, 2.0]])  # the first prompt 60% slower alone: two prompts set no pace
    assert noise.plain_spread([pair])[0] == pytest.approx(0.3)  # the median of 60% and 0%, not of 26% and 26%


def test_the_table_opens_with_the_warnings():
    report = {"machine": "test", "rows": [], "timing": {"warnings": ["busy machine: load average 4.6 ..."]}}
    lines = format_table(report).splitlines()
    assert lines[1] == "WARNING: busy machine: load average 4.6 ..." and lines[2].startswith("task")


def test_compare_reports_a_busy_machine_everywhere(tmp_path, monkeypatch, capsys):
    loads = itertools.chain([6.0], itertools.repeat(7.5))
    monkeypatch.setattr(noise, "load_average", lambda: next(loads))
    monkeypatch.setattr(noise, "busy_elsewhere", lambda *a: None)  # no /proc/stat: the load average decides
    out = tmp_path / "busy"
    code = compare.main(["--quick", "--drafters", "lookahead", "--no-peers", "--tasks", "copy", "--prompts", "1",
                         "--max-new-tokens", "8", "--no-plots", "--threads", "1", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    report = json.loads((out / "compare.json").read_text())
    assert report["timing"]["load_before"] == 6.0
    assert any(w.startswith("busy machine: load average 6.0 before the run") for w in report["warnings"])
    assert "WARNING: busy machine" in (out / "compare.txt").read_text()
    assert printed.count("WARNING: busy machine: load average 6.0") == 2  # in the table and the closing summary


@pytest.mark.parametrize("cores, busy, free", [(2, 0.2, 2), (2, 1.2, 1), (2, 5.0, 1), (8, 2.6, 5)])
def test_free_cores_leave_the_busy_ones_out(cores, busy, free):
    assert noise.free_cores(cores, busy) == free


def test_free_cores_fall_back_on_the_load_average(monkeypatch):
    monkeypatch.setattr(noise, "busy_elsewhere", lambda: None)
    monkeypatch.setattr(noise, "load_average", lambda: 1.4)
    assert noise.free_cores(2) == 1
    monkeypatch.setattr(noise, "load_average", lambda: None)
    assert noise.free_cores(4) == 4


@pytest.mark.alone  # a parallel test run keeps every core busy: it skips there, and CI runs it alone after
def test_busy_elsewhere_sees_another_process_and_not_its_own_work():
    """A child process spinning on one core is seen (where a core is free to see it on); this process's own
    spinning (a thread, during the sample) is not counted."""
    import os
    import subprocess
    import sys
    import threading
    import time

    quiet = noise.busy_elsewhere(0.3)
    if quiet is None:
        pytest.skip("no /proc/stat here")
    stop = time.monotonic() + 0.8
    spinner = threading.Thread(target=lambda: [None for _ in iter(lambda: time.monotonic() > stop, True)])
    spinner.start()
    own = noise.busy_elsewhere(0.5)
    spinner.join()
    assert own <= quiet + 0.5, (quiet, own)
    if quiet > (os.cpu_count() or 1) - 1.2:
        pytest.skip(f"the machine is busy ({quiet:.1f} cores): no free core to see a new process on")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert noise.busy_elsewhere(0.6) >= quiet + 0.6
    finally:
        spin.kill()


def test_auto_threads_say_why_they_are_fewer(monkeypatch):
    import torch

    monkeypatch.setattr(noise.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(noise, "busy_elsewhere", lambda: 1.1)
    n, note = noise.pick_threads("auto")
    assert n == 1 and "other processes kept 1.1 cores busy of 2 cores" in note and "--threads 2" in note
    monkeypatch.setattr(noise, "busy_elsewhere", lambda: None)
    monkeypatch.setattr(noise, "load_average", lambda: 1.4)
    n, note = noise.pick_threads("auto")
    assert n == 1 and "the load average was 1.4" in note
    monkeypatch.setattr(noise, "busy_elsewhere", lambda: 0.1)
    assert noise.pick_threads("auto") == (2, None)
    assert noise.pick_threads("3") == (3, None)  # an explicit count is taken as given
