"""Grammars (JSON schema, regex, EBNF) for constrained decoding, on top of xgrammar.

A `Grammar` is the user's constraint, checked for syntax when it is made and compiled
once per (tokenizer, vocabulary size, stop tokens) into a token-level automaton (cached).
A `TreeMatcher` follows one sequence: its state is the committed tokens; for a draft
tree it gives, in one call, the bitmask of the tokens allowed after every slot's path
(xgrammar's `traverse_draft_tree`), without moving its own state.

Bitmasks are xgrammar's: (rows, ceil(V / 32)) int32, bit j of word w set when token
32 w + j is allowed. The tokens that end the sequence (the model's EOS) are the grammar's
stop tokens: once the grammar is complete they are what it allows.

xgrammar is an optional dependency (`pip install draftkit[grammar]`), imported on first use.
"""
from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass

import torch

from draftkit.verify.contract import first_line

#: JSON-schema keywords xgrammar accepts but does not enforce: refused rather than silently ignored
UNENFORCED_KEYWORDS = ("not", "if", "then", "else", "dependentSchemas", "unevaluatedItems")


class GrammarError(ValueError):
    """A grammar that cannot be used: bad syntax, an unsupported schema, or no token can satisfy it."""


def xgrammar():
    try:
        import xgrammar as xgr
    except ImportError:
        raise ImportError("grammars need the xgrammar package: pip install 'draftkit[grammar]'") from None
    return xgr


def _one_line(exc: BaseException) -> str:
    """xgrammar's C++ errors start with a time stamp and a source location: keep the message."""
    text = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", first_line(exc))
    return re.sub(r"^Check failed: \(.*?\) is false: ", "", text)


