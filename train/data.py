"""Corpora, tokenizer and packed token blocks for every training recipe.

The default corpus is the Python standard library source of the running
interpreter (tests excluded): every machine has it, so the default model
family can be rebuilt offline. Files are split into train / held-out by a hash
of their relative path, so the split never depends on file order or on the
machine, and held-out files are never trained on. Real users pass a hub
dataset name or local text / JSON files instead; all paths end in a
`datasets.Dataset` with a "text" column.
"""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset, load_dataset

HELDOUT_PERCENT = 5
# English prose held out from training: the documentation topics of pydoc.
PROSE_FILE = "pydoc_data/topics.py"
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


@dataclass
class Corpus:
    train: Dataset  # columns: path, text
    heldout: Dataset  # columns: path, text
    fingerprint: str  # sha256 over (path, content hash) of every file read
    source: str


def _is_heldout(rel_path: str) -> bool:
    if rel_path == PROSE_FILE:
        return True
    digest = hashlib.sha1(rel_path.encode()).digest()
    return digest[0] * 100 // 256 < HELDOUT_PERCENT


def stdlib_files(root: str | None = None) -> list[tuple[str, Path]]:
    """(relative path, absolute path) of the stdlib's .py files, tests excluded."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    found = []
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if _SKIP_PARTS.intersection(rel.split("/")) or rel.startswith("test_"):
            continue
        found.append((rel, path))
    return found


def build_local_corpus(root: str | None = None) -> Corpus:
    """Read a source tree (default: the stdlib) and split it by file."""
    files = stdlib_files(root)
    if not files:
        raise FileNotFoundError(f"no .py files found under {root or 'the stdlib'}")
    rows = {"train": {"path": [], "text": []}, "heldout": {"path": [], "text": []}}
    fp = hashlib.sha256()
    for rel, path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        fp.update(rel.encode() + b"\0" + hashlib.sha256(text.encode()).digest())
        split = "heldout" if _is_heldout(rel) else "train"
        rows[split]["path"].append(rel)
        rows[split]["text"].append(text)
    return Corpus(
        train=Dataset.from_dict(rows["train"]),
        heldout=Dataset.from_dict(rows["heldout"]),
        fingerprint=fp.hexdigest(),
        source=f"local:{root or 'stdlib'}",
    )


def build_corpus(source: str = "stdlib", text_column: str = "text", heldout_fraction: float = 0.05) -> Corpus:
    """`stdlib`, a folder of .py files, local .txt/.json/.jsonl files, or a hub dataset name."""
    if source == "stdlib":
        return build_local_corpus()
    if os.path.isdir(source):
        return build_local_corpus(source)
    if source.endswith((".txt", ".json", ".jsonl")):
        kind = "text" if source.endswith(".txt") else "json"
        ds = load_dataset(kind, data_files=source, split="train")
    else:  # a hub dataset: needs network, first-class for real users
        ds = load_dataset(source, split="train")
    if text_column not in ds.column_names:
        raise KeyError(f"dataset {source!r} has no column {text_column!r}; columns: {ds.column_names}")
    ds = ds.rename_column(text_column, "text") if text_column != "text" else ds
    split = ds.train_test_split(test_size=heldout_fraction, seed=0)
    fp = hashlib.sha256(f"{source}:{ds._fingerprint}".encode()).hexdigest()
    return Corpus(train=split["train"], heldout=split["test"], fingerprint=fp, source=source)


def train_tokenizer(texts, vocab_size: int = 8192, save_dir: str | None = None):
    """Byte-level BPE trained on `texts`, wrapped as a Hugging Face fast tokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=["<|endoftext|>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                  bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    if save_dir:
        tok.save_pretrained(save_dir)
    return tok


def pack_tokens(texts, tokenizer, cache_path: str | None = None) -> torch.Tensor:
    """All texts tokenized and joined with EOS into one 1-D int32 stream (cached on disk)."""
    if cache_path and os.path.exists(cache_path):
        return torch.load(cache_path)
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer(text)["input_ids"])
        ids.append(eos)
    stream = torch.tensor(ids, dtype=torch.int32)
    if cache_path:
        os.makedirs(os.path.dirname(cache_path) or ".", exist_ok=True)
        torch.save(stream, cache_path + ".tmp")
        os.replace(cache_path + ".tmp", cache_path)
    return stream


def token_streams(cfg, corpus: Corpus, tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed (train, held-out) streams, cached under cfg.cache_dir per corpus fingerprint and vocabulary."""
    cache_dir = getattr(cfg, "cache_dir", "")
    cache = os.path.join(cache_dir, f"{corpus.fingerprint[:16]}-{len(tokenizer)}") if cache_dir else None
    train = pack_tokens(corpus.train["text"], tokenizer, cache and cache + "-train.pt")
    heldout = pack_tokens(corpus.heldout["text"], tokenizer, cache and cache + "-heldout.pt")
    return train, heldout


class BlockSampler:
    """Random fixed-length windows of a token stream, resumable by step.

    The window for (step, row) depends only on the seed and the step, so a
    resumed run draws exactly the batches the interrupted one would have.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int = 0):
        if stream.numel() <= seq_len + 1:
            raise ValueError(f"corpus has {stream.numel()} tokens, fewer than one block of {seq_len + 1}")
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed

    def batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        starts = torch.randint(0, self.stream.numel() - self.seq_len, (self.batch_size,), generator=gen)
        rows = [self.stream[s: s + self.seq_len] for s in starts.tolist()]
        return torch.stack(rows).long()  # (B, T)
