"""compare.py judges its own timings: a busy machine (load average, CPU per wall second) or plain decoding's time
for one prompt varying across repeats becomes a warning that names the cause, in the table, compare.json and the
summary; an idle machine with steady timings gets none."""
import itertools
import json

import pytest

from draftkit.eval import compare, noise
from draftkit.eval.report import format_table


def probe(loads, cpu_per_wall=1.8, threads=2, cores=2):
    """A Probe on fake clocks: the load average reads `loads` in turn; 10 s of wall time pass."""
    walls, cpus = iter([0.0, 10.0]), iter([0.0, 10.0 * cpu_per_wall])
    it = iter(loads)
    return noise.Probe(threads=threads, cores=cores, load=lambda: next(it), wall=lambda: next(walls),
                       cpu=lambda: next(cpus))


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


def test_a_starved_process_is_named_by_its_cpu_time():
    timing = probe([0.1, 2.0], cpu_per_wall=0.3).finish()
    (warning,) = noise.timing_warnings(timing, [STEADY])
    assert "0.30 s of CPU per second of wall time" in warning


def test_a_noisy_timer_is_named_with_its_worst_prompt():
    noisy = plain_row([[1.3, 2.0, 0.9], [21.6, 3.1, 1.4]])
    (warning,) = noise.timing_warnings(probe([0.1, 2.0]).finish(), [noisy])
    assert warning.startswith("noisy timings: plain decoding's time for the same prompt varied by 56%"), warning
    assert "code prompt 0: 1.30-21.60 s" in warning
    one_repeat = plain_row([[1.3, 2.0, 0.9]])
    assert noise.plain_spread([one_repeat]) is None  # nothing to compare: no claim either way


def test_the_table_opens_with_the_warnings():
    report = {"machine": "test", "rows": [], "timing": {"warnings": ["busy machine: load average 4.6 ..."]}}
    lines = format_table(report).splitlines()
    assert lines[1] == "WARNING: busy machine: load average 4.6 ..." and lines[2].startswith("task")


def test_compare_reports_a_busy_machine_everywhere(tmp_path, monkeypatch, capsys):
    loads = itertools.chain([6.0], itertools.repeat(7.5))
    monkeypatch.setattr(noise, "load_average", lambda: next(loads))
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


@pytest.mark.parametrize("cores, load, free", [(2, 0.2, 2), (2, 1.2, 1), (2, 5.0, 1), (8, 2.6, 5), (4, None, 4)])
def test_free_cores_leave_the_busy_ones_out(cores, load, free, monkeypatch):
    from draftkit.eval import noise

    monkeypatch.setattr(noise, "load_average", lambda: load)
    assert noise.free_cores(cores) == free


def test_auto_threads_say_why_they_are_fewer(monkeypatch):
    import torch

    from draftkit.eval import noise

    monkeypatch.setattr(noise.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(noise, "load_average", lambda: 1.4)
    n, note = noise.pick_threads("auto")
    assert n == 1 and "load average was 1.4 on 2 cores" in note and "--threads 2" in note
    monkeypatch.setattr(noise, "load_average", lambda: 0.1)
    assert noise.pick_threads("auto") == (2, None)
    assert noise.pick_threads("3") == (3, None)  # an explicit count is taken as given
