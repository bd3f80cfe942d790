"""verify/linear_layout.py: the rows-first layout computes the same products, only at the row counts measured faster,
for plain CPU Linears of groups large enough to matter, and decoding through it (plain decoding too) stays lossless."""
import copy

import pytest
import torch
import torch.nn.functional as F

import draftkit as dk
from draftkit.verify import linear_layout as layout
from tests.models import tiny_model
from tests.test_attention_layout import drafted_tokens


@pytest.fixture
def rows_first_everywhere(monkeypatch, tmp_path):
    """Every bucket of every group measured faster rows-first (whatever this machine's BLAS says), the tiny models'
    groups counted, nothing saved outside tmp."""
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(layout, "MIN_GROUP_BYTES", 0)
    monkeypatch.setattr(layout, "_measure", lambda linears: list(layout.ROW_BUCKETS))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (3, 5, 24), (7, 24)])
def test_the_rows_first_layout_is_the_same_product(bias, shape):
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(*shape)
    out = layout.rows_first_product(linear.weight, linear.bias, x)
    assert out.shape == (*shape[:-1], 40) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, linear.weight, linear.bias))


def test_inside_the_context_only_the_measured_row_counts_take_it(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(layout, "MIN_GROUP_BYTES", 0)
    monkeypatch.setattr(layout, "_measure", lambda linears: [1, 4, 64])  # rows 1, 4-7 and 64, not 2-3 or 8-63
    model = tiny_model("llama", vocab=64, hidden=32)
    head = model.get_output_embeddings()
    rows = []
    real = layout.rows_first_product
    monkeypatch.setattr(layout, "rows_first_product", lambda w, b, x: rows.append(x.numel() // x.shape[-1]) or
                        real(w, b, x))
    with layout.rows_first(model):
        with layout.rows_first(model):  # nested: the outer layout stays
            pass
        for q in (1, 2, 3, 4, 7, 8, 65, 300):
            assert head(torch.randn(1, q, 32)).shape == (1, q, 64)
    assert rows == [1, 4, 7]  # and a prompt's forward past the last bucket (65, 300 rows) takes the Linear's own
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    assert not any("forward" in m.__dict__ for m in linears)  # the model's own forwards again after the context


def test_a_measured_table_is_saved_and_read_back(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(layout, "_measure", lambda linears: measured.append(len(linears)) or [4, 8])
    group = [torch.nn.Linear(16, 48) for _ in range(3)]
    assert layout.rows_first_buckets(group) == [4, 8]
    again = [torch.nn.Linear(16, 48) for _ in range(3)]  # another group of the same shapes: the saved table
    assert layout.rows_first_buckets(again) == [4, 8] and measured == [3]


def test_subclasses_and_small_groups_are_left_alone(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    measured = []
    monkeypatch.setattr(layout, "_measure", lambda linears: measured.append(linears) or list(layout.ROW_BUCKETS))

    class LoraLike(torch.nn.Linear):
        pass

    big = torch.nn.Linear(512, 1024, bias=False)  # 2 MB: a group that matters
    model = torch.nn.Sequential(big, LoraLike(1024, 512, bias=False), torch.nn.Linear(8, 8))
    assert list(layout.linear_groups(model)) == [((1024, 512), torch.float32, False)]
    with layout.rows_first(model):
        assert "forward" in big.__dict__ and "forward" not in model[1].__dict__ and "forward" not in model[2].__dict__
    assert measured == [[big]] and layout.layout_key(model).startswith("|rows-first-")


def test_the_layout_key_is_empty_where_nothing_was_faster(monkeypatch, tmp_path):
    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(layout, "MIN_GROUP_BYTES", 0)
    monkeypatch.setattr(layout, "_measure", lambda linears: [])
    model = tiny_model("llama", vocab=64, hidden=32)
    assert layout.layout_key(model) == ""
    with layout.rows_first(model):
        assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_copied_model_computes_with_its_own_weights(rows_first_everywhere):
    model = tiny_model("llama", vocab=64, hidden=32)
    with layout.rows_first(model):
        pass  # planned for the original
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.get_output_embeddings().weight.mul_(-1.0)
    x = torch.randn(1, 3, 32)
    with layout.rows_first(twin):
        out = twin.get_output_embeddings()(x)
    torch.testing.assert_close(out, F.linear(x, twin.get_output_embeddings().weight))


def test_decoding_through_the_rows_first_layout_is_lossless(rows_first_everywhere):
    model = tiny_model("llama", vocab=64, hidden=32, layers=2, seed=3)
    prompt = torch.randint(1, 64, (40,), generator=torch.Generator().manual_seed(1))
    prompt[20:30] = prompt[:10]
    reference = model.generate(prompt[None], attention_mask=torch.ones(1, 40, dtype=torch.long), max_new_tokens=48,
                               do_sample=False, eos_token_id=None, pad_token_id=0)[0, 40:].tolist()
    plain = dk.generate(model, prompt, max_new_tokens=48, eos_token_id=[]).tokens.tolist()
    assert plain == reference  # plain decoding through the layout (one row a step) is the model's own output
    for kind in ("suffix", "lookahead", "standalone-tree", "eagle-tree"):
        assert drafted_tokens(model, kind, prompt, 48, static=False) == plain, kind
    out = dk.generate(model, prompt, drafter=dk.make_drafter("suffix", model), max_new_tokens=48, eos_token_id=[],
                      budget="fixed")
    assert out.tokens.tolist() == plain
    assert sum(s.accepted for s in out.stats.steps) > 0  # trees of several rows were verified through it


def test_the_tree_probe_compares_masks_not_layouts(rows_first_everywhere, monkeypatch):
    """A layout whose rounding moves log-probs further than the probe's tolerance (here: every rows-first product
    shifted by 0.05) must not mark a model's tree attention broken: both routes of the probe take the same kernels."""
    from draftkit.verify.tree_probe import probe_tree_attention

    real = layout.rows_first_product
    monkeypatch.setattr(layout, "rows_first_product", lambda w, b, x: real(w, b, x) + 0.05)
    model = tiny_model("llama", vocab=64, hidden=32, layers=2, seed=5)
    assert probe_tree_attention(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_real_measurement_names_buckets_it_timed(dtype):
    """The timing itself (no stand-in): both layouts run at every bucket, and the answer is a sorted subset."""
    group = [torch.nn.Linear(128, 256, bias=True).to(dtype) for _ in range(2)]
    buckets = layout._measure(group)
    assert buckets == sorted(set(buckets)) and set(buckets) <= set(layout.ROW_BUCKETS)
