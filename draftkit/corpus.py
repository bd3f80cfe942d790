"""The offline corpus: Python source that every machine running draftkit has, split into train / held-out by file.

Training (train/) reads its train split, evaluation (eval/) draws its prompts from the held-out split, so both
import it from here. Two offline sources:

- `stdlib`: the standard library of the running interpreter, tests excluded (what the shipped family saw).
- `python`: `stdlib` plus the Python source of draftkit's own dependencies (torch, transformers, datasets,
  accelerate, peft, wandb, tokenizers, safetensors, pyyaml, tqdm, matplotlib, as installed): tests, vendored
  code and generated files over MAX_FILE_BYTES left out. Their files are named `site-packages/<path>`.

A file is held out when the hash of its relative path says so (HELDOUT_PERCENT of paths), so the split never
depends on file order or on the machine, and a file keeps its split when the corpus grows. The fingerprint
is a sha256 over (path, content hash) of every file read: runs record it, caches are keyed by it.
Real users pass a hub dataset name or local text / JSON files instead; those end in `datasets.Dataset` splits with
a "text" column, the Python sources in `Columns` (the same columns, no `datasets` needed).
"""
from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HELDOUT_PERCENT = 5
# English prose held out from training: the documentation topics of pydoc.
PROSE_FILE = "pydoc_data/topics.py"
SOURCES = ("stdlib", "python")
MAX_FILE_BYTES = 500_000  # dependency files above this are generated tables (the stdlib keeps all)
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
_SKIP_DEP_PARTS = _SKIP_PARTS | {"testing", "vendor", "_vendor", "vendored", "third_party"}
# draftkit's runtime dependencies, as pyproject.toml lists them (used when draftkit is not pip-installed)
DEPENDENCIES = ("torch", "transformers", "datasets", "accelerate", "peft", "wandb", "tokenizers", "safetensors",
                "pyyaml", "tqdm", "matplotlib")


class Columns(dict):
    """Column name -> list of values: all the local sources need of a datasets.Dataset, so that training on them
    needs no `datasets` (a bare GPU machine has torch and transformers only)."""

    def __len__(self) -> int:
        return len(next(iter(self.values()), []))

    @property
    def column_names(self) -> list[str]:
        return list(self)


@dataclass
class Corpus:
    train: "Dataset"  # noqa: F821 - columns: path, text
    heldout: "Dataset"  # noqa: F821 - columns: path, text
    fingerprint: str  # sha256 over (path, content hash) of every file read
    source: str


def is_heldout(rel_path: str) -> bool:
    if rel_path == PROSE_FILE:
        return True
    digest = hashlib.sha1(rel_path.encode()).digest()
    return digest[0] * 100 // 256 < HELDOUT_PERCENT



