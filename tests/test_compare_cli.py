"""eval/compare.py as a newcomer meets it: one-line errors before any model loads, presets that
explicit flags override, prompts cut with a warning, failures that lose nothing."""
import json
import subprocess
import sys
import time

import pytest
import torch

from draftkit.eval import cli, compare
from draftkit.eval.cli_checks import PromptText
from draftkit.eval.footprint import footprint, param_count
from draftkit.eval.measure import Method
from draftkit.eval.tasks import fit_to_context, from_texts


@pytest.fixture
def no_models(monkeypatch):
    """Any model load, or reaching the run at all, fails the test: bad input must stop before."""
    import draftkit as dk
    from transformers import AutoModelForCausalLM

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(dk, "load_model", boom)
    monkeypatch.setattr(dk, "load_target", boom)
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(compare, "run", boom)


def usage_error(capsys, *argv) -> str:
    """Run main(argv); check exit code 2 and exactly one line on stderr, no traceback; return that line."""
    code = compare.main(list(argv))
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


BAD_FLAGS = [
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["--max-new-tokens", "-5"], "--max-new-tokens must be >= 1, got -5"),
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--max-depth", "0"], "--max-depth must be >= 1, got 0"),
    (["--max-depth", "abc"], "argument --max-depth: invalid int value: 'abc'"),
    (["--eagle-top-k", "0"], "--eagle-top-k must be >= 1, got 0"),
    (["--budget", "sometimes"], "argument --budget: invalid choice: 'sometimes'"),
    (["--tf32", "maybe"], "argument --tf32: invalid choice: 'maybe'"),
    (["--eagle3-compile-draft", "maybe"], "argument --eagle3-compile-draft: invalid on / off value: 'maybe'"),
    (["--batch-sizes", "4,x"], "--batch-sizes takes a comma list of integers, got '4,x'"),
    (["--tasks", "foo"], "--tasks: unknown 'foo'; choose from code, copy, prose"),
    (["--tasks", ""], "--tasks is empty"),
    (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["--prompts", "0"], "--prompts must be >= 1, got 0"),
    (["--prompt-len", "0"], "--prompt-len must be >= 1, got 0"),
    (["--target", "no/such/model"], "--target 'no/such/model' is neither an existing folder nor a hub id"),
    (["--target", "./no/such/folder"], "--target './no/such/folder' is neither an existing folder nor a hub id"),
    (["--target", ""], "--target is empty"),
    (["--draft", "a//b"], "--draft 'a//b' is neither an existing folder nor a hub id"),
    (["--quick", "--full"], "argument --full: not allowed with argument --quick"),
    (["--drafters", ""], "--drafters is empty; choose from"),
    (["--drafters", "standalone,foo"], "--drafters: unknown 'foo'"),
    (["--drafters", "eagle,eagle"], "--drafters: 'eagle' listed more than once"),
    (["--drafters", "lookahead", "--medusa", "zoo/medusa"],
     "--medusa is given but --drafters (lookahead) has no medusa"),
    (["--max-new-tokens", "2000"], "--max-new-tokens 2000 does not fit the target's context of 1024 positions"),
    (["--prompt-len", "1000", "--max-new-tokens", "100"],
     "--prompt-len 1000 + --max-new-tokens 100 exceed the target's context of 1024 positions"),
    (["--threads", "0"], "--threads must be a positive count or auto, got '0'"),
    (["--threads", "many"], "--threads must be a positive count or auto, got 'many'"),
    (["--unknown-flag"], "unrecognized arguments: --unknown-flag"),
    (["--prompts-file"], "argument --prompts-file: expected one argument"),
]


def test_compile_compiles_the_drafts_unless_a_method_says_off():
    """--compile turns each draft model's compiled forwards on (the hybrid's members too); a method's own
    --<method>-compile-draft off keeps it eager; without --compile nothing is compiled."""
    from draftkit.drafters.registry import REGISTRY, compiled_flag, settings_for
    from draftkit.eval.drafter_flags import drafter_settings

    args = cli.build_parser().parse_args(["--compile", "--eagle-compile-draft", "off"])
    assert drafter_settings(args, "eagle3")["compile_draft"] is True
    assert drafter_settings(args, "eagle")["compile_draft"] is False
    assert "compile_draft" not in drafter_settings(args, "suffix")
    assert compiled_flag("eagle3", settings_for("hybrid", **drafter_settings(args, "hybrid"))) == {"compile_draft": True}
    assert compiled_flag("suffix", settings_for("hybrid", compile_draft=True)) == {}
    plain = cli.build_parser().parse_args([])
    assert all("compile_draft" not in drafter_settings(plain, m) for m in REGISTRY)


