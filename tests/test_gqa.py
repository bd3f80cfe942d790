"""verify/gqa.py: a masked verify forward on the CPU attends over the shared key/value heads (no per-query-head
copies), gives the same logits to the last bit, and leaves transformers' switch as it found it."""
import os

import pytest
import torch
from transformers.integrations import sdpa_attention

from draftkit.verify import gqa
from draftkit.verify.contract import DraftTree
from draftkit.verify.forward import Verifier
from tests.models import tiny_model, windowed_model

GROUPS_ON_CPU = gqa.groups_on_cpu
TREE = ([5, 6, 7, 8, 9], [-1, -1, 0, 0, 1])  # branched: the forward needs the hand-built 4D mask


def _verify(model, grouped: bool, monkeypatch, context: int = 40):
    """(logits, hidden states, key/value copies) of one tree forward on top of `context` committed tokens."""
    monkeypatch.setattr(gqa, "groups_on_cpu", GROUPS_ON_CPU if grouped else (lambda m: False))
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda h, n: copies.append(n) or real(h, n))
    ver = Verifier(model, capacity=context + 16)
    ids = torch.arange(context) % 50 + 1
    ver.forward(ids, DraftTree.empty().validate())
    ver.commit(context, [])
    tree = DraftTree.from_lists(*TREE).validate()
    ver.forward(ids[-1:], tree)  # the first hand-built mask probes the model's tree attention (forwards of its own)
    ver.kv.drop_pending()
    copies.clear()
    logits, states = ver.forward(ids[-1:], tree, (1, -1))
    return logits, states, len(copies)


@pytest.mark.parametrize("make", [lambda: tiny_model("llama"), lambda: windowed_model("mistral", window=8)],
                         ids=["llama", "mistral-past-its-window"])
def test_a_masked_forward_groups_the_heads_and_gives_the_same_numbers(make, monkeypatch):
    model = make()
    assert model.config._attn_implementation == "sdpa" and model.config.num_key_value_heads < \
        model.config.num_attention_heads
    copied_logits, copied_states, copies = _verify(model, False, monkeypatch)
    grouped_logits, grouped_states, none = _verify(model, True, monkeypatch)
    assert copies == 2 * model.config.num_hidden_layers and none == 0  # keys and values, every layer
    assert torch.equal(grouped_logits, copied_logits)
    assert all(torch.equal(a, b) for a, b in zip(grouped_states, copied_states))


def test_the_switch_is_put_back(monkeypatch):
    model = tiny_model("llama")
    monkeypatch.delenv(gqa.FLAG, raising=False)
    with gqa.grouped_attention(model):
        assert os.environ[gqa.FLAG] == "1"
    assert gqa.FLAG not in os.environ
    monkeypatch.setenv(gqa.FLAG, "0")  # a user's own setting survives a forward that raised
    with pytest.raises(RuntimeError, match="inside"):
        with gqa.grouped_attention(model):
            assert os.environ[gqa.FLAG] == "1"
            raise RuntimeError("inside")
    assert os.environ[gqa.FLAG] == "0"


def test_only_a_model_on_the_cpu_is_grouped(monkeypatch):
    monkeypatch.delenv(gqa.FLAG, raising=False)
    model = tiny_model("llama").to("meta")  # off the CPU: a GPU's masked grouped call would run the math kernel
    with gqa.grouped_attention(model):
        assert gqa.FLAG not in os.environ
    assert not gqa.groups_on_cpu(model) and gqa.groups_on_cpu(tiny_model("llama"))


def test_a_draft_forward_groups_the_heads_too(monkeypatch):
    """A draft model's forward (verify/tree.py run_model, the one draft path): an EAGLE draft whose layer has the
    target's grouped heads copies no key/value head under its tree mask."""
    import draftkit as dk
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter

    target = tiny_model("llama")
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda h, n: copies.append(n) or real(h, n))
    drafter = EagleDrafter(target, EagleDraftModel.from_target(target, init_from_target=True), max_depth=3, top_k=2)
    out = dk.generate(target, torch.arange(1, 30) % 60, drafter, 12, eos_token_id=[])
    assert out.stats.new_tokens == 12 and not copies
