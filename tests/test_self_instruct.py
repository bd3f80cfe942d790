"""Requests the target writes itself (train/self_instruct.py): cleaning, what is kept (new, of a sane length, no
8-word run shared with an evaluation prompt), examples kept as written while the target writes the last turn,
resuming where a run stopped, and the rows spread among an existing prompts file."""
import json

import pytest

from draftkit.eval.chat_tasks import chat_rows
from draftkit.train import self_instruct as si
from draftkit.train.chat_prompts import GENERAL_KINDS


def test_the_request_is_cleaned_out_of_the_answer():
    assert si.cleaned('4. "Explain how tides work."') == "Explain how tides work."
    assert si.cleaned("Request number 4: Write a haiku about rain.\n\nI hope this helps!") == \
        "Write a haiku about rain."
    assert si.cleaned("Here is a new request:\nDescribe the Roman Forum.") == "Describe the Roman Forum."
    assert si.cleaned("Explain gravity.") == "Explain gravity."


def test_kept_requests_are_new_of_a_sane_length_and_never_an_evaluation_prompt():
    evaluation = chat_rows()[3]["turns"][0]
    banned = si.runs(evaluation)
    seen = {si.normalized("Explain how tides work to a child.")}
    assert si.keep("Describe how a bicycle gear works, step by step.", seen, banned)
    assert not si.keep("explain how  TIDES work to a child.", seen, banned)  # seen (case and spaces aside)
    assert not si.keep("Hello there.", seen, banned)  # too short
    assert not si.keep(" ".join(["word"] * (si.MAX_WORDS + 1)), seen, banned)
    assert not si.keep("Please answer this: " + evaluation, seen, banned)  # shares a run with the chat set


def test_every_kind_has_a_description_and_examples_are_kept_as_written():
    assert set(si.KINDS) == set(GENERAL_KINDS)
    convs = si.batch_conversations(seed=3, batch=5, size=8)
    assert convs == si.batch_conversations(seed=3, batch=5, size=8)  # a resumed run asks the same
    assert convs != si.batch_conversations(seed=3, batch=6, size=8)
    for kind, conv in convs:
        assert [m["role"] for m in conv] == ["user", "assistant"] * (si.EXAMPLES + 1)
        assert all(m.get("keep") for m in conv[1:-1:2]) and not conv[-1].get("keep") and conv[-1]["content"] == ""
        assert si.KINDS[kind] in conv[0]["content"]


def test_regeneration_keeps_marked_turns(monkeypatch):
    """regenerate_conversations writes only the turns not marked keep (the fake target answers "new")."""
    import torch

    from draftkit.train import target_rows

    class Tok:
        eos_token_id, padding_side = 0, "right"

        def apply_chat_template(self, conv, tokenize, add_generation_prompt):
            return " ".join(m["content"] for m in conv)

        def __call__(self, texts, **kw):
            ids = torch.ones(len(texts), 3, dtype=torch.long)
            return type("Enc", (dict,), {"to": lambda self, d: self})(input_ids=ids, attention_mask=ids)

        def decode(self, row, skip_special_tokens):
            return "new"

    class Target:
        device = "cpu"

        def generate(self, input_ids, max_new_tokens, **kw):
            return torch.cat([input_ids, torch.full((input_ids.shape[0], 2), 5)], 1)

    conv = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "example", "keep": True},
            {"role": "user", "content": "b"}, {"role": "assistant", "content": ""}]
    out, = target_rows.regenerate_conversations(Target(), Tok(), [conv], 64, 0.0, 0, 8)
    assert out[1]["content"] == "example" and out[3]["content"] == "new"


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """main() with a fake target whose answers are scripted per batch: new requests, a repeat, a short one and
    one copying an evaluation prompt; counts the batches it ran."""
    import argparse

    import draftkit as dk
    from draftkit.train import target_rows

    evaluation = chat_rows()[0]["turns"][0]
    ran = []

    def regenerate(writer, tok, convs, seq_len, temperature, seed, max_new_tokens):
        b = len(ran)
        ran.append(b)
        answers = [f"Describe item number {b}-{i} of the museum in three vivid sentences." for i in range(len(convs))]
        answers[1] = answers[0]  # a repeat
        answers[2] = "Hi."  # too short
        answers[3] = "1. " + evaluation  # an evaluation prompt
        return [c[:-1] + [{"role": "assistant", "content": a}] for c, a in zip(convs, answers)]

    tok = argparse.Namespace(chat_template="{{ messages }}")
    target = argparse.Namespace(dtype=None, device=None, to=lambda device: target)
    monkeypatch.setattr(dk, "load_target", lambda name: (target, tok))
    monkeypatch.setattr(target_rows, "regenerate_conversations", regenerate)
    monkeypatch.setattr(target_rows, "writer_dtype", lambda cfg, target: None)
    return ran, tmp_path


