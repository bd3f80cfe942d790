"""Evaluation prompts, all from held-out text (never trained on).

- code:  a window of a held-out stdlib module; continue the code.
- copy:  a held-out snippet, then the start of the same snippet again; the continuation
         repeats what the prompt holds (where n-gram drafters shine).
- prose: English documentation text (pydoc's topics, held out from training).
- json:  prompts asking for a JSON object of a shipped schema, decoded under that schema (eval/json_task.py).
- chat:  the chat set, a task per category (chat/writing, ...), and humaneval: HumanEval's problems
         (eval/chat_tasks.py); rendered with the target's chat template when it has one.
- jsonl: a user's file, one {"prompt": ...} or Spec-Bench {"turns": [...]} object per line.

`chat` (None: auto) says whether prompts go through the chat template: auto templates the instruction tasks
(chat, humaneval, a prompts file) when the tokenizer has a template and leaves the text windows (code, copy,
prose) as text to continue; True templates every task (a window becomes the user's turn), False none.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

TASKS = ("code", "copy", "prose", "json", "chat", "humaneval")
INSTRUCTION_TASKS = ("chat", "humaneval", "jsonl")


@dataclass
class Prompt:
    task: str
    ids: list[int]
    source: str  # where the text came from
    messages: list[dict] | None = None  # the conversation `ids` renders, when chat-templated
    later_turns: list[str] = field(default_factory=list)  # user turns that follow the target's answer


def use_chat(chat: bool | None, task: str, tokenizer) -> bool:
    """Whether `task`'s prompts go through the chat template (module docstring)."""
    from draftkit.eval.chat_tasks import has_template

    if chat is None:
        return task.split("/")[0] in INSTRUCTION_TASKS and has_template(tokenizer)
    return chat


def as_chat(prompt: Prompt, tokenizer) -> Prompt:
    """A text prompt made the user's turn of a chat."""
    from draftkit.eval.chat_tasks import templated

    messages = [{"role": "user", "content": tokenizer.decode(prompt.ids)}]
    return Prompt(prompt.task, templated(tokenizer, messages), prompt.source, messages=messages)


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
    from draftkit.corpus import PROSE_FILE, build_local_corpus  # reads the corpus: only when tasks are built

    corpus = build_local_corpus()
    code = [(p, t) for p, t in zip(corpus.heldout["path"], corpus.heldout["text"]) if p != PROSE_FILE]
    prose = [(p, t) for p, t in zip(corpus.heldout["path"], corpus.heldout["text"]) if p == PROSE_FILE]
    # topics.py is one dict of long strings: split it into its documentation entries
    prose_parts = [(f"{PROSE_FILE}#{i}", part) for _, t in prose for i, part in enumerate(t.split("\n'"))]
    return code, prose_parts


def build_tasks(tokenizer, tasks=TASKS, n: int = 8, length: int = 192, seed: int = 0,
                chat: bool | None = None) -> dict[str, list[Prompt]]:
    from draftkit.eval.chat_tasks import chat_tasks, humaneval_task

    code, prose = held_out_texts() if set(tasks) & {"code", "copy", "prose"} else ([], [])
    out: dict[str, list[Prompt]] = {}
    for task in tasks:
        if task == "chat":
            out.update(chat_tasks(tokenizer, n, use_chat(chat, task, tokenizer)))
            continue
        if task == "humaneval":
            out[task] = humaneval_task(tokenizer, n, use_chat(chat, task, tokenizer))
            continue
        if task == "json":
            from draftkit.eval.json_task import json_prompts

            out[task] = json_prompts(tokenizer, n)
        elif task == "code":
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
        if task != "json" and use_chat(chat, task, tokenizer):
            out[task] = [as_chat(p, tokenizer) for p in out[task]]
    return out


def from_texts(texts, tokenizer, n: int | None = None, chat: bool | None = None) -> dict[str, list[Prompt]]:
    """Tokenized prompts of a prompts file (eval.cli_checks.read_prompts_file), at most n per task; chat-templated
    (with Spec-Bench's later turns kept for `follow_turns`) when `use_chat` says so for a prompts file."""
    from draftkit.eval.chat_tasks import templated

    templ = use_chat(chat, "jsonl", tokenizer)
    out: dict[str, list[Prompt]] = {}
    for t in texts:
        if n and len(out.get(t.task, [])) >= n:
            continue
        messages = [{"role": "user", "content": t.text}] if templ else None
        ids = templated(tokenizer, messages) if templ else tokenizer(t.text)["input_ids"]
        if not ids:
            raise ValueError(f"{t.source}: the prompt tokenizes to no tokens")
        out.setdefault(t.task, []).append(Prompt(t.task, ids, t.source, messages=messages,
                                                 later_turns=list(getattr(t, "later_turns", ()) or ()) if templ
                                                 else []))
    return out


def fit_to_context(tasks: dict[str, list[Prompt]], room: int) -> list[int]:
    """Cut every prompt longer than `room` tokens from the left (the end is what the model continues).
    Returns how many tokens each cut prompt lost."""
    cuts = []
    for prompts in tasks.values():
        for p in prompts:
            if len(p.ids) > room:
                cuts.append(len(p.ids) - room)
                p.ids = p.ids[-room:]
    return cuts
