"""The shipped-model manifest: hashes checked on load, clear errors, and the three-line API."""
import os

import pytest
from transformers import AutoTokenizer

import draftkit as dk
import draftkit.zoo as zoo_mod
from tests.models import tiny_model
from draftkit.train.ship import ship


@pytest.fixture()
def tiny_zoo(tmp_path, monkeypatch):
    """A zoo holding a tiny target and draft with the project's tokenizer."""
    tok = AutoTokenizer.from_pretrained("zoo/tokenizer")
    for name, hidden, layers in (("target", 32, 2), ("draft", 16, 1)):
        src = tmp_path / f"src-{name}"
        tiny_model("llama", vocab=len(tok), hidden=hidden, layers=layers, seed=len(name)).save_pretrained(src)
        tok.save_pretrained(src)
        ship(name, str(src), "recipes/zoo/target.yaml", "test", zoo=tmp_path / "zoo")
    monkeypatch.setattr(zoo_mod, "ZOO", tmp_path / "zoo")
    return tmp_path / "zoo"


def test_manifest_records_hashes_and_provenance(tiny_zoo):
    entry = zoo_mod.manifest()["models"]["target"]
    assert entry["command"] == "test" and entry["recipe"] == "recipes/zoo/target.yaml"
    assert all(len(f["sha256"]) == 64 for f in entry["files"].values())
    assert zoo_mod.available() == ["draft", "target"]


def test_three_line_api(tiny_zoo):
    target, tok = dk.load_target()
    out = dk.generate(target, tok("def add(a, b):").input_ids, dk.make_drafter("standalone", target, max_depth=3),
                      max_new_tokens=12, eos_token_id=[])
    assert out.tokens.numel() == 12 and out.lossless
    plain = dk.generate(target, tok("def add(a, b):").input_ids, max_new_tokens=12, eos_token_id=[])
    assert out.tokens.tolist() == plain.tokens.tolist()


def test_corrupt_file_is_a_clear_error(tiny_zoo):
    weights = tiny_zoo / "target" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(zoo_mod.ZooError, match="corrupt"):
        dk.load_target()


def test_missing_file_and_missing_model_are_clear_errors(tiny_zoo):
    (tiny_zoo / "draft" / "config.json").unlink()
    with pytest.raises(zoo_mod.ZooError, match="missing"):
        zoo_mod.verified_path("draft")
    with pytest.raises(zoo_mod.ZooError, match="has no 'medusa'"):
        zoo_mod.verified_path("medusa")


def test_unknown_drafter_name():
    with pytest.raises(ValueError, match="unknown drafter 'eagel'"):
        dk.make_drafter("eagel", tiny_model("llama"))


def test_exporting_a_shipped_drafter_names_the_shipped_target(tmp_path, capsys):
    """A shipped draft records the folder it was trained against, which a checkout does not have: the serve
    commands name the shipped target instead."""
    from draftkit.models import resolve
    from draftkit.train.export import main

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert main([os.path.join(root, "zoo", "eagle3"), "--format", "vllm", "--out", str(tmp_path / "e3")]) == 0
    out = capsys.readouterr().out
    assert f"vllm serve {resolve(None, 'target')} " in out


def test_shipping_records_the_tau_a_compare_run_measured(tmp_path):
    """ship.py --compare: the drafter's tau per task (and that run's settings and machine) land in the manifest;
    a run without that drafter is an error, not a silent gap."""
    import json

    import pytest

    from draftkit.train.ship import compare_taus

    run = tmp_path / "compare.json"
    run.write_text(json.dumps({"settings": {"tasks": "chat"}, "machine": {"cpu": "x"}, "rows": [
        {"drafter": "eagle3", "task": "humaneval", "tau": 2.5}, {"drafter": "eagle3", "task": "chat/math", "tau": 2.1},
        {"drafter": "plain", "task": "humaneval", "tau": 1.0}]}))
    src = tmp_path / "final"
    src.mkdir()
    (src / "config.json").write_text("{}")
    entry = ship("real/eagle3", str(src), "recipes/smollm2/eagle3.yaml", "test", zoo=tmp_path / "zoo",
                 evaluation=compare_taus(str(run), "eagle3"))
    assert entry["tau_by_task"] == {"humaneval": 2.5, "chat/math": 2.1} and entry["compare_machine"] == {"cpu": "x"}
    manifest = json.loads((tmp_path / "zoo" / "manifest.json").read_text())
    assert manifest["models"]["real/eagle3"]["path"] == "real/eagle3"
    with pytest.raises(ValueError, match="no rows of drafter 'medusa'"):
        compare_taus(str(run), "medusa")


def test_shipping_a_shipped_folder_again_keeps_its_training_record(tmp_path):
    """ship.py --source zoo/<name> (to record a new --compare): the zoo keeps no train_report.json, so the entry's
    tokens and held-out metrics stay as they were rather than vanish; the new evaluation replaces the old."""
    import json

    src = tmp_path / "final"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "train_report.json").write_text(json.dumps({"tokens_seen": 123, "heldout_top1": 0.5}))
    zoo = tmp_path / "zoo"
    ship("real/eagle", str(src), "r.yaml", "first", zoo=zoo, evaluation={"tau_by_task": {"a": 1.5}})
    entry = ship("real/eagle", str(zoo / "real" / "eagle"), "r.yaml", "again", zoo=zoo,
                 evaluation={"tau_by_task": {"a": 1.7}})
    assert entry["tokens_seen"] == 123 and entry["heldout_top1"] == 0.5 and entry["command"] == "again"
    assert entry["tau_by_task"] == {"a": 1.7} and list(entry["files"]) == ["config.json"]