@pytest.mark.parametrize("argv,message", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flag_is_one_line_and_exit_2_before_any_model(no_models, capsys, tmp_path, argv, message):
    line = usage_error(capsys, *argv, "--out", str(tmp_path / "out"))
    assert message in line
    assert not (tmp_path / "out").exists()  # nothing is created for a run that never starts


def _file(tmp_path, text: str) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text(text)
    return str(path)


BAD_FILES = [
    ("", "prompts.jsonl: holds no prompts (empty file)"),
    ("\n  \n", "prompts.jsonl: holds no prompts (empty file)"),
    ('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": oops}\n', "prompts.jsonl:3: invalid JSON (Expecting value"),
    ('{"prompt": ""}\n', 'prompts.jsonl:1: "prompt" is empty'),
    ('{"prompt": "a"}\n["a", "list"]\n',
     'prompts.jsonl:2: expected a JSON object such as {"prompt": "..."}, got a list'),
    ("42\n", "prompts.jsonl:1: expected a JSON object such as {\"prompt\": \"...\"}, got a number"),
    ('"just text"\n', "prompts.jsonl:1: expected a JSON object such as {\"prompt\": \"...\"}, got a string"),
    ('{"text": "a"}\n', 'prompts.jsonl:1: no "prompt" key (nor Spec-Bench "turns")'),
    ('{"prompt": 5}\n', 'prompts.jsonl:1: "prompt" must be a string, got a number'),
    ('{"turns": []}\n', 'prompts.jsonl:1: "turns" must be a non-empty list of strings'),
    ('{"turns": [""]}\n', 'prompts.jsonl:1: "turns"[0] is empty'),
]


@pytest.mark.parametrize("text,message", BAD_FILES, ids=[t[:24] or "empty" for t, _ in BAD_FILES])
def test_bad_prompts_file_names_file_and_line(no_models, capsys, tmp_path, text, message):
    line = usage_error(capsys, "--prompts-file", _file(tmp_path, text), "--out", str(tmp_path / "out"))
    assert message in line


def test_missing_prompts_file_and_folder(no_models, capsys, tmp_path):
    assert "no such file" in usage_error(capsys, "--prompts-file", str(tmp_path / "nope.jsonl"))
    assert "is a folder" in usage_error(capsys, "--prompts-file", str(tmp_path))


def test_target_folder_that_is_no_model(no_models, capsys, tmp_path):
    assert "holds no config.json" in usage_error(capsys, "--target", str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    line = usage_error(capsys, "--target", str(tmp_path), "--drafters", "lookahead")
    assert line.startswith(f"compare.py: error: --target '{tmp_path}': cannot read its config and tokenizer (")


def test_tasks_and_prompts_file_exclude_each_other(no_models, capsys, tmp_path):
    line = usage_error(capsys, "--prompts-file", _file(tmp_path, '{"prompt": "a"}\n'), "--tasks", "code")
    assert "--tasks applies to the built-in tasks; --prompts-file replaces them" in line


def test_cli_subprocess_fails_fast_without_traceback():
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "eval/compare.py", "--repeats", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["compare.py: error: --repeats must be >= 1, got 0"]
    assert time.perf_counter() - t0 < 20  # no torch, no model: an interpreter start


def test_debug_shows_the_traceback(no_models, capsys):
    assert compare.main(["--max-depth", "0", "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_explicit_flags_win_over_presets():
    quick = cli.parse_args(["--quick", "--max-new-tokens", "64", "--repeats", "3"])
    assert (quick.max_new_tokens, quick.repeats) == (64, 3)
    assert (quick.prompts, quick.tasks) == (cli.PRESETS["quick"]["prompts"], cli.PRESETS["quick"]["tasks"])
    assert quick.explicit == ["max_new_tokens", "repeats"]
    full = cli.parse_args(["--full", "--prompts", "1"])
    assert full.prompts == 1 and full.max_new_tokens == cli.PRESETS["full"]["max_new_tokens"]
    plain = cli.parse_args([])
    assert {k: getattr(plain, k) for k in cli.PRESETS["default"]} == cli.PRESETS["default"]


def test_help_shows_every_default():
    parser = cli.build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            assert "default" in formatter._get_help_string(action), action.option_strings


class CharTokenizer:
    def __call__(self, text):
        return {"input_ids": [ord(c) % 64 for c in text]}


def test_long_prompts_are_cut_from_the_left_and_reported(monkeypatch, tmp_path):
    texts = [PromptText("jsonl", "abcdefghijklmnopqrst", "f:1"), PromptText("jsonl", "xyz", "f:2")]
    tasks = from_texts(texts, CharTokenizer())
    assert fit_to_context(tasks, 8) == [12]
    assert tasks["jsonl"][0].ids == CharTokenizer()("mnopqrst")["input_ids"]  # the end is kept
    assert tasks["jsonl"][1].ids == CharTokenizer()("xyz")["input_ids"]

    path = _file(tmp_path, '{"prompt": "abcdefghijklmnopqrst"}\n{"prompt": "xyz"}\n')
    monkeypatch.setattr(cli, "target_info", lambda name: ("fake", 16, CharTokenizer()))
    monkeypatch.setattr(cli, "drafter_choices", lambda: ("lookahead",))
    args, _, _, tasks, notes = cli.prepare(["--prompts-file", path, "--max-new-tokens", "8",
                                            "--out", str(tmp_path / "out")])
    assert [len(p.ids) for p in tasks["jsonl"]] == [8, 3]
    assert notes == ["warning: 1 of 2 prompts are longer than the 8 tokens that fit (context 16 - --max-new-tokens "
                     "8): cut from the left by 12 tokens"]


def _fake_run(fail_on=None):
    def run(ids):
        if fail_on is not None and ids == fail_on:
            raise RuntimeError("injected failure\nsecond line")
        return list(ids[-4:]), None
    return run


def test_a_failure_loses_no_other_row_and_the_exit_code_says_so(monkeypatch, tmp_path, capsys):
    import draftkit as dk

    lines = ['{"prompt": "aaaa", "category": "one"}', '{"prompt": "bbbb", "category": "one"}',
             '{"prompt": "cccc", "category": "two"}']
    path = _file(tmp_path, "\n".join(lines) + "\n")
    bad_ids = CharTokenizer()("bbbb")["input_ids"]
    monkeypatch.setattr(cli, "target_info", lambda name: ("fake", 256, CharTokenizer()))
    monkeypatch.setattr(cli, "drafter_choices", lambda: ("good", "flaky"))
    monkeypatch.setattr(dk, "load_model", lambda path, **kw: torch.nn.Linear(2, 2))
    methods = [Method("plain", _fake_run()), Method("good", _fake_run()), Method("flaky", _fake_run(bad_ids))]
    monkeypatch.setattr(compare, "build_methods", lambda *a, **k: methods)
    out = tmp_path / "out"
    code = compare.main(["--prompts-file", path, "--drafters", "good,flaky", "--repeats", "2", "--out", str(out),
                         "--no-plots"])
    assert code == 1
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    measured = {(r["task"], r["drafter"]) for r in rows if not r.get("error")}
    assert measured == {(t, m) for t in ("one", "two") for m in ("plain", "good", "flaky")}
    errors = [r for r in rows if r.get("error")]
    assert len(errors) == 1  # the failed pair is not run again in the next repeat
    assert errors[0]["drafter"] == "flaky" and errors[0]["task"] == "one"
    assert errors[0]["error"] == "RuntimeError: injected failure" and errors[0]["prompt"].endswith(":2")
    flaky_one = next(r for r in rows if r["task"] == "one" and r["drafter"] == "flaky" and not r.get("error"))
    assert flaky_one["prompts"] == 1 and flaky_one["failed_prompts"] == 1
    report = json.loads((out / "compare.json").read_text())
    assert len(report["rows"]) == len(rows)
    assert "FAILED flaky" in capsys.readouterr().err


def test_footprint_counts_what_the_drafter_adds():
    target = torch.nn.Linear(8, 8)

    class Drafter:
        def __init__(self):
            self.own = torch.nn.Linear(8, 4, bias=False)  # 32 float32 parameters
            self.head = target  # shared with the target: counts nothing
            self.mask = torch.zeros(10, dtype=torch.bool)
            self.view = self.mask[:5]  # the same storage: counted once
            self.pool = {1: [2, 3]}
            self.depth = 4  # a setting, not a buffer

    d = Drafter()
    mem = footprint(d, target)
    assert mem["params"] == 32 * 4 and mem["kv"] == 0
    assert mem["buffers"] >= 10 and param_count(d, target) == 32


def test_a_named_drafter_without_a_draft_for_the_real_target_is_one_line(capsys, no_models):
    # `all` leaves out what is not shipped for the target; a drafter named on purpose is refused before any model
    # loads (it used to run every other row for minutes and then print a FAILED row)
    line = usage_error(capsys, "--target", "smollm2-135m", "--drafters", "suffix,medusa,peagle")
    assert line.startswith("compare.py: error: --drafters: medusa needs a medusa draft and none is shipped for "
                           "smollm2-135m (peagle too): recipes/smollm2/build.sh"), line
    assert line.endswith("then pass its folder with --medusa DIR"), line


def test_your_own_target_is_not_offered_the_shipped_targets_drafts(capsys, no_models, tmp_path):
    """On a target of another shape the shipped family's drafts cannot run: `all` leaves them out (it used to print
    a FAILED row for each) and one named on purpose is one line, before any model loads."""
    from transformers import AutoTokenizer, LlamaConfig

    from draftkit.models import resolve

    LlamaConfig(vocab_size=8192, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(resolve(None, "target")).save_pretrained(tmp_path)
    args = cli.parse_args(["--target", str(tmp_path)])
    cli.check_drafters(args, cli.drafter_choices())
    assert set(args.drafter_names) == {"lookahead", "suffix", "hybrid"}
    note = capsys.readouterr().err.strip()  # said in one line, not left out silently
    assert note.startswith("compare.py: all leaves out ") and "eagle3" in note and "\n" not in note, note
    line = usage_error(capsys, "--target", str(tmp_path), "--drafters", "suffix,eagle3")
    assert f"--drafters: eagle3 needs a draft made for {tmp_path}; the shipped drafts were made for the " \
           "shipped target" in line and line.endswith("--eagle3 DIR"), line
    shipped = cli.parse_args(["--target", resolve(None, "target")])  # the shipped target by its folder: all of them
    cli.check_drafters(shipped, cli.drafter_choices())
    assert {"eagle", "eagle3", "medusa", "standalone"} <= set(shipped.drafter_names)


def test_compile_gives_every_drafter_the_longest_prompt_before_anything_is_timed(monkeypatch):
    """A draft compiles its graphs for the buffer a prompt needs when it is given the prompt, and its buffer only
    grows: --compile hands each drafter the run's longest prompt after the verify buckets, so no timed run meets a
    buffer its draft has not compiled for."""
    import types

    import draftkit.verify.forward as fw

    monkeypatch.setattr(fw, "warm_compiled", lambda *a, **k: [1, 2])
    seen = []

    class Recorder:
        budget_cap, hidden_layers = types.SimpleNamespace(max_nodes=4), ()

        def reset(self, prompt):
            seen.append(prompt.tolist())

    def method(drafter):
        run = types.SimpleNamespace(drafter=drafter)
        return Method("m", run, footprint=lambda: {}, about="")
    prompt = lambda ids: types.SimpleNamespace(ids=ids)  # noqa: E731
    tasks = {"code": [prompt([1, 2, 3]), prompt([4, 5, 6, 7, 8])], "copy": [prompt([9])]}
    args = types.SimpleNamespace(max_new_tokens=8)
    lines = []
    target = types.SimpleNamespace(device=torch.device("cpu"))
    compare.compile_buckets(args, target, [method(None), method(Recorder()), method(Recorder())], tasks,
                            types.SimpleNamespace(write=lines.append))
    assert seen == [[4, 5, 6, 7, 8]] * 2
    assert any("the longest prompt" in line for line in lines)


def test_a_shipped_draft_that_does_not_fit_the_loaded_target_is_left_out_of_all(capsys, tmp_path):
    """`all` on a target whose shape could not be read before it loaded (a hub model not downloaded yet) meets the
    shipped drafts' mismatch only when it builds them: each is left out in one line, not a FAILED row; named on
    purpose it stays a FAILED row."""
    from draftkit.models import resolve
    from tests.models import tiny_model

    from transformers import AutoTokenizer

    target = tiny_model("llama", vocab=8192, hidden=64)
    tokenizer = AutoTokenizer.from_pretrained(resolve(None, "target"))
    args = cli.parse_args(["--target", str(tmp_path), "--no-peers"])
    args.drafter_names, args.grammars = ["eagle", "suffix"], None  # what prepare() sets (it would read the target)
    failed = []
    methods = compare.build_methods(args, target, tokenizer, on_error=lambda name, msg, tb: failed.append(name))
    assert [m.name for m in methods] == ["plain", "suffix"] and not failed
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("compare.py: left out eagle: "), err
    args.drafters = "eagle,suffix"
    methods = compare.build_methods(args, target, tokenizer, on_error=lambda name, msg, tb: failed.append(name))
    assert [m.name for m in methods] == ["plain", "suffix"] and failed == ["eagle"]


def test_batch_lanes_are_built_from_the_model_and_drafter_flags(monkeypatch):
    """--batch-sizes decodes with the drafts and settings the single-sequence rows use (the model flags' folders and
    the drafter flags), not each method's shipped draft with its defaults."""
    import draftkit as dk
    from draftkit.eval import bench_batch
    from types import SimpleNamespace

    args = cli.parse_args(["--drafters", "standalone,hybrid", "--draft", "zoo/draft", "--standalone-top-k", "2",
                           "--hybrid-members", "suffix,standalone", "--batch-sizes", "4,2"])
    cli.check_flags(args)
    cli.check_drafters(args, cli.drafter_choices())
    assert args.batch_size_list == [2, 4]
    calls, made = [], {}
    monkeypatch.setattr(dk, "lane_drafters", lambda name, target, n, path, tok, **flags:
                        calls.append((name, n, path, flags)) or [])
    monkeypatch.setattr(bench_batch, "run_batches", lambda *a: made.update(lanes=a[-1]) or [])
    compare.batch_rows(args, None, [SimpleNamespace(ids=[1, 2, 3])], SimpleNamespace(write=lambda s: None), [])
    made["lanes"]("standalone", 4)
    made["lanes"]("hybrid", 4)
    (name, n, path, flags), (_, _, paths, hybrid) = calls
    assert (name, n, path, flags["top_k"]) == ("standalone", 4, "zoo/draft", 2)
    assert paths["draft"] == "zoo/draft" and hybrid["members"] == "suffix,standalone"


def test_repeated_batch_sizes_are_refused(capsys, no_models):
    assert "--batch-sizes names a size twice" in usage_error(capsys, "--batch-sizes", "2,2")


def test_a_reused_results_folder_keeps_the_earlier_run_apart(tmp_path):
    """The earlier run's rows, report and plots move to previous-<time>/ (nothing lost, nothing mixed); other files
    stay; an empty folder moves nothing."""
    import os

    from draftkit.eval.report import RunWriter

    assert RunWriter(str(tmp_path)).moved is None
    for name, text in (("rows.jsonl", '{"a": 1}\n'), ("compare.json", "{}"), ("speedup.png", "x"), ("notes.md", "")):
        (tmp_path / name).write_text(text)
    writer = RunWriter(str(tmp_path))
    assert sorted(os.listdir(writer.moved)) == ["compare.json", "rows.jsonl", "speedup.png"]
    assert (tmp_path / "notes.md").exists() and (tmp_path / "rows.jsonl").read_text() == ""
    assert not (tmp_path / "speedup.png").exists()


@pytest.mark.parametrize("kind", ["mamba", "bloom", "no weights"])
def test_targets_draftkit_cannot_decode_are_refused_from_their_config(kind, tmp_path, capsys, no_models):
    """A recurrent-state model, an ALiBi model or a folder without weights: one line from the config and the folder,
    before any weights load (not a FAILED row per method after the load)."""
    from transformers import AutoTokenizer, BloomConfig, LlamaConfig, MambaConfig

    from draftkit.models import resolve

    config = {"mamba": MambaConfig(num_hidden_layers=2), "bloom": BloomConfig(n_layer=2),
              "no weights": LlamaConfig(num_hidden_layers=2)}[kind]
    config.save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(resolve(None, "target")).save_pretrained(tmp_path)
    if kind != "no weights":
        (tmp_path / "model.safetensors").write_bytes(b"")
    says = {"mamba": "keeps recurrent state", "bloom": "ALiBi", "no weights": "holds no weights"}[kind]
    assert says in usage_error(capsys, "--target", str(tmp_path), "--drafters", "suffix")


def test_chat_on_a_target_without_a_chat_template_names_the_flag(capsys, no_models):
    line = usage_error(capsys, "--chat", "--tasks", "code", "--drafters", "suffix")
    assert line.startswith("compare.py: error: --chat: the target's tokenizer has no chat template"), line