def _unenforced(schema, path: str = "$") -> str | None:
    """The first place where the schema uses a keyword xgrammar would ignore."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in UNENFORCED_KEYWORDS and path != "$.properties":
                return f"{path}.{key}"
            found = _unenforced(value, f"{path}.{key}")
            if found:
                return found
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found = _unenforced(value, f"{path}[{i}]")
            if found:
                return found
    return None


@dataclass(frozen=True)
class Grammar:
    """A constraint on the generated text. Build one with `Grammar.json_schema`, `.regex` or `.ebnf`.

    kind: "json_schema", "regex" or "ebnf"; source: the schema (JSON text), pattern or grammar text.
    any_whitespace (JSON schema only): allow any whitespace between JSON tokens (xgrammar's default);
    False fixes the layout to compact JSON, which leaves more tokens forced (jump-forward).
    """

    kind: str
    source: str
    any_whitespace: bool = True

    def __post_init__(self):
        if self.kind not in ("json_schema", "regex", "ebnf"):
            raise GrammarError(f"grammar kind must be 'json_schema', 'regex' or 'ebnf', got {self.kind!r}")
        if not isinstance(self.source, str) or not self.source.strip():
            raise GrammarError(f"the {self.kind} is empty")
        self.syntax()

    @staticmethod
    def json_schema(schema: dict | str, any_whitespace: bool = True) -> "Grammar":
        if isinstance(schema, str):
            try:
                parsed = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"JSON schema: invalid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
        else:
            parsed, schema = schema, json.dumps(schema)
        if not isinstance(parsed, dict):
            raise GrammarError(f"a JSON schema must be a JSON object, got {type(parsed).__name__}")
        where = _unenforced(parsed)
        if where:
            raise GrammarError(f"JSON schema: {where} is not supported (the grammar library would not enforce it)")
        return Grammar("json_schema", schema, any_whitespace)

    @staticmethod
    def regex(pattern: str) -> "Grammar":
        return Grammar("regex", pattern)

    @staticmethod
    def ebnf(text: str) -> "Grammar":
        """xgrammar's EBNF (GBNF-like); the start rule is `root`."""
        return Grammar("ebnf", text)

    @staticmethod
    def from_spec(spec: str) -> "Grammar":
        """`regex:PATTERN`, a `.json` schema file or a `.ebnf` grammar file (the CLI's --grammar)."""
        if spec.startswith("regex:"):
            return Grammar.regex(spec[len("regex:"):])
        kind = {".json": "json_schema", ".ebnf": "ebnf", ".gbnf": "ebnf"}.get(spec[spec.rfind("."):].lower())
        if kind is None:
            raise GrammarError(f"{spec!r}: pass a .json schema file, a .ebnf grammar file or regex:PATTERN")
        try:
            with open(spec, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as e:
            raise GrammarError(f"{spec!r}: cannot read it ({e.strerror})") from None
        try:
            return Grammar.json_schema(text) if kind == "json_schema" else Grammar.ebnf(text)
        except GrammarError as e:
            raise GrammarError(f"{spec}: {e}") from None

    def syntax(self):
        """The tokenizer-free xgrammar.Grammar; raises GrammarError on bad syntax."""
        xgr = xgrammar()
        try:
            if self.kind == "json_schema":
                return xgr.Grammar.from_json_schema(self.source, any_whitespace=self.any_whitespace)
            if self.kind == "regex":
                return xgr.Grammar.from_regex(self.source)
            return xgr.Grammar.from_ebnf(self.source)
        except (RuntimeError, ValueError) as e:
            raise GrammarError(f"{self.kind.replace('_', ' ')}: {_one_line(e)}") from None

    def describe(self) -> str:
        text = self.source if len(self.source) < 60 else self.source[:57] + "..."
        return f"{self.kind} {text!r}"


_INFOS: OrderedDict = OrderedDict()  # (id(tokenizer), V, stops) -> (tokenizer, xgr.TokenizerInfo, compiler)
_COMPILED: OrderedDict = OrderedDict()  # (grammar, id(tokenizer), V, stops) -> CompiledGrammar
_CACHE_SIZE = 32


def _remember(cache: OrderedDict, key, make):
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make()
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def tokenizer_info(tokenizer, vocab_size: int, stop_ids: tuple[int, ...]):
    """xgrammar's view of the vocabulary: from a transformers tokenizer, or an xgrammar.TokenizerInfo
    (rebuilt with `stop_ids` as its stop tokens)."""
    xgr = xgrammar()

    def make():
        if isinstance(tokenizer, xgr.TokenizerInfo):
            if len(tokenizer.decoded_vocab) > vocab_size:
                raise GrammarError(f"the tokenizer has {len(tokenizer.decoded_vocab)} tokens, more than the model's "
                                   f"output vocabulary of {vocab_size}")
            meta = json.loads(tokenizer.dump_metadata())
            meta["stop_token_ids"], meta["vocab_size"] = list(stop_ids), vocab_size
            info = xgr.TokenizerInfo.from_vocab_and_metadata(tokenizer.decoded_vocab, json.dumps(meta))
        else:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
        return tokenizer, info, xgr.GrammarCompiler(info, max_threads=1)

    return _remember(_INFOS, (id(tokenizer), vocab_size, stop_ids), make)[1:]


def compile_grammar(grammar: Grammar, tokenizer, vocab_size: int, stop_ids) -> object:
    """The grammar compiled against the tokenizer (cached). Raises GrammarError when no token can
    start it (the grammar cannot be satisfied with this vocabulary) or when it has no stop token."""
    stops = tuple(sorted(stop_ids))
    if not stops:
        raise GrammarError("a grammar needs a stop token to end on, and there is none: eos_token_id is empty, or it "
                           "is None and the model's generation_config names no EOS token")
    if tokenizer is None:
        raise GrammarError("a grammar needs the target's tokenizer (tokenizer=...) to compile against")
    info, compiler = tokenizer_info(tokenizer, vocab_size, stops)

    def make():
        try:
            if grammar.kind == "json_schema":
                compiled = compiler.compile_json_schema(grammar.source, any_whitespace=grammar.any_whitespace)
            elif grammar.kind == "regex":
                compiled = compiler.compile_regex(grammar.source)
            else:
                compiled = compiler.compile_grammar(grammar.source)
        except (RuntimeError, ValueError) as e:
            raise GrammarError(f"{grammar.kind.replace('_', ' ')}: {_one_line(e)}") from None
        matcher = xgrammar().GrammarMatcher(compiled)
        if not matcher.is_completed() and not allowed_tokens(matcher, vocab_size):
            raise GrammarError(f"{grammar.describe()}: no token of this vocabulary can start it")
        return compiled

    return _remember(_COMPILED, (grammar, id(tokenizer), vocab_size, stops), make)


def allowed_tokens(matcher, vocab_size: int, limit: int = 2) -> list[int]:
    """Up to `limit` tokens the matcher allows next (enough to tell none, one or several)."""
    mask = xgrammar().allocate_token_bitmask(1, vocab_size)
    matcher.fill_next_token_bitmask(mask)
    return bitmask_tokens(mask[0], vocab_size, limit)


def bitmask_tokens(row: torch.Tensor, vocab_size: int, limit: int) -> list[int]:
    """The first `limit` allowed token ids of one bitmask row. Bit j of int32 word w is token 32 w + j,
    which on a little-endian host is bit j % 8 of byte 4 w + j // 8: token 8 * byte + bit."""
    as_bytes = row.view(torch.uint8)
    where = torch.nonzero(as_bytes).flatten()[:limit].tolist()  # the first `limit` set bits lie in these bytes
    values = as_bytes[where].tolist()
    tokens = [8 * b + k for b, v in zip(where, values) for k in range(8) if v >> k & 1]
    return [t for t in tokens if t < vocab_size][:limit]


class TreeMatcher:
    """One sequence's grammar state: advanced by committed tokens, read at every slot of a draft tree."""

    def __init__(self, compiled, vocab_size: int):
        xgr = xgrammar()
        self.xgr, self.vocab_size = xgr, vocab_size
        self.matcher = xgr.GrammarMatcher(compiled)
        self.masks = xgr.allocate_token_bitmask(1, vocab_size)  # grown to the largest tree

    def slot_masks(self, tokens: list[int], children: list[list[int]]) -> torch.Tensor:
        """(n + 1, W) int32: row s = the tokens allowed after slot s's path (slot 0 = the root, slot i + 1 =
        node i). A node the grammar forbids has an all-zero row; nodes under it keep a stale row."""
        n = len(tokens)
        if self.masks.shape[0] < n + 1:
            self.masks = self.xgr.allocate_token_bitmask(2 * (n + 1), self.vocab_size)
        masks = self.masks[:n + 1]
        if n == 0:
            self.matcher.fill_next_token_bitmask(masks)
            return masks
        first = [kids[0] if kids else -1 for kids in children]  # per slot: its first child's slot
        sibling = [-1] * (n + 1)
        for kids in children:
            for a, b in zip(kids, kids[1:]):
                sibling[a] = b
        masks.fill_(-1)
        self.matcher.traverse_draft_tree(torch.tensor(first), torch.tensor(sibling), torch.tensor([0] + tokens),
                                         masks)
        return masks

    def advance(self, tokens: list[int]) -> None:
        for t in tokens:
            if not self.matcher.accept_token(t):
                raise RuntimeError(f"token {t} breaks the grammar: the logits processors and the grammar together "
                                   "left no token allowed at this position")

    def forced(self) -> int | None:
        """The one token the grammar allows next, or None (several, none, or the grammar ended)."""
        if self.matcher.is_terminated():
            return None
        only = allowed_tokens(self.matcher, self.vocab_size)
        return only[0] if len(only) == 1 else None

    @property
    def completed(self) -> bool:
        return self.matcher.is_completed()
