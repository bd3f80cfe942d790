"""The drafters' one data path (train/targetdata.py): rows, conversations, regeneration, stored target outputs."""
import json
import os

import pytest
import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.train.data import train_tokenizer
from draftkit.train.target_rows import render_conversation
from draftkit.train.targetdata import TargetDataConfig, target_data, target_outputs

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "def add(a, b):"}, {"role": "assistant", "content": "return a + b"},
     {"role": "user", "content": "and sub?"}, {"role": "assistant", "content": "return a - b"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "import os"},
     {"role": "assistant", "content": "os.path.join(a, b)"}],
] * 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tokenizer with a chat template, a tiny target, a text corpus and a conversations file."""
    import inspect
    import textwrap

    root = tmp_path_factory.mktemp("targetdata")
    text = inspect.getsource(textwrap)
    (root / "corpus.txt").write_text(text)
    tok = train_tokenizer(text.splitlines() + [json.dumps(c) for c in CONVERSATIONS], vocab_size=400)
    tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=3,
                                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                         max_position_embeddings=256, eos_token_id=tok.eos_token_id)).eval()
    with open(root / "chats.jsonl", "w") as fh:
        for c in CONVERSATIONS:
            fh.write(json.dumps({"messages": c}) + "\n")
    return root, tok, model


def config(root, **kw):
    base = dict(corpus=str(root / "corpus.txt"), cache_dir=str(root / "cache"), output_dir=str(root / "out"),
                seq_len=48, batch_size=4, train_rows=8, shard_rows=4, regen_prompt_len=16)
    return TargetDataConfig(**{**base, **kw})


def test_conversation_mask_marks_exactly_the_assistant_tokens(tiny):
    _, tok, _ = tiny
    conv = CONVERSATIONS[0]
    ids, assistant = render_conversation(tok, conv, 256)
    # the assistant tokens, decoded in order, are the assistant turns (and nothing of the user's)
    said = tok.decode([t for t, a in zip(ids, assistant) if a])
    assert said == "return a + b<|end|>return a - b<|end|>"
    assert tok.decode(ids) == tok.apply_chat_template(conv, tokenize=False)


def test_conversation_rows_train_on_assistant_tokens_only(tiny):
    root, tok, model = tiny
    cfg = config(root, corpus=str(root / "chats.jsonl"), messages_column="messages", data_mode="online", seq_len=128,
                 cache_dir="")
    data = target_data(cfg, model, tok, Accelerator(cpu=True))
    replies = {"".join(m["content"] + "<|end|>" for m in c if m["role"] == "assistant") for c in CONVERSATIONS}
    for row, mask in zip(data.rows.tolist(), data.mask.tolist()):
        # mask[t] says token t + 1 is trained on: the trained tokens are one conversation's assistant turns
        assert tok.decode([row[t + 1] for t in range(len(row) - 1) if mask[t]]) in replies
        assert not mask[-1]


def test_a_batch_drops_the_padding_past_its_last_trained_token(tiny):
    """Rows of conversations are right-padded to seq_len; a batch keeps the columns through the token after its
    last trained position (and `beyond` more), and the target's outputs there equal the full row's."""
    root, tok, model = tiny
    cfg = config(root, corpus=str(root / "chats.jsonl"), messages_column="messages", data_mode="online", seq_len=128,
                 cache_dir="")
    data = target_data(cfg, model, tok, Accelerator(cpu=True))
    idx = data.indices(0)
    last = max(int(m.nonzero().max()) for m in data.mask[idx])
    b = data.batch(0)
    assert b.ids.shape[1] == last + 2 < 128 and b.loss_mask.sum() == data.mask[idx].sum()
    assert data.batch(0, beyond=5).ids.shape[1] == last + 7 and data.batch(0, beyond=500).ids.shape[1] == 128
    full = target_outputs(model, data.rows[idx].long(), [-1])[-1][:, :last + 2]
    torch.testing.assert_close(b.last, full, atol=1e-5, rtol=1e-5)


def test_regenerated_rows_are_cached_and_reused(tiny, monkeypatch):
    root, tok, model = tiny
    cfg = config(root, regenerate=True, data_mode="online")
    first = target_data(cfg, model, tok, Accelerator(cpu=True))
    # the continuation is the target's own: greedy shard 0 equals greedy decoding of its prompt
    prompt = first.rows[0, :cfg.regen_prompt_len].long()[None]
    with torch.no_grad():
        greedy = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                max_new_tokens=cfg.seq_len - cfg.regen_prompt_len, pad_token_id=tok.eos_token_id)
    n = greedy.shape[1]
    assert first.rows[0, :n].tolist() == greedy[0].tolist()
    assert not first.mask[:, :cfg.regen_prompt_len - 1].any() and first.mask[:, cfg.regen_prompt_len - 1].all()

    def no_generation(*a, **k):
        raise AssertionError("regenerated rows should come from the cache")

    monkeypatch.setattr(type(model), "generate", no_generation)
    again = target_data(cfg, model, tok, Accelerator(cpu=True))
    assert torch.equal(first.rows, again.rows) and torch.equal(first.mask, again.mask)
    fewer = target_data(config(root, regenerate=True, data_mode="online", train_rows=4), model, tok,
                        Accelerator(cpu=True))  # fewer rows: the same first shard, nothing generated
    assert torch.equal(fewer.rows, first.rows[:4])


def test_cached_features_equal_a_fresh_forward_and_resume_mid_cache(tiny, monkeypatch):
    root, tok, model = tiny
    cfg = config(root, cache_dir=str(root / "cache2"), data_mode="cached")
    calls = []
    real = target_outputs

    def crash_on_second_shard(target, ids, layers, chunk=16):
        calls.append(ids.shape[0])
        if len(calls) == 2:
            raise KeyboardInterrupt("killed while storing features")
        return real(target, ids, layers, chunk)

    import draftkit.train.targetdata as td

    monkeypatch.setattr(td, "target_outputs", crash_on_second_shard)
    with pytest.raises(KeyboardInterrupt):
        target_data(cfg, model, tok, Accelerator(cpu=True), layers=[1])
    monkeypatch.setattr(td, "target_outputs", lambda *a, **k: (calls.append(a[1].shape[0]), real(*a, **k))[1])
    calls.clear()
    data = target_data(cfg, model, tok, Accelerator(cpu=True), layers=[1])
    assert calls == [cfg.shard_rows]  # only the missing shard was computed again
    b = data.batch(3)
    fresh = real(model, b.ids, [1, 3])
    assert set(b.hidden) == {1, 3}
    for layer in (1, 3):  # fp16 storage: equal within fp16 rounding
        torch.testing.assert_close(b.hidden[layer], fresh[layer], atol=2e-3, rtol=2e-3)
    with torch.no_grad():  # p's stored top-1: the argmax of the LM head over the final hidden state
        agree = (b.top == model.get_output_embeddings()(fresh[3]).argmax(-1)).float().mean()
    assert agree > 0.98
    assert b.last is b.hidden[3]
    feats = [d for d in os.listdir(root / "cache2") if d.startswith("feats-")]
    assert len(feats) == 1 and sorted(os.listdir(root / "cache2" / feats[0])) == ["L1", "L3", "top"]


def test_several_corpora_join_each_stored_on_its_own(tiny, monkeypatch):
    """corpus "a,b:N": a's rows then N of b's, each corpus's rows and target outputs the ones a run on it alone
    stores (so a corpus added later reuses what the others stored), held-out rows taken in turn from each."""
    import draftkit.train.targetdata as td

    root, tok, model = tiny
    half = CONVERSATIONS[:12]  # a second conversations file: the other corpus
    with open(root / "half.jsonl", "w") as fh:
        for c in reversed(half):
            fh.write(json.dumps({"messages": c}) + "\n")
    chats, other = str(root / "chats.jsonl"), str(root / "half.jsonl")
    kw = dict(messages_column="messages", seq_len=128, cache_dir=str(root / "cache3"), data_mode="cached",
              heldout_rows=2)
    alone = target_data(config(root, corpus=chats, **kw), model, tok, Accelerator(cpu=True), layers=[1])
    calls = []
    real = td.target_outputs
    monkeypatch.setattr(td, "target_outputs", lambda *a, **k: (calls.append(a[1].shape[0]), real(*a, **k))[1])
    both = target_data(config(root, corpus=f"{chats},{other}:4", **kw), model, tok, Accelerator(cpu=True),
                       layers=[1])
    assert calls == [4]  # the first corpus's outputs were read back; only the new corpus's one shard computed
    assert both.rows.shape[0] == alone.rows.shape[0] + 4
    assert torch.equal(both.rows[:8], alone.rows) and torch.equal(both.mask[:8], alone.mask)
    other_alone = target_data(config(root, corpus=other, train_rows=4, **kw), model, tok, Accelerator(cpu=True),
                              layers=[1])
    assert torch.equal(both.rows[8:], other_alone.rows)
    for layer in (1, 3):
        assert torch.equal(both.features[layer], torch.cat([alone.features[layer], other_alone.features[layer]]))
    assert torch.equal(both.top, torch.cat([alone.top, other_alone.top]))
    ids, _ = both.heldout_rows  # a0, b0, a1, b1
    assert torch.equal(ids[0::2], alone.heldout_rows[0]) and torch.equal(ids[1::2], other_alone.heldout_rows[0])
    assert both.corpus.source == f"{chats},{other}:4" and both.corpus.fingerprint != alone.corpus.fingerprint


def test_a_bad_corpus_among_several_is_named_before_anything_loads(tiny):
    from draftkit.train.config import TrainError
    from draftkit.train.targetdata import corpus_parts

    root, _, _ = tiny
    assert corpus_parts("a.jsonl, b.jsonl:960", 64) == [("a.jsonl", 64), ("b.jsonl", 960)]
    assert corpus_parts("org/name", 8) == [("org/name", 8)]
    with pytest.raises(TrainError, match="missing.jsonl: no such file"):
        config(root, corpus=f"{root / 'chats.jsonl'},{root / 'missing.jsonl'}")
    with pytest.raises(TrainError, match="ROWS >= 1"):
        config(root, corpus=f"{root / 'chats.jsonl'}:0")
    with pytest.raises(TrainError, match="named twice"):
        config(root, corpus=f"{root / 'chats.jsonl'},{root / 'chats.jsonl'}:4")


def test_epochs_visit_every_row_once_in_a_seeded_order(tiny):
    root, tok, model = tiny
    data = target_data(config(root, data_mode="online", cache_dir=""), model, tok, Accelerator(cpu=True))
    n = data.rows.shape[0]
    seen = torch.cat([data.indices(s) for s in range(n // 4)])
    assert sorted(seen.tolist()) == list(range(n))
    assert torch.equal(data.indices(5), data.indices(5)) and not torch.equal(
        torch.cat([data.indices(s) for s in range(2)]), torch.cat([data.indices(s) for s in range(2, 4)]))


def test_bad_settings_are_one_line_errors(tiny):
    from draftkit.train.config import TrainError

    root, _, _ = tiny
    with pytest.raises(TrainError, match="data_mode"):
        config(root, data_mode="disk")
    with pytest.raises(TrainError, match="regen_prompt_len"):
        config(root, regenerate=True, regen_prompt_len=48)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_distillation_reads_logits_at_the_trained_positions_only(softcap):
    """train/draft.py's loss: the draft's head runs on the trained positions alone, and gives there exactly the
    logits of a full forward (a soft-capped model computes them all, then picks); the KL and CE equal the loss over
    every position weighted by the mask."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from draftkit.train.draft import distill_loss, logits_at, next_tokens

    torch.manual_seed(0)
    if softcap:
        model = Gemma2ForCausalLM(Gemma2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                               final_logit_softcapping=softcap)).eval()
    else:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2)).eval()
    ids, rows = torch.randint(0, 97, (3, 11)), torch.rand(3, 11) > 0.4
    rows[0, -1] = True  # a row's last position: no next token for the CE
    full = model(input_ids=ids).logits
    picked = logits_at(model, ids, rows)
    assert torch.allclose(picked, full[rows], atol=1e-5)
    p = torch.randn(3, 11, 97)
    loss, kl = distill_loss(picked, p[rows], next_tokens(ids, rows), ce_weight=0.5)
    w = rows.float()
    logq, logp = full.log_softmax(-1), p.log_softmax(-1)
    want_kl = ((logp.exp() * (logp - logq)).sum(-1) * w).sum() / w.sum()
    ce = torch.nn.functional.cross_entropy(full[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    want_ce = (ce * w[:, :-1].flatten()).sum() / w[:, :-1].sum()
    assert torch.allclose(kl, want_kl, atol=1e-5) and torch.allclose(loss, want_kl + 0.5 * want_ce, atol=1e-5)


def test_answers_written_in_another_precision_by_a_copy(tiny, monkeypatch):
    """regen_dtype: a bf16 copy of the target writes the answers (equal to what the target cast to bf16 writes),
    the target itself stays fp32, the shards are stored apart from the target's own answers, and the held-out
    answers stay the target's own."""
    import copy

    from draftkit.train.target_rows import regenerate_conversations

    root, tok, model = tiny
    convs_cfg = dict(corpus=str(root / "chats.jsonl"), messages_column="messages", regenerate=True,
                     data_mode="online", seq_len=96, regen_max_new_tokens=12, regen_temperatures=[0.0],
                     heldout_rows=2, cache_dir=str(root / "cache_dtype"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    own = target_data(config(root, **convs_cfg), model, tok, Accelerator(cpu=True))
    bf16 = target_data(config(root, **convs_cfg, regen_dtype="bfloat16"), model, tok, Accelerator(cpu=True))
    assert model.dtype == torch.float32 and all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    cast = copy.deepcopy(model).to(torch.bfloat16)
    convs = list(bf16.corpus.train["text"])[:4]  # shard 0's conversations
    written = regenerate_conversations(cast, tok, convs, 96, 0.0, 0, 12)
    from draftkit.train.target_rows import conversation_rows

    ids, _ = conversation_rows(tok, written, 96)
    assert torch.equal(bf16.rows[:4], ids)
    stores = [d for d in os.listdir(root / "cache_dtype") if d.startswith("rows-")]
    assert len(stores) == 2  # apart: the bf16 answers did not reuse the fp32 ones' shards
    assert torch.equal(own.heldout_rows[0], bf16.heldout_rows[0])  # held out: the target's own greedy answers
    with pytest.raises(Exception, match="regen_dtype must be empty or one of"):
        config(root, **convs_cfg, regen_dtype="bf16")


def test_auto_precision_writes_in_bf16_only_where_bf16_runs_natively(tiny, monkeypatch):
    import draftkit.train.target_rows as rows

    root, _, model = tiny
    cfg = config(root, regenerate=True, regen_dtype="auto")
    for native, expected in ((True, torch.bfloat16), (False, None)):
        monkeypatch.setattr(rows, "native_bf16", lambda device, native=native: native)
        assert rows.writer_dtype(cfg, model) == expected
    monkeypatch.setattr(rows, "native_bf16", lambda device: True)
    import copy

    assert rows.writer_dtype(cfg, copy.deepcopy(model).to(torch.bfloat16)) is None  # already bf16: the target writes
    assert rows.writer_dtype(config(root, regenerate=True, regen_dtype="float32"), model) is None
