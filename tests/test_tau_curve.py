"""eval/tau_curve.py: one-line errors before any model loads, tokens trained read from a run or the zoo, a
resumed run that measures only what is missing, and a real (small) curve checked against plain decoding."""
from __future__ import annotations

import json

import pytest

from draftkit.eval import tau_curve
from draftkit.zoo import ZOO, manifest


def run(argv, tmp_path):
    try:
        return tau_curve.main(argv + ["--out", str(tmp_path / "out")])
    except SystemExit as e:  # argparse's own errors
        return e.code


@pytest.mark.parametrize("draft, says", [
    ("eagle", "expected KIND=FOLDER or KIND=FOLDER@TOKENS"),
    ("nosuch=zoo/eagle", "unknown kind 'nosuch'"),
    ("eagle=no/such/folder", "no folder no/such/folder"),
    ("eagle={tmp}@many", "@TOKENS must be a whole number, got 'many'"),
    ("eagle={tmp}", "records no tokens trained"),
])
def test_a_bad_draft_is_one_line_and_exit_2_before_anything_loads(draft, says, tmp_path, capsys):
    assert run(["--draft", draft.format(tmp=tmp_path)], tmp_path) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and not (tmp_path / "out").exists()


def test_no_draft_and_a_missing_target_are_refused(tmp_path, capsys):
    assert run([], tmp_path) == 2
    assert "at least one --draft" in capsys.readouterr().err
    assert run(["--draft", f"eagle={ZOO / 'eagle'}", "--extrapolate", "-1"], tmp_path) == 2
    assert "--extrapolate must be 0 or more" in capsys.readouterr().err
    assert run(["--target", "nosuch.gguf", "--draft", f"eagle={ZOO / 'eagle'}"], tmp_path) == 2
    assert "nosuch.gguf" in capsys.readouterr().err.strip().splitlines()[-1]


def test_tokens_trained_come_from_the_run_the_zoo_or_the_flag(tmp_path):
    (tmp_path / "train_report.json").write_text(json.dumps({"tokens_seen": 5000}))
    kinds = ("eagle", "eagle3")
    assert tau_curve.parse_draft(f"eagle={tmp_path}", kinds).tokens == 5000
    assert tau_curve.parse_draft(f"eagle={tmp_path}@77", kinds).tokens == 77
    shipped = tau_curve.parse_draft(f"eagle3={ZOO / 'eagle3'}", kinds)
    assert shipped.tokens == manifest()["models"]["eagle3"]["tokens_seen"] > 0


def test_only_lines_of_the_same_settings_are_reused(tmp_path):
    path = tmp_path / "tau_curve.jsonl"
    same = {"target": "t", "tasks": ["code"], "prompts": 1, "max_new_tokens": 8}
    lines = [{"kind": "eagle", "folder": "a", "settings": same}, {"kind": "eagle", "folder": "b",
                                                                   "settings": {**same, "prompts": 2}}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert list(tau_curve.done_lines(str(path), same)) == [("eagle", "a")]
    assert tau_curve.done_lines(str(tmp_path / "none.jsonl"), same) == {}


def test_a_curve_on_the_shipped_family_is_measured_once_and_resumed(tmp_path, monkeypatch):
    argv = ["--target", "default", "--tasks", "code", "--prompts", "1", "--max-new-tokens", "12",
            "--draft", f"eagle={ZOO / 'eagle'}", "--draft", f"eagle3={ZOO / 'eagle3'}"]
    assert run(argv, tmp_path) == 0
    out = tmp_path / "out"
    lines = [json.loads(x) for x in (out / "tau_curve.jsonl").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["eagle", "eagle3"]
    assert all(x["differs"] == [] and x["tau"]["code"] > 1.0 for x in lines)  # shipped drafts draft on code
    assert (out / "tau_curve.png").stat().st_size > 1000
    seen = manifest()["models"]["eagle3"]["tokens_seen"] / 1e6
    assert f"| eagle3 | {seen:.2f}M |" in (out / "tau_curve.txt").read_text()

    def measured_again(*a, **k):
        raise AssertionError("a finished draft was measured again (or its target loaded)")

    import draftkit as dk

    monkeypatch.setattr(tau_curve, "measure_draft", measured_again)
    monkeypatch.setattr(dk, "load_target", measured_again)
    assert run(argv + ["--extrapolate", "9"], tmp_path) == 0  # both lines reused: redrawn, nothing measured
    assert len((out / "tau_curve.jsonl").read_text().splitlines()) == 2
    assert "the fit at 9M" not in (out / "tau_curve.txt").read_text()  # one point per drafter: no line to fit


def test_a_sampled_curve_is_measured_apart_and_not_compared(tmp_path, monkeypatch):
    """--temperature: the draft samples at its full tree (seed 0), plain decoding does not run (nothing to compare
    sampled output against), and greedy lines of the same folder are not reused for it, nor it for them."""
    from draftkit.eval import measure

    argv = ["--target", "default", "--tasks", "code", "--prompts", "1", "--max-new-tokens", "12",
            "--draft", f"eagle={ZOO / 'eagle'}"]
    names = []
    real = measure.measure
    monkeypatch.setattr(measure, "measure", lambda methods, *a, **k: names.extend(m.name for m in methods)
                        or real(methods, *a, **k))
    assert run(argv + ["--temperature", "0.7"], tmp_path) == 0
    assert names == ["eagle"]
    out = tmp_path / "out"
    line, = [json.loads(x) for x in (out / "tau_curve.jsonl").read_text().splitlines()]
    assert line["settings"]["temperature"] == 0.7 and line["differs"] == [] and line["tau"]["code"] >= 1.0
    text = (out / "tau_curve.txt").read_text()
    assert "sampled at temperature 0.7 (seed 0)" in text and "n/a (sampled)" in text
    assert run(argv, tmp_path) == 0 and names == ["eagle", "plain", "eagle"]  # greedy: measured, checked
    assert run(argv + ["--temperature", "-1"], tmp_path) == 2


def test_the_fit_is_the_least_squares_line_and_needs_two_token_counts():
    assert tau_curve.fit([(1.0, 1.5), (2.0, 1.7), (3.0, 1.9)]) == pytest.approx((0.2, 1.3))
    assert tau_curve.fit([(1.0, 1.5), (1.0, 1.7)]) is None
    lines = [{"kind": "eagle", "tokens_seen": t * 1e6, "chat_mean": 1.3 + 0.2 * t, "tau": {}} for t in (1, 2)]
    assert tau_curve.slopes(lines, 10) == "chat set (mean over categories), eagle: +0.200 tau per million " \
                                          "tokens; the fit at 10M: 3.30"