def stdlib_files(root: str | None = None) -> list[tuple[str, Path]]:
    """(relative path, absolute path) of the stdlib's .py files (or those under `root`), tests excluded."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if _SKIP_PARTS.intersection(rel.split("/")) or rel.startswith("test_"):
            continue
        found.append((rel, path))
    return found


def dependencies() -> list[str]:
    """draftkit's runtime requirements (no extras), from its installed metadata or else pyproject's list."""
    try:
        reqs = metadata.requires("draftkit") or []
    except metadata.PackageNotFoundError:
        return list(DEPENDENCIES)
    names = [re.split(r"[\s<>=!~;\[(]", r, maxsplit=1)[0] for r in reqs if "extra ==" not in r]
    return [n for n in names if n] or list(DEPENDENCIES)


def dependency_files(names: list[str] | None = None) -> list[tuple[str, Path]]:
    """(site-packages/<path>, absolute path) of the installed .py files of the distributions `names`
    (default: draftkit's dependencies); tests, vendored code and files over MAX_FILE_BYTES left out."""
    found = {}
    for name in names or dependencies():
        try:
            files = metadata.distribution(name).files or []
        except metadata.PackageNotFoundError:
            continue  # an optional dependency that is not installed here
        for f in files:
            rel = Path(f).as_posix()
            parts = rel.split("/")
            if not rel.endswith(".py") or parts[0] == ".." or _SKIP_DEP_PARTS.intersection(parts[:-1]) \
                    or parts[-1].startswith("test_"):
                continue
            path = Path(f.locate())
            if path.is_file() and path.stat().st_size <= MAX_FILE_BYTES:
                found[f"site-packages/{rel}"] = path
    return sorted(found.items())


def python_files() -> list[tuple[str, Path]]:
    """The `python` source: the stdlib plus draftkit's dependencies."""
    return stdlib_files() + dependency_files()


class CorpusError(ValueError):
    """A corpus that cannot be read as asked: one line naming the source and what is wrong."""


def corpus_from_files(files: list[tuple[str, Path]], source: str) -> Corpus:
    """Read (relative path, path) pairs and split them by file."""
    if not files:
        raise CorpusError(f"no .py files found for corpus {source!r}")
    rows = {"train": {"path": [], "text": []}, "heldout": {"path": [], "text": []}}
    fp = hashlib.sha256()
    for rel, path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        fp.update(rel.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
        split = "heldout" if is_heldout(rel) else "train"
        rows[split]["path"].append(rel)
        rows[split]["text"].append(text)
    return Corpus(train=Columns(rows["train"]), heldout=Columns(rows["heldout"]), fingerprint=fp.hexdigest(),
                  source=source)


def build_local_corpus(root: str | None = None) -> Corpus:
    """Read a source tree (default: the stdlib) and split it by file."""
    return corpus_from_files(stdlib_files(root), f"local:{root or 'stdlib'}")


def _local_rows(path: str, text_column: str) -> dict:
    """Rows of a local .txt (one per line) or .json / .jsonl file, read in memory (no datasets cache writes)."""
    with open(path, encoding="utf-8") as fh:
        if path.endswith(".txt"):
            return {text_column: fh.read().splitlines()}
        records = _jsonl_records(fh, path) if path.endswith(".jsonl") else _json_records(fh, path)
    columns = {k for r in records for k in r}
    return {c: [r.get(c) for r in records] for c in sorted(columns)}


def _jsonl_records(fh, path: str) -> list[dict]:
    records = []
    for n, line in enumerate(fh, 1):
        if line.strip():
            try:
                records.append(_record(json.loads(line), path, n))
            except json.JSONDecodeError as e:
                raise CorpusError(f"{path}: line {n} is not JSON ({e.msg})") from None
    return records


def _json_records(fh, path: str) -> list[dict]:
    """A list of records, or an object of equally long columns."""
    try:
        data = json.load(fh)
    except json.JSONDecodeError as e:
        raise CorpusError(f"{path}: line {e.lineno} is not JSON ({e.msg})") from None
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()) and \
            len({len(v) for v in data.values()}) <= 1:
        data = [dict(zip(data, r)) for r in zip(*data.values())]
    if not isinstance(data, list):
        raise CorpusError(f"{path}: expected a list of records or an object of equally long columns (lists)")
    return [_record(r, path, n) for n, r in enumerate(data, 1)]


def _record(r, path: str, n: int) -> dict:
    if not isinstance(r, dict):
        raise CorpusError(f"{path}: record {n} is {type(r).__name__}, not an object of named fields")
    return r


def corpus_problem(source: str) -> str | None:
    """Why `source` cannot be a corpus now (one clause), or None; checked before any model loads."""
    if source in ("stdlib", "python") or os.path.isdir(source):
        return None
    kinds = "a corpus is stdlib, python, a folder of .py files, a .txt/.json/.jsonl file or a hub dataset"
    if source.endswith((".txt", ".json", ".jsonl")):
        return None if os.path.isfile(source) else "no such file"
    from draftkit.models import hub_problem, looks_like_path

    if looks_like_path(source):
        return f"no such folder or file ({kinds})"  # a path, not a hub dataset's name

    return hub_problem(source, repo_type="dataset")


def build_corpus(source: str = "stdlib", text_column: str = "text", heldout_fraction: float = 0.05) -> Corpus:
    """`stdlib`, `python`, a folder of .py files, local .txt/.json/.jsonl files, or a hub dataset name."""
    if source == "stdlib":
        return build_local_corpus()
    if source == "python":
        return corpus_from_files(python_files(), "python")
    if os.path.isdir(source):
        return build_local_corpus(source)
    from datasets import Dataset, load_dataset

    if source.endswith((".txt", ".json", ".jsonl")):
        ds = Dataset.from_dict(_local_rows(source, text_column))
        with open(source, "rb") as fh:
            fp = hashlib.sha256(source.encode() + b"\0" + hashlib.sha256(fh.read()).digest()).hexdigest()
    else:  # a hub dataset: needs network, first-class for real users
        try:
            ds = load_dataset(source, split="train")
        except (OSError, ValueError) as e:  # not on the hub, private, no "train" split, out of reach
            raise CorpusError(f"corpus {source!r}: {' '.join(str(e).split())}") from None
        fp = hashlib.sha256(f"{source}:{ds._fingerprint}".encode()).hexdigest()
    if text_column not in ds.column_names:
        raise CorpusError(f"dataset {source!r} has no column {text_column!r}; columns: {ds.column_names}")
    ds = ds.rename_column(text_column, "text") if text_column != "text" else ds
    split = ds.train_test_split(test_size=heldout_fraction, seed=0)
    return Corpus(train=split["train"], heldout=split["test"], fingerprint=fp, source=source)
