"""eval/verify_curve.py: one-line errors before any model loads, the table's padding marks, and (slow) a real run."""
from __future__ import annotations

import pytest

from draftkit.eval import verify_curve
from draftkit.verify.cost_profile import CostProfile


@pytest.mark.parametrize("argv, says", [
    (["--targets", "nosuch/model.gguf"], "error: --targets: nosuch/model.gguf: no such GGUF file"),
    (["--targets", " , "], "--targets names no target"),
    (["--context", "0"], "--context must be at least 1, got 0"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys, tmp_path):
    try:
        code = verify_curve.main(argv + ["--out", str(tmp_path)])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and says in err[-1]
    assert not list(tmp_path.iterdir())  # nothing written


def test_the_table_marks_each_padded_size_with_the_size_it_runs_as():
    prof = CostProfile(0.01, [1, 2, 3, 4], [1.2, 1.2, 1.2, 1.2], padded=[[1, 4], [2, 4], [3, 4]],
                       unpadded=[1.3, 1.5, 1.25, 1.2])
    rows = verify_curve.table({"t": prof}).splitlines()
    assert "1.50 / 1.20 (as 4)" in rows[2] and "(as" not in rows[4]


@pytest.mark.slow
def test_the_shipped_target_s_curve_is_written_as_a_table_and_a_plot(tmp_path, capsys):
    assert verify_curve.main(["--out", str(tmp_path)]) == 0
    text = (tmp_path / "verify_curve.txt").read_text()
    assert "context 256" in text and len(text.splitlines()) == 3 + 16 + 2  # machine, context, header, sizes
    assert (tmp_path / "verify_curve.png").stat().st_size > 1000
