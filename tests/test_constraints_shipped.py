"""Constraints end to end: compare.py's --grammar flag and json task, and every shipped drafter under a grammar on
the shipped target with its real tokenizer."""
import json
import re

import pytest
import torch

from draftkit.verify.decode import generate as _generate
from draftkit.verify.grammar import Grammar

xgr = pytest.importorskip("xgrammar")

# ---- compare.py: --grammar and the json task --------------------------------------------------------
BAD_GRAMMAR_FLAGS = [
    (["--grammar", "regex:(ab"], "--grammar: regex: Regex parsing error at position 4: The parenthesis is not closed."),
    (["--grammar", "schema.yaml"], "pass a .json schema file, a .ebnf grammar file or regex:PATTERN"),
    (["--grammar", "no/such.json"], "--grammar: 'no/such.json': cannot read it"),
    (["--grammar", "regex:[^\\x00-\\U0010FFFF]"], "no token of this vocabulary can start it"),
    (["--grammar", "regex:a+", "--tasks", "json"], "--grammar and --tasks json both set the grammar"),
]


@pytest.mark.parametrize("argv,message", BAD_GRAMMAR_FLAGS, ids=[" ".join(a) for a, _ in BAD_GRAMMAR_FLAGS])
def test_bad_grammar_flags_are_one_line_before_any_model(monkeypatch, capsys, tmp_path, argv, message):
    import draftkit as dk
    from draftkit.eval import compare

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(dk, "load_model", boom)
    monkeypatch.setattr(compare, "run", boom)
    assert compare.main(argv + ["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_bad_schema_file_names_the_file(monkeypatch, capsys, tmp_path):
    from draftkit.eval import compare

    path = tmp_path / "s.json"
    path.write_text('{"type": "object", "properties": {"a": {"if": {}}}}')
    monkeypatch.setattr(compare, "run", lambda *a: pytest.fail("the run started"))
    assert compare.main(["--grammar", str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"{path}: JSON schema: $.properties.a.if is not supported" in capsys.readouterr().err


def test_the_json_task_ships_a_schema_its_prompts_decode_under():
    from transformers import AutoTokenizer

    from draftkit.eval import cli
    from draftkit.eval.json_task import PROMPTS, json_grammar, json_prompts
    from draftkit.eval.tasks import TASKS

    tok = AutoTokenizer.from_pretrained("zoo/target")
    assert json_grammar().kind == "json_schema" and not json_grammar().any_whitespace and "json" in TASKS
    assert [p.ids for p in json_prompts(tok, 3)] == [tok(t)["input_ids"] for t in PROMPTS[:3]]
    args = cli.parse_args(["--tasks", "json"])
    args.task_names = ("json",)
    assert cli.task_grammars(args, tok, ("json", "code")) == {"json": json_grammar()}




# ---- the shipped models: every drafter, a real tokenizer ------------------------------------------------
ZOO_GRAMMARS = {
    "json": Grammar.json_schema({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                                  "id": {"type": "integer"}},
                                 "required": ["name", "id"], "additionalProperties": False}, any_whitespace=False),
    "regex": Grammar.regex(r"def [a-z_]{1,12}\((self|x|a, b)\):"),
    "ebnf": Grammar.ebnf('root ::= "[" num ("," " " num){0,5} "]"\nnum ::= [1-9] [0-9]{0,2}'),
}


@pytest.fixture(scope="module")
def zoo():
    import draftkit as dk

    return dk.load_target()


@pytest.mark.parametrize("kind, names", [
    ("json", ("eagle", "suffix")),
    pytest.param("json", None, marks=pytest.mark.slow),
    pytest.param("regex", None, marks=pytest.mark.slow),
    pytest.param("ebnf", None, marks=pytest.mark.slow),
])
def test_shipped_drafters_under_a_grammar_equal_plain_constrained_decoding(zoo, kind, names):
    """The shipped target and every shipped drafter (None: all of them):
    greedy output equals plain constrained decoding, which equals transformers' generate with xgrammar's own
    logits processor."""
    import draftkit as dk
    from xgrammar.contrib.hf import LogitsProcessor

    from draftkit.drafters.registry import REGISTRY
    from draftkit.verify.grammar import compile_grammar
    from draftkit.zoo import available

    target, tok = zoo
    grammar = ZOO_GRAMMARS[kind]
    prompt = tok("import json\n\nrow = json.loads('" if kind == "json" else "class A:\n    " if kind == "regex"
                 else "SIZES = ")["input_ids"]
    plain = _generate(target, prompt, max_new_tokens=40, grammar=grammar, tokenizer=tok)
    compiled = compile_grammar(grammar, tok, 8192, {0})
    ref = target.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=0,
                          logits_processor=[LogitsProcessor(compiled)])[0, len(prompt):].tolist()
    assert plain.tokens.tolist() == ref
    shipped = available()
    for name in names or [n for n in dk.DRAFTERS if REGISTRY[n].default_model in (None, *shipped)]:
        out = _generate(target, prompt, dk.make_drafter(name, target), max_new_tokens=40, grammar=grammar,
                        tokenizer=tok)
        assert out.tokens.tolist() == ref, (kind, name, tok.decode(out.tokens), tok.decode(ref))
    if plain.stats.grammar_complete:
        text = tok.decode(plain.tokens[:-1])
        assert json.loads(text) if kind == "json" else re.fullmatch(r"def [a-z_]{1,12}\((self|x|a, b)\):", text) \
            if kind == "regex" else re.fullmatch(r"\[[1-9][0-9]{0,2}(, [1-9][0-9]{0,2}){0,5}\]", text), text
