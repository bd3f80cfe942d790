"""eval/bench_depth.py: its flags fail in one line before any model loads, and its per-row figures."""
from __future__ import annotations

import pytest

from draftkit.eval import bench_depth
from draftkit.verify.stats import StepStats


@pytest.mark.parametrize("argv, word", [(["--depths", "1,x"], "--depths"), (["--depths", "0,2"], "--depths"),
                                        (["--drafters", "eagle3,nosuch"], "nosuch"),
                                        (["--jsonl", "/no/such/file.jsonl"], "--jsonl")])
def test_bad_flags_stop_with_one_line(argv, word, capsys):
    with pytest.raises(SystemExit) as err:
        bench_depth.parse(argv)
    assert err.value.code == 2
    assert word in capsys.readouterr().err.strip().splitlines()[-1]


def test_summarize_counts_drafting_share_tau_and_speedup():
    def steps(n, committed, draft_s, verify_s):
        return [StepStats(4, 4, committed - 1, committed, draft_s, verify_s) for _ in range(n)]

    plain = [(1.0, 10, steps(10, 1, 0.0, 0.1)), (2.0, 10, steps(10, 1, 0.0, 0.2))]
    runs = [(0.5, 10, steps(4, 2.5, 0.025, 0.1)), (0.5, 10, steps(4, 2.5, 0.05, 0.1))]
    row = bench_depth.summarize(runs, plain)
    assert row["tau"] == pytest.approx(2.5)
    assert row["draft_ms"] == pytest.approx(37.5)
    assert row["draft_share"] == pytest.approx(0.3 / 1.1)
    assert (row["speedup_min"], row["speedup"], row["speedup_max"]) == pytest.approx((2.0, 3.0, 4.0))