def test_requests_are_written_batch_by_batch_and_a_rerun_continues(scripted):
    ran, tmp = scripted
    out = tmp / "self.jsonl"
    si.main(["--out", str(out), "--rows", "10", "--batch_size", "6", "--max_batches", "1"])  # stops short
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and len(ran) == 1  # 6 asked: a repeat, a short one and an evaluation prompt dropped
    si.main(["--out", str(out), "--rows", "10", "--batch_size", "6"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    texts = [r["messages"][0]["content"] for r in rows]
    assert len(rows) == 10 and len(set(texts)) == 10 and len(ran) == 4  # batches 1-3, after batch 0's rows
    assert [r["batch"] for r in rows] == [0] * 3 + [1] * 3 + [2] * 3 + [3]
    assert all(r["kind"] in si.KINDS and r["source"] == "self-instruct" for r in rows)
    si.main(["--out", str(out), "--rows", "10"])  # nothing left to do: the target is not even asked
    assert len(ran) == 4


def test_the_rows_are_spread_among_an_existing_prompts_file(scripted):
    _, tmp = scripted
    base = tmp / "base.jsonl"
    base.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"base {i}"}], "kind": "code"})
                            + "\n" for i in range(20)))
    si.main(["--out", str(tmp / "self.jsonl"), "--rows", "5", "--batch_size", "6", "--mix_into", str(base)])
    mixed = [json.loads(line) for line in (tmp / "self.mixed.jsonl").read_text().splitlines()]
    assert len(mixed) == 25
    at = [i for i, r in enumerate(mixed) if r.get("source") == "self-instruct"]
    assert at == [2, 7, 12, 17, 22]  # evenly spread
    assert [r["messages"][0]["content"] for r in mixed if "source" not in r] == [f"base {i}" for i in range(20)]
    from draftkit.corpus import build_corpus

    corpus = build_corpus(str(tmp / "self.mixed.jsonl"), "messages")  # rows with and without the extra fields
    assert len(corpus.train) + len(corpus.heldout) == 25


def test_bad_flags_are_one_line_before_any_model_loads(capsys, tmp_path):
    for argv, says in ((["--rows", "0"], "--rows must be >= 1"), (["--temperature", "0"], "--temperature must be > 0"),
                       (["--exclude", str(tmp_path / "nope.jsonl")], "nope.jsonl: no such file")):
        with pytest.raises(SystemExit):
            si.parse_args(["--out", str(tmp_path / "o.jsonl"), *argv])
        assert says in capsys.readouterr().err


def test_quoting_material_is_cut_to_whole_sentences_and_sized_per_kind():
    from draftkit.train.quoting_prompts import material

    report = "Here is the report:\n" + " ".join(f"Sentence number {i} tells of the fair in Oakhurst." for i in range(6))
    text = material("summarization", report + " And then the")
    assert text.startswith("Sentence number 0") and text.endswith("Oakhurst.")  # label and the cut-off tail gone
    assert material("translation", "We ate bread in the park. Then it rained.") == "We ate bread in the park."
    assert material("summarization", "Too short a report.") is None
    assert material("extraction", "no sentence end at all") is None


def test_quoting_kinds_wrap_what_the_target_wrote_in_a_request(scripted, monkeypatch):
    """--kinds quoting: the target is asked for material, and the kept rows are requests quoting its answer."""
    from draftkit.train import quoting_prompts as qp
    from draftkit.train import target_rows

    asked = []

    def regenerate(writer, tok, convs, seq_len, temperature, seed, max_new_tokens):
        asked.extend(c[0]["content"] for c in convs)
        said = "Mia, 31, met Leo, 45, and Ada, 28, at the Oakhurst fair on 3 May. They ate {i} cakes together."
        return [c[:-1] + [{"role": "assistant", "content": said.format(i=i)}] for i, c in enumerate(convs)]

    monkeypatch.setattr(target_rows, "regenerate_conversations", regenerate)
    _, tmp = scripted
    out = tmp / "quoting.jsonl"
    si.main(["--out", str(out), "--rows", "12", "--batch_size", "12", "--kinds", "quoting"])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["kind"] for r in rows} <= set(qp.QUOTING_KINDS) and "extraction" in {r["kind"] for r in rows}
    assert all(a.startswith("Write ") and "Reply with" in a for a in asked)  # material asked for, not requests
    for r in rows:
        text = r["messages"][0]["content"]
        assert "Mia, 31, met Leo" in text  # the material is quoted (translation: its first sentence only)
        assert r["kind"] != "translation" or "cakes" not in text
    with pytest.raises(SystemExit):
        si.parse_args(["--out", str(out), "--kinds", "poetry"])  # an unknown kind: one line before any model loads
