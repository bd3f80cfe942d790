"""Evaluation prompts, all from held-out text (never trained on).

- code:  a window of a held-out stdlib module; continue the code.
- copy:  a held-out snippet, then the start of the same snippet again; the continuation
         repeats what the prompt holds (where n-gram drafters shine).
- prose: English documentation text (pydoc's topics, held out from training).
- jsonl: a user's file, one {"prompt": ...} or Spec-Bench {"turns": [...]} object per line.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass

from train.data import PROSE_FILE, build_local_corpus

TASKS = ("code", "copy", "prose")


@dataclass
class Prompt:
    task: str
    ids: list[int]
    source: str  # where the text came from


def _windows(texts: list[tuple[str, str]], tokenizer, n: int, length: int, seed: int, task: str) -> list[Prompt]:
    rng = random.Random(seed)
    pool = [(src, tokenizer(text)["input_ids"]) for src, text in texts]
    pool = [(src, ids) for src, ids in pool if len(ids) > length + 64]
    if not pool:
        raise ValueError(f"no held-out text long enough for {length}-token prompts")
    out = []
    for _ in range(n):
        src, ids = rng.choice(pool)
        start = rng.randrange(0, len(ids) - length - 64)
        out.append(Prompt(task, ids[start:start + length], f"{src}@{start}"))
    return out


def held_out_texts():
    corpus = build_local_corpus()
    code = [(p, t) for p, t in zip(corpus.heldout["path"], corpus.heldout["text"]) if p != PROSE_FILE]
    prose = [(p, t) for p, t in zip(corpus.heldout["path"], corpus.heldout["text"]) if p == PROSE_FILE]
    # topics.py is one dict of long strings: split it into its documentation entries
    prose_parts = [(f"{PROSE_FILE}#{i}", part) for _, t in prose for i, part in enumerate(t.split("\n'"))]
    return code, prose_parts


def build_tasks(tokenizer, tasks=TASKS, n: int = 8, length: int = 192, seed: int = 0) -> dict[str, list[Prompt]]:
    code, prose = held_out_texts()
    out: dict[str, list[Prompt]] = {}
    for task in tasks:
        if task == "code":
            out[task] = _windows(code, tokenizer, n, length, seed, task)
        elif task == "prose":
            out[task] = _windows(prose, tokenizer, n, length, seed + 1, task)
        elif task == "copy":
            half = length // 2
            snippets = _windows(code, tokenizer, n, half, seed + 2, task)
            out[task] = [Prompt(task, p.ids + tokenizer("\n\n")["input_ids"] + p.ids[: half // 4], p.source)
                         for p in snippets]
        else:
            raise ValueError(f"unknown task {task!r}; choose from {TASKS} or pass --prompts-file")
    return out


def load_jsonl(path: str, tokenizer, n: int | None = None, max_len: int = 512) -> dict[str, list[Prompt]]:
    """{"prompt": str} or Spec-Bench question.jsonl ({"turns": [str, ...], "category": ...}) per line."""
    out: dict[str, list[Prompt]] = {}
    with open(path) as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("prompt") or (row.get("turns") or [None])[0]
            if not isinstance(text, str):
                raise ValueError(f"{path}:{line_no}: expected a 'prompt' string or a 'turns' list")
            task = row.get("category") or row.get("task") or "jsonl"
            ids = tokenizer(text)["input_ids"][-max_len:]
            out.setdefault(task, []).append(Prompt(task, ids, f"{path}:{line_no}"))
    if n:
        out = {k: v[:n] for k, v in out.items()}
    if not out:
        raise ValueError(f"{path} holds no prompts")
    return out
