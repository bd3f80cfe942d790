r"""Training conversations for drafts of a chat target, built offline: user turns only, the target answers them.

    python train/chat_prompts.py --out runs/chat/prompts.jsonl --rows 4096

A draft must learn what the target says when it answers a user, so the prompts must look like what users ask:
chat, code, documents, math. None of HumanEval or the evaluation chat set (eval/prompts/chat.jsonl) is used; a
test checks that no training prompt shares an 8-word run with any evaluation prompt. Three sources:
- code: functions and classes from the training split of the offline corpus (draftkit/corpus.py; its held-out
  files are never read), with requests to explain, test, review, document or rewrite them, or to write a function
  from its docstring's first line; with `--complete SHARE`, that share of the rows show a function's signature and
  docstring only and ask for its body (the shape of a HumanEval problem, none of its words or functions);
- documents: module and class docstrings of the same files as passages to summarize, question, translate,
  simplify or mine for terms;
- general: writing, role-play, reasoning, arithmetic word problems, science and humanities questions composed
  from word lists (the evaluation set's topics are not among them).
Each row is {"messages": [user, empty assistant], "kind": ...}; train/targetdata.py renders it with the target's
chat template and `regenerate` lets the target write every assistant turn. The output is deterministic in --seed;
no user text appears twice, and `--exclude` leaves out those of earlier files (data beyond theirs).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import random
import sys
from pathlib import Path

CODE_ASKS = [
    "Explain what the following Python code does, step by step.\n\n```python\n{code}\n```",
    "Write pytest unit tests for this function.\n\n```python\n{code}\n```",
    "Review this code and point out possible bugs or edge cases.\n\n```python\n{code}\n```",
    "Add type hints and a clear docstring to this code.\n\n```python\n{code}\n```",
    "Rewrite this code to be shorter and easier to read, keeping its behaviour.\n\n```python\n{code}\n```",
    "What is the time complexity of this code? Justify briefly.\n\n```python\n{code}\n```",
]
WRITE_ASK = "Write a Python function `{name}({args})` that does the following: {doc}"
COMPLETE_ASKS = [  # worded apart from eval/chat_tasks.py's HUMANEVAL_ASK (the 8-word-run test checks it)
    "Implement the body of this Python function so that it does what its docstring says.\n\n```python\n{head}```",
    "Finish writing this function and give the complete code in a Python code block.\n\n```python\n{head}```",
    "Here is a signature with its docstring. Write the implementation.\n\n```python\n{head}```",
    "Fill in the missing code of this function:\n\n```python\n{head}```",
]
DOC_ASKS = [
    "Summarize this passage in a few sentences.\n\n{text}",
    "Read the passage and list its three most important points.\n\n{text}",
    "Explain this passage to a beginner programmer in plain words.\n\n{text}",
    "Translate the following passage into {language}.\n\n{text}",
    "Extract the technical terms from this text and return them as a JSON list.\n\n{text}",
    "Passage:\n{text}\n\nQuestion: according to the passage, what is the main purpose of `{name}`?",
]
LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese"]
WRITING = ["Compose a short poem about {a}.", "Write a diary entry of someone who just discovered {a}.",
           "Write a product description for a {b} that helps with {a}.",
           "Draft a friendly email inviting colleagues to a workshop on {a}.",
           "Tell a short fable in which a {c} learns about {a}."]
ROLES = ["Act as a {r} and give advice to a customer who asks about {a}.",
         "You are a {r}. Describe a typical working day in the first person.",
         "Pretend to be a {r} interviewing a candidate; ask five questions about {a}."]
REASON = ["A {c} is heavier than a {b}, and a {b} is heavier than a cup. Which is lightest? Explain.",
          "If every {c} in a village owns a {b}, and Tom owns no {b}, can Tom be a {c} of the village? Why?",
          "List the pros and cons of replacing a {b} with a {c}, then decide."]
MATH = ["A shop sells {b}s for {x} dollars each. Ana buys {y} of them and pays with {z} dollars. "
        "How much change does she get? Show your work.",
        "A train travels {x} km in {y} hours. At the same speed, how far does it go in {z} hours?",
        "What is {x} percent of {z}? Explain the calculation.",
        "Solve for n: {y} * n + {x} = {z}. Show each step."]
SCIENCE = ["photosynthesis", "plate tectonics", "the water cycle", "magnetism", "nuclear fusion", "vaccines",
           "black holes", "enzymes", "ocean tides", "semiconductors", "the greenhouse effect", "DNA replication",
           "volcanoes", "antibiotics", "earthquakes", "glaciers", "coral reefs", "solar panels", "fermentation",
           "the periodic table", "sound waves", "friction", "the immune system", "radioactive decay"]
HUMANITIES = ["the printing press", "the Silk Road", "ancient Egyptian writing", "the Renaissance",
              "the industrial revolution", "Greek philosophy", "the invention of paper", "medieval castles",
              "the Ming dynasty", "the Aztec calendar", "the abolition of slavery", "the Meiji restoration",
              "early map making", "the history of coffee", "the ancient Olympic games", "Baroque music",
              "the Hanseatic League", "the invention of the compass", "the Inca road system", "Viking sagas"]
ASK_TOPIC = ["Explain {t} in simple terms.", "Give three surprising facts about {t}.",
             "Why is {t} important? Answer in one paragraph.", "Write a short quiz of four questions about {t}.",
             "What are common misconceptions about {t}?", "How would you teach {t} to a ten-year-old?",
             "Write a short dialogue between two students who disagree about {t}.",
             "Outline a five-minute talk on {t}, with a heading per part."]
THINGS_A = ["gardening", "saving money", "learning a language", "time management", "recycling", "cooking rice",
            "public speaking", "bird watching", "night photography", "home repairs"]
THINGS_B = ["lamp", "bicycle", "backpack", "notebook", "kettle", "umbrella", "chair", "clock"]
THINGS_C = ["fox", "robot", "farmer", "sailor", "teacher", "owl", "baker", "pilot"]
ROLE_NAMES = ["librarian", "travel agent", "chef", "mechanic", "museum guide", "fitness coach", "pharmacist"]


def snippets(files: list[tuple[str, str]], rng: random.Random, max_chars: int = 1200):
    """(kind, name, args, code, doc) for top-level functions and classes of the given (path, source) files."""
    out = []
    for _, src in files:
        try:
            tree = ast.parse(src)
        except (SyntaxError, ValueError):
            continue
        lines = src.splitlines()
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            code = "\n".join(lines[node.lineno - 1:node.end_lineno])
            doc = ast.get_docstring(node) or ""
            if 80 < len(code) <= max_chars:
                args = ", ".join(a.arg for a in node.args.args) if isinstance(node, ast.FunctionDef) else ""
                out.append(("code", node.name, args, code, doc))
            if len(doc) > 300 and isinstance(node, ast.ClassDef):
                out.append(("doc", node.name, "", "", doc[:1500]))
        mod_doc = ast.get_docstring(tree) or ""
        if len(mod_doc) > 300:
            out.append(("doc", Path(_).stem, "", "", mod_doc[:1500]))
    rng.shuffle(out)
    return out


GENERAL_KINDS = ("writing", "roleplay", "reasoning", "math", "stem", "humanities")


def general(rng: random.Random, kind: str | None = None) -> tuple[str, str]:
    """(kind, request) of a general kind (`kind`, or one drawn)."""
    fill = dict(a=rng.choice(THINGS_A), b=rng.choice(THINGS_B), c=rng.choice(THINGS_C), r=rng.choice(ROLE_NAMES),
                x=rng.randint(2, 90), y=rng.randint(2, 12), z=rng.randint(100, 500))
    kind = kind or rng.choice(GENERAL_KINDS)
    if kind in ("stem", "humanities"):
        topic = rng.choice(SCIENCE if kind == "stem" else HUMANITIES)
        return kind, rng.choice(ASK_TOPIC).format(t=topic)
    pool = {"writing": WRITING, "roleplay": ROLES, "reasoning": REASON, "math": MATH}[kind]
    return kind, rng.choice(pool).format(**fill)


MAX_DRAWS_PER_ROW = 20  # draws per conversation asked for before the generator's space counts as used up


def signature_and_docstring(code: str) -> str | None:
    """The lines of a function's source up to the end of its docstring (newline-terminated), or None where the
    snippet is not a function with a docstring and a body after it."""
    try:
        node = ast.parse(code).body[0]
    except (SyntaxError, ValueError, IndexError):
        return None
    if not isinstance(node, ast.FunctionDef) or ast.get_docstring(node) is None or len(node.body) < 2:
        return None
    return "\n".join(code.splitlines()[:node.body[0].end_lineno]) + "\n"


def one(rng: random.Random, i: int, code: list, docs: list) -> tuple[str, str]:
    """(kind, user text) of the i-th draw: about 45% code, 25% documents, 30% general."""
    r = rng.random()
    if r < 0.45 and code:
        _, name, args, src, doc = code[i % len(code)]
        if doc and rng.random() < 0.3:
            return "code-write", WRITE_ASK.format(name=name, args=args, doc=doc.split("\n")[0])
        return "code", rng.choice(CODE_ASKS).format(code=src)
    if r < 0.70 and docs:
        _, name, _, _, doc = docs[i % len(docs)]
        return "document", rng.choice(DOC_ASKS).format(text=doc, name=name, language=rng.choice(LANGUAGES))
    return general(rng)


def build(rows: int, seed: int = 0, files: list[tuple[str, str]] | None = None,
          exclude: frozenset[str] = frozenset(), complete: float = 0.0) -> list[dict]:
    """`rows` conversations, no user text twice and none of `exclude` (the user texts of earlier prompt files):
    fewer where the generator's space runs out (MAX_DRAWS_PER_ROW draws per row asked for). A repeat would only
    weigh one prompt more; the answers to it add little the draft has not seen. A `complete` share of the draws
    asks for a function's body from its signature and docstring; those draws come from a random stream of their
    own, so `complete=0` writes the same file as before the option existed."""
    rng = random.Random(seed)
    rng_complete = random.Random(f"complete-{seed}")
    if files is None:
        from draftkit.corpus import build_local_corpus
        train = build_local_corpus().train  # the training split only: held-out files never become prompts
        files = list(zip(train["path"], train["text"]))
    pool = snippets(files, rng)
    code = [s for s in pool if s[0] == "code"]
    docs = [s for s in pool if s[0] == "doc"]
    heads = [h for h in (signature_and_docstring(s[3]) for s in code) if h] if complete else []
    out, seen = [], set(exclude)
    for i in range(MAX_DRAWS_PER_ROW * rows):
        if len(out) == rows:
            break
        if heads and rng_complete.random() < complete:
            kind, text = "code-complete", rng_complete.choice(COMPLETE_ASKS).format(head=rng_complete.choice(heads))
        else:
            kind, text = one(rng, i, code, docs)
        if text in seen:
            continue
        seen.add(text)
        out.append({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": ""}],
                    "kind": kind})
    return out


def user_texts(path: str) -> set[str]:
    """The user turns of a prompts file (one {"messages": [...]} row per line)."""
    with open(path) as fh:
        return {m["content"] for line in fh if line.strip()
                for m in json.loads(line)["messages"] if m.get("role") == "user"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="the JSONL file to write (its folder is created)")
    ap.add_argument("--rows", type=int, default=4096, help="conversations to write (default: 4096)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the choices (default: 0)")
    ap.add_argument("--exclude", nargs="+", default=[], metavar="FILE",
                    help="prompts files whose conversations to leave out, for data beyond theirs (default: none)")
    ap.add_argument("--complete", type=float, default=0.0, metavar="SHARE",
                    help="share of the rows that show a function's signature and docstring and ask for its body\n"
                         "(HumanEval's shape on the corpus's own functions; default: 0, the mix above only)")
    args = ap.parse_args(argv)
    if args.rows < 1:
        ap.error(f"--rows must be >= 1, got {args.rows}")
    if not 0.0 <= args.complete <= 1.0:
        ap.error(f"--complete must be a share between 0 and 1, got {args.complete}")
    if os.path.isdir(args.out):
        ap.error(f"--out {args.out} is a folder; give the JSONL file to write")
    for path in args.exclude:
        if not os.path.isfile(path):
            ap.error(f"--exclude {path}: no such file")
    from draftkit.files import write_jsonl_atomically

    try:
        exclude = frozenset().union(*(user_texts(p) for p in args.exclude))
    except (ValueError, KeyError, TypeError) as err:
        ap.error(f"--exclude: not a prompts file ({type(err).__name__}: {err})")
    rows = build(args.rows, args.seed, exclude=exclude, complete=args.complete)
    if len(rows) < args.rows:
        print(f"the generator's space ran out: {len(rows)} distinct conversations of the {args.rows} asked for",
              file=sys.stderr)
    write_jsonl_atomically(args.out, rows)
    kinds = {}
    for row in rows:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    print(f"wrote {len(rows)} conversations to {args.out}: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


if __name__ == "__main__":
    main()
