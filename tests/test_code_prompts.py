"""eval/code_prompts.py: prompts of code from projects the corpus never read, readable by compare.py."""
import json

import pytest

from draftkit.eval import code_prompts
from draftkit.eval.cli_checks import read_prompts_file


def test_writes_windows_of_other_projects_that_compare_reads(tmp_path):
    out = tmp_path / "p.jsonl"
    assert code_prompts.main(["--dists", "pytest,pluggy", "--prompts", "5", "--chars", "400", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5
    assert [r["source"].split("/")[0] for r in rows] == ["pytest", "pluggy", "pytest", "pluggy", "pytest"]
    assert all(400 <= len(r["prompt"]) <= 400 + 400 and r["task"] == "other-code" for r in rows)
    texts = read_prompts_file(str(out))
    assert [t.task for t in texts] == ["other-code"] * 5 and texts[0].text == rows[0]["prompt"]
    again = tmp_path / "q.jsonl"
    code_prompts.main(["--dists", "pytest,pluggy", "--prompts", "5", "--chars", "400", "--out", str(again)])
    assert again.read_text() == out.read_text()  # the same seed, the same file


@pytest.mark.parametrize("argv, words", [
    (["--dists", "torch"], "training corpus reads it"),
    (["--dists", "no-such-dist"], "'no-such-dist' is not installed"),
    (["--dists", ","], "--dists is empty"),
    (["--prompts", "0"], "--prompts 0"),
])
def test_bad_input_is_one_line(tmp_path, capsys, argv, words):
    assert code_prompts.main(argv + ["--out", str(tmp_path / "x.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err and not (tmp_path / "x.jsonl").exists()
