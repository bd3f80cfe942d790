"""verify/head.py: the LM head's transposed layout computes the same logits, only where it was measured faster,
never for one row, and decoding through it stays lossless."""
import pytest
import torch
import torch.nn.functional as F

import draftkit as dk
from draftkit.verify import head as vhead
from tests.models import tiny_model


@pytest.fixture
def always_transposed(monkeypatch, tmp_path):
    """Every bucket measured faster transposed (whatever this machine's BLAS says), nothing saved outside tmp."""
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(vhead, "_measure", lambda head: list(vhead.ROW_BUCKETS))


@pytest.mark.parametrize("bias", [False, True])
def test_the_transposed_layout_is_the_same_product(bias):
    torch.manual_seed(0)
    head = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(3, 5, 24)
    out = vhead._transposed(head, x)
    assert out.shape == (3, 5, 40) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, head.weight, head.bias))


def test_inside_the_context_only_several_rows_take_it(always_transposed, monkeypatch):
    model = tiny_model("llama", vocab=64, hidden=32)
    head = model.get_output_embeddings()
    calls = []
    real = vhead._transposed
    monkeypatch.setattr(vhead, "_transposed", lambda h, x: calls.append(x.shape) or real(h, x))
    with vhead.rows_first_head(model):
        with vhead.rows_first_head(model):  # nested: the outer layout stays
            pass
        one = head(torch.randn(1, 1, 32))
        several = head(torch.randn(1, 3, 32))
    assert calls == [torch.Size([1, 3, 32])] and one.shape == (1, 1, 64) and several.shape == (1, 3, 64)
    assert "forward" not in head.__dict__  # the model's own head again after the context


def test_a_measured_table_is_saved_and_read_back(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(vhead, "_measure", lambda head: measured.append(1) or [4, 8])
    head = torch.nn.Linear(16, 48)
    assert vhead.transposed_buckets(head) == [4, 8]
    again = torch.nn.Linear(16, 48)  # another head of the same shape: the saved table, not a new measurement
    assert vhead.transposed_buckets(again) == [4, 8] and measured == [1]


def test_heads_it_cannot_serve_are_left_alone():
    model = tiny_model("llama", vocab=64, hidden=32)
    model.lm_head = torch.nn.Sequential(torch.nn.Linear(32, 64, bias=False))
    assert vhead._head(model) is None
    with vhead.rows_first_head(model):  # nothing measured, nothing swapped
        assert "forward" not in model.lm_head.__dict__


@pytest.mark.parametrize("kind", ["suffix", "lookahead"])
def test_decoding_through_the_transposed_head_is_lossless(always_transposed, kind):
    model = tiny_model("llama", vocab=64, hidden=32, layers=2, seed=3)
    prompt = torch.randint(1, 64, (40,), generator=torch.Generator().manual_seed(1))
    prompt[20:30] = prompt[:10]
    plain = dk.generate(model, prompt, max_new_tokens=48, eos_token_id=[]).tokens.tolist()
    out = dk.generate(model, prompt, drafter=dk.make_drafter(kind, model), max_new_tokens=48, eos_token_id=[],
                      budget="fixed")
    assert out.tokens.tolist() == plain
    assert sum(s.accepted for s in out.stats.steps) > 0  # trees of several rows were verified through it
