"""eval/compare.py --quick end to end on the shipped default models."""
import json
import subprocess
import sys

import pytest

from draftkit.zoo import available

ROW_KEYS = {"drafter", "task", "tau", "acceptance_by_depth", "tokens_per_s", "speedup", "lossless"}


def test_default_models_are_shipped():
    assert {"tokenizer", "target", "draft", "medusa", "medusa2", "eagle", "eagle3"} <= set(available())


def test_quick_compare_runs_and_nothing_is_lost(tmp_path):
    out = tmp_path / "quick"
    proc = subprocess.run([sys.executable, "eval/compare.py", "--quick", "--drafters", "all", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "compare.json").read_text())
    assert len((out / "rows.jsonl").read_text().splitlines()) == len(report["rows"])
    rows = report["rows"]
    assert {r["drafter"] for r in rows} >= {"plain", "standalone", "medusa", "eagle", "eagle-chain", "eagle3", "hybrid",
                                            "lookahead", "suffix"}
    for row in rows:
        assert ROW_KEYS <= set(row), row
        assert row["lossless"] is True, row  # greedy: every output identical to plain decoding
        assert row["tokens_per_s"] > 0
    drafted = [r for r in rows if r["kind"] == "draftkit"]
    for r in drafted:  # the controller may let a drafter sit out on a busy machine: its stats must then say so
        assert r["tau"] >= 1.0 and (r["acceptance_by_depth"] or r["tau"] == 1.0), r  # no draft, nothing accepted
    assert any(r["tau"] > 1.2 for r in drafted)  # trained drafters are accepted
    assert (out / "speedup.png").exists() and (out / "compare.txt").exists()
    assert (out / "budget_vs_acceptance.png").exists()  # the default budget is the controller's
    for row in (r for r in rows if r["drafter"] == "hybrid"):  # each member's share of accepted tokens
        shares = row["member_shares"]
        assert set(shares) == {"suffix", "eagle"} and sum(shares.values()) in (pytest.approx(1.0), 0.0), shares
    assert "share of accepted tokens per member" in (out / "compare.txt").read_text()
    assert all(r.get("member_shares") is None for r in rows if r["drafter"] != "hybrid")


@pytest.mark.slow
def test_shipped_drafters_are_lossless_on_long_generations():
    """Every shipped drafter, large trees included, on held-out prompts: 256 greedy tokens each (past the drafts'
    attention window of 256 positions)."""
    import draftkit as dk
    from draftkit.eval.tasks import build_tasks

    target, tok = dk.load_target()
    prompts = [p.ids for t in build_tasks(tok, ["code", "prose"], n=3, seed=11).values() for p in t]
    drafters = {"standalone": dk.make_drafter("standalone", target, max_depth=5),
                "standalone-tree": dk.make_drafter("standalone", target, max_depth=4, top_k=3, max_nodes=16),
                "medusa": dk.make_drafter("medusa", target, max_nodes=32),
                "eagle": dk.make_drafter("eagle", target, max_depth=6, top_k=6, max_nodes=48),
                "eagle3": dk.make_drafter("eagle3", target, max_depth=6, top_k=4, max_nodes=32),
                "peagle": dk.make_drafter("peagle", target, max_depth=8, top_k=3, max_nodes=24),
                "dflash": dk.make_drafter("dflash", target, max_depth=8, top_k=3, max_nodes=24),
                "eagle-chain": dk.make_drafter("eagle-chain", target, max_depth=5),
                "lookahead": dk.make_drafter("lookahead", target, ngram=5, window=7, guesses=7)}
    for ids in prompts:
        ref = dk.generate(target, ids, max_new_tokens=256).tokens.tolist()
        for name, drafter in drafters.items():
            assert dk.generate(target, ids, drafter, max_new_tokens=256).tokens.tolist() == ref, name


def test_budget_both_runs_each_drafter_under_both_budgets_in_one_run(tmp_path):
    out = tmp_path / "both"
    proc = subprocess.run([sys.executable, "eval/compare.py", "--quick", "--budget", "both", "--drafters", "lookahead",
                           "--no-peers", "--tasks", "copy", "--prompts", "1", "--max-new-tokens", "16",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["drafter"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert set(rows) == {"plain", "lookahead", "lookahead fixed"}
    assert "budget auto" in rows["lookahead"]["settings"] and "budget fixed" in rows["lookahead fixed"]["settings"]
    assert rows["lookahead fixed"]["plain_step_share"] is not None and rows["lookahead"]["lossless"] is True
