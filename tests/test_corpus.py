"""The offline corpus (draftkit.corpus): stdlib keeps its meaning, python adds draftkit's dependencies, the
split is by a hash of each file's path, and eval/ can read it without importing train/."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from draftkit import corpus as dc

ROOT = Path(__file__).resolve().parent.parent


def test_split_is_by_path_hash_and_keeps_the_prose_file_held_out():
    assert dc.is_heldout(dc.PROSE_FILE)
    paths = [f"pkg/module_{i}.py" for i in range(2000)]
    held = [p for p in paths if dc.is_heldout(p)]
    assert 0.03 < len(held) / len(paths) < 0.07  # HELDOUT_PERCENT of paths
    assert held == [p for p in reversed(paths) if dc.is_heldout(p)][::-1]  # order-independent
    assert all(dc.is_heldout(p) == (hashlib.sha1(p.encode()).digest()[0] * 100 // 256 < 5) for p in paths)


def test_stdlib_corpus_is_what_it_was():
    """`--corpus stdlib` reads the same files with the same split as before the python corpus existed."""
    c = dc.build_corpus("stdlib")
    assert c.source == "local:stdlib" and c.fingerprint == dc.build_local_corpus().fingerprint
    assert dc.PROSE_FILE in c.heldout["path"] and not set(c.train["path"]) & set(c.heldout["path"])
    assert not any(p.split("/")[0] in ("test", "idle_test") or p.startswith("test_") for p in c.train["path"])


def test_python_corpus_lists_stdlib_and_dependencies():
    files = dc.python_files()
    paths = [rel for rel, _ in files]
    assert len(paths) == len(set(paths))
    stdlib = {rel for rel, _ in dc.stdlib_files()}
    assert stdlib <= set(paths)
    deps = [rel for rel in paths if rel.startswith("site-packages/")]
    tops = {rel.split("/")[1] for rel in deps}
    assert {"torch", "transformers", "datasets", "accelerate", "peft"} <= tops
    assert "transformers/models/llama/modeling_llama.py" in {rel.split("/", 1)[1] for rel in deps}
    assert not any({"tests", "test", "testing", "_vendor", "vendor"} & set(rel.split("/")[:-1]) for rel in deps)
    assert all(path.stat().st_size <= dc.MAX_FILE_BYTES for rel, path in files if rel in set(deps))
    assert set(dc.dependencies()) >= {"torch", "transformers", "datasets", "accelerate", "peft"}


def test_local_text_and_json_files_are_read_in_memory(tmp_path):
    txt = tmp_path / "a.txt"
    txt.write_text("\n".join(f"line {i}" for i in range(40)))
    c = dc.build_corpus(str(txt))
    assert len(c.train) + len(c.heldout) == 40 and c.fingerprint == dc.build_corpus(str(txt)).fingerprint
    jl = tmp_path / "a.jsonl"
    jl.write_text("\n".join(json.dumps({"body": f"text {i}", "id": i}) for i in range(20)))
    c = dc.build_corpus(str(jl), text_column="body")
    assert sorted(list(c.train["text"]) + list(c.heldout["text"])) == sorted(f"text {i}" for i in range(20))
    with pytest.raises(dc.CorpusError, match="no column"):
        dc.build_corpus(str(jl), text_column="missing")


@pytest.mark.parametrize("name, text, says", [
    ("bad.jsonl", '{"text": "a"}\n{"text": \n', "bad.jsonl: line 2 is not JSON"),
    ("bad.json", '{"text": ["a", "b"', "bad.json: line 1 is not JSON"),
    ("list.jsonl", '{"text": "a"}\n["b"]\n', "list.jsonl: record 2 is list"),
    ("cols.json", '{"text": "not a column"}', "expected a list of records or an object of equally long columns"),
    ("ragged.json", '{"text": ["a", "b"], "id": [1]}', "equally long columns")])
def test_a_malformed_local_file_is_one_line_naming_where(tmp_path, name, text, says):
    (tmp_path / name).write_text(text)
    with pytest.raises(dc.CorpusError, match=says):
        dc.build_corpus(str(tmp_path / name))


@pytest.mark.parametrize("source, says", [("missing.txt", "no such file"), ("./a/b", "no such folder or file"),
                                          ("x/y/z", "no such folder or file"), ("stdlib", None)])
def test_corpus_problem_names_what_cannot_be_read_before_anything_loads(source, says):
    problem = dc.corpus_problem(source)
    assert problem is None if says is None else says in problem


def test_an_unreachable_hub_dataset_is_refused_at_once(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    said = dc.corpus_problem("someorg/not-downloaded-here")
    assert said == "neither a folder or file nor in the local hub cache, and HF_HUB_OFFLINE is set", said


def test_eval_can_read_the_corpus_without_train():
    """What eval/tasks.py needs (PROSE_FILE, build_local_corpus) imports from draftkit without train/."""
    code = ("import sys; from draftkit.corpus import PROSE_FILE, build_local_corpus; "
            "assert not any(m == 'train' or m.startswith('train.') for m in sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
    from draftkit.train.data import PROSE_FILE, build_local_corpus  # the old import still works

    assert PROSE_FILE is dc.PROSE_FILE and build_local_corpus is dc.build_local_corpus


def test_a_downloaded_hub_dataset_needs_no_network(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "hub" / "datasets--someorg--chats").mkdir(parents=True)
    assert dc.corpus_problem("someorg/chats") is None  # load_dataset reads it from the cache
    assert "HF_HUB_OFFLINE is set" in dc.corpus_problem("someorg/other")
