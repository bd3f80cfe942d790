"""eval/gpu_check.py without a GPU: imports that a bare GPU machine lacks stay out of its path, flags fail
in one line before any model loads, and sections resume and fail one at a time."""
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_check_needs_none_of_datasets_wandb_matplotlib_scipy():
    code = ("import sys\n"
            "for m in ('datasets', 'wandb', 'matplotlib', 'scipy', 'xgrammar'): sys.modules[m] = None\n"
            "sys.argv = ['gpu_check.py', '--help']\n"
            "import runpy; runpy.run_path('eval/gpu_check.py', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--budget-s" in out.stdout


def test_bad_flags_are_one_line_errors(capsys):
    from draftkit.eval.gpu_check import main

    with pytest.raises(SystemExit):
        main(["--dtypes", "fp16", "--device", "cpu"])
    assert "--dtypes takes fp32 and/or bf16, got 'fp16'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--device", "cuda"])
        assert "sees no CUDA device" in capsys.readouterr().err


def test_sections_resume_and_fail_one_at_a_time(tmp_path):
    from draftkit.eval.gpu_check import Check

    path = tmp_path / "check.json"
    check = Check(path, set(), budget_s=60)
    check.section("a", lambda: {"x": 1})
    check.section("b", lambda: 1 / 0)
    data = json.loads(path.read_text())["sections"]
    assert data["a"]["status"] == "ok" and data["b"]["status"] == "failed" and "ZeroDivisionError" in data["b"]["error"]
    runs = []
    again = Check(path, {"b"}, budget_s=60)
    again.section("a", lambda: runs.append("a"))  # ok already: skipped
    again.section("b", lambda: runs.append("b") or {"y": 2})
    assert runs == ["b"] and json.loads(path.read_text())["sections"]["b"]["status"] == "ok"
    late = Check(path, {"a"}, budget_s=0)
    late.section("a", lambda: runs.append("late"))  # past the budget: not run, its earlier result kept
    late.section("c", lambda: runs.append("late"))
    data = json.loads(path.read_text())["sections"]
    assert "late" not in runs and data["a"]["status"] == "ok" and data["c"]["status"] == "skipped"


def test_a_check_of_other_settings_is_kept_aside_and_run_again(tmp_path):
    """A file written with other settings (--quick on a CPU, say) is moved to <out>.previous.json and nothing in it
    counts as done for these settings."""
    from draftkit.eval.gpu_check import Check

    path = tmp_path / "check.json"
    Check(path, set(), 60, {"device": "cpu", "quick": True}).section("a", lambda: {"x": 1})
    runs = []
    Check(path, set(), 60, {"device": "cpu", "quick": True}).section("a", lambda: runs.append("same"))
    Check(path, set(), 60, {"device": "cuda", "quick": False}).section("a", lambda: runs.append("other") or {"x": 2})
    assert runs == ["other"] and json.loads(path.read_text())["config"]["device"] == "cuda"
    assert json.loads((tmp_path / "check.previous.json").read_text())["sections"]["a"]["result"] == {"x": 1}


def test_family_report_counts_waits_on_the_device_path():
    """The dry run reports each drafter's waits per step through the device shim (eval/syncs.DeviceShim)."""
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
    from draftkit.drafters.lookahead import LookaheadDrafter
    from draftkit.eval.gpu_check import family_report
    from tests.models import tiny_model

    target = tiny_model("llama")
    makers = {"lookahead": LookaheadDrafter,
              "eagle": lambda: EagleDrafter(target, EagleDraftModel.from_target(target), max_depth=3, top_k=1)}
    report = family_report(target, makers, [[1, 2, 3, 4] * 4, [5, 6, 7] * 5], n=24, repeats=1)
    for name in makers:
        row = report["drafters"][name]
        assert row["identical"] == "2/2" and row["mismatches"] == 0
        assert row["waits_per_step"] == pytest.approx(1.0), row
