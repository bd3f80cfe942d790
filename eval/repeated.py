"""The repeated-requests task: what a drafter's global cache (suffix) is for.

Agentic loops, code-editing tools and RL rollouts send a stream of requests built from one
template: the same instruction over different inputs. Each request's output then resembles
the outputs of the requests before it, which the request's own prompt does not hold, so a
per-request n-gram cache cannot predict it and an index over earlier requests can.

Request i here is: a window of held-out file i (a different file each time, as the "input"),
then one fixed editing instruction (a comment) and one fixed held-out code fragment (the
function to rewrite), cut mid-function so that the model continues it. The text right before
the continuation is the same in every request, so greedy outputs partly repeat (the file
before it still steers them: on the shipped target, the suffix drafter's tau per request runs
from about 2 to 7 with the global cache, about 1.6 to 3.3 without).

How it is meant to be run: the requests in order, one drafter object for all of them, so
that its global cache carries what request i generated into requests i + 1, ... (a fresh
drafter, or `drafter.forget()`, to run the sequence again):

    prompts = build_repeated(tok, n=8, length=192, seed=0)
    drafter = SuffixDrafter()                       # use_global=False: what it reaches without
    for ids in prompts:
        out = generate(target, ids, drafter, max_new_tokens=128, eos_token_id=[])

The first request has nothing to draw on; report figures over all requests (that is the
honest average for a stream of n requests) or over requests 2..n.
"""
from __future__ import annotations

import random
import re

from draftkit.eval.tasks import held_out_texts

INSTRUCTION = ("\n\n# Edit request: the helper below is shared by every module in this package.\n"
               "# Rewrite it for the module above, keeping its behaviour and its docstring.\n")


def _fragment(texts: list[tuple[str, str]], tokenizer, rng: random.Random, size: int) -> list[int]:
    """`size` tokens of a held-out function from its `def` on (indented code after the header)."""
    starts = [(src, text, m.start()) for src, text in texts
              for m in re.finditer(r"^def \w+\(.*\):\n", text, flags=re.M)]
    rng.shuffle(starts)
    for _, text, at in starts:
        ids = tokenizer(text[at:at + 40 * size])["input_ids"]
        if len(ids) >= size + 32:  # the function goes on past the cut
            return ids[:size]
    raise ValueError("no held-out function long enough for the repeated-requests fragment")


def build_repeated(tokenizer, n: int = 8, length: int = 192, seed: int = 0) -> list[list[int]]:
    """n prompts of `length` tokens (token id lists), in the order they are to be sent.

    Each: a window of length - tail tokens of a held-out file (a different file per
    request while there are enough), then INSTRUCTION and one held-out function fragment
    (tail = instruction + fragment, about a third of the prompt), the same in every request.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if length < 48:
        raise ValueError(f"length must be >= 48 tokens, got {length}")
    code, _ = held_out_texts()
    rng = random.Random(seed)
    instruction = tokenizer(INSTRUCTION)["input_ids"]
    fragment = _fragment(code, tokenizer, rng, max(8, length // 3 - len(instruction)))
    tail = instruction + fragment
    body = length - len(tail)
    if body < 8:
        raise ValueError(f"length {length} leaves no room for the file window before the "
                         f"{len(tail)}-token instruction")
    files = [(src, tokenizer(text)["input_ids"]) for src, text in code]
    files = [(src, ids) for src, ids in files if len(ids) > body]
    if not files:
        raise ValueError(f"no held-out file has more than {body} tokens")
    rng.shuffle(files)
    prompts = []
    for i in range(n):
        _, ids = files[i % len(files)]
        start = rng.randrange(0, len(ids) - body + 1)
        prompts.append(ids[start:start + body] + tail)
    return prompts
