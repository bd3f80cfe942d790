"""Checks of eval/compare.py's flags and prompts file, all run before any model loads.

Each check returns the cleaned value or raises `UsageError` with one line that names
the flag (or file:line) and what is wrong; compare.py prints that line and exits
with code 2. Nothing here imports torch or reads weights: the one check that needs
the target (does --max-new-tokens fit its context?) takes the context length, which
compare.py reads from the target's config before loading the model.
"""
from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import dataclass


class UsageError(Exception):
    """Bad input: one line for stderr, exit code 2."""


def error_message(exc: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


# --- numbers ----------------------------------------------------------------------------------
def at_least(flag: str, value: int, low: int) -> int:
    if value < low:
        raise UsageError(f"{flag} must be >= {low}, got {value}")
    return value


def temperature(value: float) -> float:
    if not math.isfinite(value) or value < 0:  # nan fails both comparisons, so test finiteness
        raise UsageError(f"--temperature must be a finite number >= 0 (0 = greedy), got {value}")
    return value


def top_p(value: float) -> float:
    if not 0 < value <= 1:  # also rejects nan
        raise UsageError(f"--top-p must be in (0, 1], got {value}")
    return value


# --- names ------------------------------------------------------------------------------------
def names(flag: str, value: str, choices, all_word: str | None = None) -> tuple[str, ...]:
    """A comma list of names from `choices` (or `all_word` alone for all of them)."""
    listed = [x.strip() for x in value.split(",") if x.strip()]
    offer = ", ".join(choices) + (f" or {all_word}" if all_word else "")
    if not listed:
        raise UsageError(f"{flag} is empty; choose from {offer}")
    if all_word and listed == [all_word]:
        return tuple(choices)
    if all_word and all_word in listed:
        raise UsageError(f"{flag}: {all_word!r} stands alone (it names every one); got {value!r}")
    bad = [x for x in listed if x not in choices]
    if bad:
        raise UsageError(f"{flag}: unknown {', '.join(map(repr, bad))}; choose from {offer}")
    twice = sorted({x for x in listed if listed.count(x) > 1})
    if twice:
        raise UsageError(f"{flag}: {', '.join(map(repr, twice))} listed more than once")
    return tuple(listed)


# a hub id: "name" or "org/name"; letters, digits, "-", "_", "."; no "--" or ".."; at most 96 characters
_HUB_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_HUB_ID = re.compile(rf"^(?:{_HUB_PART}/)?{_HUB_PART}$")


def model_ref(flag: str, value: str | None) -> str | None:
    """An existing folder or something of the form of a hub id (the form only: no network here)."""
    if value is None:
        return None
    if value == "":
        raise UsageError(f"{flag} is empty; leave the flag out to use the shipped model")
    if os.path.isdir(value):
        if not os.path.exists(os.path.join(value, "config.json")):
            raise UsageError(f"{flag} {value!r} holds no config.json: not a saved model folder")
        return value
    if os.path.exists(value):
        raise UsageError(f"{flag} {value!r} is a file; pass the model's folder or a hub id")
    if not _HUB_ID.match(value) or "--" in value or ".." in value:
        raise UsageError(f"{flag} {value!r} is neither an existing folder nor a hub id of the form 'org/name'")
    return value


# --- the prompts file -------------------------------------------------------------------------
@dataclass
class PromptText:
    task: str  # Spec-Bench "category", or "task", or "jsonl"
    text: str
    source: str  # file:line
    later_turns: tuple = ()  # Spec-Bench's turns after the first (asked after the target's answer, in chat)


def _kind(x) -> str:
    return {list: "a list", str: "a string", type(None): "null", bool: "a boolean", dict: "an object"}.get(
        type(x), "a number")


def prompt_line(line: str, where: str) -> PromptText:
    """One JSONL line: {"prompt": str} or Spec-Bench's {"turns": [str, ...], "category": str}."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise UsageError(f'{where}: expected a JSON object such as {{"prompt": "..."}}, got {_kind(row)}')
    if "prompt" in row:
        text, key = row["prompt"], '"prompt"'
    elif "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns:
            raise UsageError(f'{where}: "turns" must be a non-empty list of strings, got {_kind(turns)}')
        text, key = turns[0], '"turns"[0]'
        later = next((i for i, t in enumerate(turns[1:], 1) if not isinstance(t, str) or not t), None)
        if later is not None:  # a later turn is asked after the target's answer: it must be text too
            raise UsageError(f'{where}: "turns"[{later}] must be a non-empty string, got {_kind(turns[later])}')
    else:
        keys = ", ".join(map(repr, row)) or "none"
        raise UsageError(f'{where}: no "prompt" key (nor Spec-Bench "turns"); its keys: {keys}')
    if not isinstance(text, str):
        raise UsageError(f"{where}: {key} must be a string, got {_kind(text)}")
    if not text:
        raise UsageError(f"{where}: {key} is empty")
    task = row.get("category") or row.get("task") or "jsonl"
    return PromptText(str(task), text, where, tuple(row.get("turns", [])[1:]) if "prompt" not in row else ())


def read_prompts_file(path: str) -> list[PromptText]:
    """Every prompt of a JSONL file (blank lines skipped), or a UsageError naming file:line."""
    if not os.path.exists(path):
        raise UsageError(f"--prompts-file {path!r}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"--prompts-file {path!r} is a folder; pass a .jsonl file")
    try:
        with open(path, encoding="utf-8-sig") as fh:
            raw = fh.read()
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UsageError(f"--prompts-file {path!r}: cannot read it ({e.strerror})") from None
    # split on "\n" only: JSON strings may hold other line separators (U+2028) that splitlines() would cut at
    out = [prompt_line(line, f"{path}:{no}") for no, line in enumerate(raw.split("\n"), 1) if line.strip()]
    if not out:
        raise UsageError(f'{path}: holds no prompts (empty file); expected one {{"prompt": "..."}} object per line')
    return out


# --- what needs the target's config -----------------------------------------------------------
def fits_context(context: int | None, max_new_tokens: int, prompt_len: int | None) -> None:
    """--max-new-tokens (and --prompt-len for the built-in tasks) against the target's positions."""
    if not context:
        return
    if max_new_tokens >= context:
        raise UsageError(f"--max-new-tokens {max_new_tokens} does not fit the target's context of {context} "
                         f"positions (at most {context - 1}: a prompt needs one)")
    if prompt_len is not None and prompt_len + max_new_tokens > context:
        raise UsageError(f"--prompt-len {prompt_len} + --max-new-tokens {max_new_tokens} exceed the target's "
                         f"context of {context} positions; lower one of them")


# --- the results folder -----------------------------------------------------------------------
def out_folder(value: str | None) -> str:
    """The results folder, created: `value`, or runs/compare/<timestamp>/ (a fresh one)."""
    if value is None:
        base = path = os.path.join("runs", "compare", time.strftime("%Y%m%d-%H%M%S"))
        n = 1
        while os.path.exists(path):
            n += 1
            path = f"{base}-{n}"
    else:
        path = value
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--out {path!r} is a file, not a folder")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {path!r}: cannot create it ({e.strerror})") from None
    return path
