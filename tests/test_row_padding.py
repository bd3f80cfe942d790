"""Row padding (verify/forward.py, verify/cost_profile.py): a step may run padded to a row count its target's cost
profile measured cheaper; the padding changes no logit, no kept entry and no output."""
from __future__ import annotations

import pytest
import torch

from draftkit.verify.contract import Budget, DraftTree
from draftkit.verify.controller import AutoBudget
from draftkit.verify.cost_profile import PAD_WIN, CostProfile, padding
from draftkit.verify.decode import generate
from draftkit.verify.forward import Verifier
from tests.models import tiny_model, windowed_model


def test_a_size_is_padded_to_the_cheapest_larger_size_only_where_that_clearly_wins():
    seconds = {1: 1.30, 2: 1.50, 3: 1.20, 4: 1.05, 5: 1.20, 6: 1.35, 7: 1.40, 8: 1.25, 32: 0.5}
    assert padding(seconds) == {1: 4, 2: 4, 3: 4, 6: 8, 7: 8}  # not 5 (8 is no clear win); 32 lies past
    assert padding({1: 1.0, 2: 1.0 * PAD_WIN + 1e-6}) == {}  # within PAD_WIN: not worth padding
    assert padding({1: 1.0, 2: 1.1, 3: 1.2}) == {}  # a monotone curve pads nothing


def test_the_curve_prices_each_size_as_the_size_it_runs_as(monkeypatch):
    """An eager profile is measured at every size up to PADDED_REACH, pads where a larger size was clearly
    cheaper, and its c(n) is then the padded size's cost (monotone)."""
    model = tiny_model("llama")
    prof = CostProfile.measure(model, 128, sizes=(1, 2, 4, 8, 16))
    assert prof.sizes[:16] == list(range(1, 17))
    assert all(a <= b for a, b in zip(prof.ratios, prof.ratios[1:]))
    assert all(m > n for n, m in prof.padded)
    assert prof.row_padding() == {n + 1: m + 1 for n, m in prof.padded}
    assert len(prof.unpadded) == len(prof.sizes)  # the curve as measured, before padding, for reports
    assert all(prof.ratios[prof.sizes.index(n)] >= prof.unpadded[prof.sizes.index(m)] - 1e-9 for n, m in prof.padded)


def _verifiers(model, prompt, padding_rows):
    vers = []
    for pad in ({}, padding_rows):
        ver = Verifier(model, capacity=prompt.numel() + 40)
        ver.forward(prompt, DraftTree.empty())
        ver.commit(prompt.numel(), [])
        ver.use_row_padding(pad)
        vers.append(ver)
    return vers


@pytest.mark.parametrize("arch", ["llama", "mistral-window", "gemma2-window"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_a_padded_forward_gives_the_unpadded_logits_hidden_states_and_kept_entries(arch, shape):
    """The same step with and without padding to 8 rows: the same logits and hidden states of its rows, and after
    committing an accepted path the next step's logits agree too (no padding entry was kept). Windowed targets run
    past their 8-position window."""
    model = tiny_model("llama") if arch == "llama" else windowed_model(arch.split("-")[0], window=8)
    prompt = torch.arange(12) % 9 + 3
    plain, padded = _verifiers(model, prompt, {q: 8 for q in range(2, 8)})
    tree = DraftTree.chain([4, 7, 1]) if shape == "chain" else DraftTree.from_lists([4, 9, 7, 1], [-1, -1, 0, 2])
    outs = []
    for ver in (plain, padded):
        logits, hidden = ver.forward(torch.tensor([5]), tree.validate(), hidden_layers=(1, -1))
        assert ver.kv.pending == (8 if ver is padded else len(tree) + 1)  # the padding ran, as 8 rows
        ver.commit(1, [0, 2] if shape == "tree" else [0, 1])
        nxt, _ = ver.forward(torch.tensor([6]), DraftTree.chain([2]).validate())
        outs.append((logits, hidden, nxt))
    (l0, h0, n0), (l1, h1, n1) = outs
    assert l0.shape == l1.shape and torch.allclose(l0, l1, atol=1e-5)
    assert all(a.shape == b.shape and torch.allclose(a, b, atol=1e-5) for a, b in zip(h0, h1))
    assert torch.allclose(n0, n1, atol=1e-5)


def _padded_policy(model, drafter, rows: int = 12) -> AutoBudget:
    """The controller with a flat profile that pads every step of up to rows - 1 rows to `rows`."""
    sizes = list(range(1, 17)) + [32, 64]
    prof = CostProfile(0.01, sizes, [1.0] * len(sizes), context=128, padded=[[n, rows - 1] for n in range(1, rows - 1)])
    return AutoBudget(model, Budget(drafter.budget_cap.max_depth, drafter.budget_cap.max_nodes), profile=prof)


def _record_rows(model) -> list[int]:
    rows, real = [], model.forward

    def forward(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[-1])
        return real(*args, **kwargs)
    model.forward = forward
    return rows


@pytest.mark.parametrize("method", ["suffix", "eagle"])
@pytest.mark.parametrize("arch", ["llama", "mistral-window"])
def test_decoding_with_padded_steps_is_lossless(method, arch):
    """Greedy decoding whose drafted steps all run padded to 12 rows equals plain greedy decoding (the drafters
    read the hidden states of the step's rows: EAGLE), and the padding really ran."""
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
    from draftkit.drafters.suffix import SuffixDrafter

    model = tiny_model("llama", seed=1) if arch == "llama" else windowed_model("mistral", window=8, seed=1)
    torch.manual_seed(2)
    drafter = SuffixDrafter(max_depth=6, max_nodes=8) if method == "suffix" else \
        EagleDrafter(model, EagleDraftModel.from_target(model), max_depth=4, max_nodes=8, top_k=2)
    prompts = [torch.tensor([3, 17, 42, 8, 8, 61, 0, 9] * 3), torch.arange(20) % 7 + 30]
    for prompt in prompts:
        ref = generate(model, prompt, max_new_tokens=40, eos_token_id=[]).tokens
        rows = _record_rows(model)
        out = generate(model, prompt, drafter, max_new_tokens=40, eos_token_id=[],
                       budget=_padded_policy(model, drafter))
        del model.forward
        assert out.tokens.tolist() == ref.tolist()
        drafted = [s for s in out.stats.decode_steps if s.drafted]
        assert drafted and 12 in rows  # drafted steps of fewer rows ran as 12


def test_a_step_is_not_padded_where_the_buffer_would_have_to_grow_for_the_padding():
    model = tiny_model("llama")
    prompt = torch.arange(12) % 9 + 3
    ver = Verifier(model, capacity=prompt.numel() + 4)
    ver.forward(prompt, DraftTree.empty())
    ver.commit(prompt.numel(), [])
    ver.use_row_padding({2: 8, 3: 4})
    ver.forward(torch.tensor([5]), DraftTree.chain([4]).validate())
    assert ver.kv.pending == 2 and ver.kv.capacity == prompt.numel() + 4  # 8 rows would not fit: run as 2
    ver.kv.drop_pending()
    ver.forward(torch.tensor([5]), DraftTree.chain([4, 7]).validate())
    assert ver.kv.pending == 4  # 4 rows fit: padded
