"""eval/plot_scaling.py: runs of one draft continued in different folders stay apart, offsets apply by name."""
import json

from draftkit.eval.plot_scaling import curves, main


def write_run(folder, rows):
    folder.mkdir(parents=True)
    (folder / "heldout_history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_continued_runs_of_one_draft_are_two_curves_with_their_own_offsets(tmp_path):
    write_run(tmp_path / "zoo3" / "eagle3", [{"step": 100, "tokens_seen": 1_000_000, "acc_0": 0.50, "tau": 3.5}])
    write_run(tmp_path / "zoo5" / "eagle3", [{"step": 50, "tokens_seen": 500_000, "acc_0": 0.57}])
    out = curves([str(tmp_path / "zoo3" / "eagle3"), str(tmp_path / "zoo5" / "eagle3")],
                 {"zoo5/eagle3": 2_000_000})
    assert out == {"zoo3/eagle3": ([(1.0, 0.50)], [(1.0, 3.5)]), "zoo5/eagle3": ([(2.5, 0.57)], [])}


def test_the_plot_is_written(tmp_path):
    write_run(tmp_path / "runs" / "eagle2", [{"step": 1, "tokens_seen": 1_000_000, "acc_0": 0.5, "tau": 3.0},
                                            {"step": 2, "tokens_seen": 2_000_000, "acc_0": 0.6, "tau": 3.5}])
    out = tmp_path / "scaling.png"
    assert main([str(tmp_path / "runs" / "eagle2"), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
