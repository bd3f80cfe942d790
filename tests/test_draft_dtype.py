"""Drafts in another dtype than the target's (drafters/draft_dtype.py): which dtype "auto" picks, the target's head
copied once per dtype, and decoding that stays exact with a bf16 draft beside an fp32 target."""
from __future__ import annotations

import pytest
import torch

import draftkit.drafters.draft_dtype as dd
from draftkit.drafters.dflash import DFlashDrafter
from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.registry import EagleSettings
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.verify.decode import generate
from tests.test_dflash import exact_tokens_2_3, random_draft, sampled_counts, assert_follows, sampling_pair
from tests.test_dflash import target as dflash_target  # noqa: F401 (a fixture)
from tests.test_eagle import PROMPTS, oracle_draft, tiny_target


@pytest.fixture
def native(monkeypatch):
    """A CPU with native bf16 products (the conftest's default says there is none), and the tests' tiny drafts
    counted as big ones."""
    monkeypatch.setattr(dd, "native_bf16", lambda device: device.type == "cpu")
    monkeypatch.setattr(dd, "BF16_MIN_BYTES", 0)


def test_auto_is_bf16_only_for_big_drafts_beside_an_fp32_target_on_a_cpu_with_native_bf16(monkeypatch):
    monkeypatch.setattr(dd, "native_bf16", lambda device: device.type == "cpu")
    fp32, big, small = tiny_target(layers=1), dd.BF16_MIN_BYTES // 4, dd.BF16_MIN_BYTES // 4 - 1
    assert dd.draft_dtype(fp32, reads=big) == torch.bfloat16
    assert dd.draft_dtype(fp32, reads=small) == torch.float32  # small products: the casts cost more
    assert dd.draft_dtype(fp32, "target", reads=big) == dd.draft_dtype(fp32, "float32") == torch.float32
    assert dd.draft_dtype(fp32, "bfloat16") == torch.bfloat16 and dd.draft_dtype(fp32, "float16") == torch.float16
    assert dd.draft_dtype(tiny_target(layers=1).to(torch.float16), reads=big) == torch.float16  # a half target
    monkeypatch.setattr(dd, "native_bf16", lambda device: False)
    assert dd.draft_dtype(fp32, reads=big) == torch.float32


def test_what_a_draft_reads_counts_the_target_head_only_when_it_reads_it():
    target = tiny_target(layers=1)
    draft = oracle_draft(target)
    own = sum(p.numel() for p in draft.parameters())
    assert dd.reads_of(draft, target, False) == own
    assert dd.reads_of(draft, target, True) == own + target.lm_head.weight.numel()


def test_a_bad_draft_dtype_is_one_line_naming_it():
    with pytest.raises(ValueError, match="draft_dtype must be one of .* got 'fp8'"):
        EagleSettings(draft_dtype="fp8")
    with pytest.raises(ValueError, match="got 'half'"):
        dd.draft_dtype(tiny_target(layers=1), "half")


def test_the_head_copy_is_shared_and_follows_the_head():
    target = tiny_target(layers=1)
    head = target.get_output_embeddings()
    assert dd.head_in(target, torch.float32) is head
    copy = dd.head_in(target, torch.bfloat16)
    assert copy is dd.head_in(target, torch.bfloat16) and copy.weight.dtype == torch.bfloat16
    assert torch.equal(copy.weight, head.weight.to(torch.bfloat16))
    with torch.no_grad():
        head.weight.mul_(2.0)  # the target's head changed (a fine-tune): a fresh copy
    fresh = dd.head_in(target, torch.bfloat16)
    assert fresh is not copy and torch.equal(fresh.weight, head.weight.to(torch.bfloat16))


def greedy_equal(target, drafter, prompts, tokens=24):
    for p in prompts:
        ref = generate(target, p, max_new_tokens=tokens, eos_token_id=[])
        out = generate(target, p, drafter=drafter, max_new_tokens=tokens, eos_token_id=[], budget="fixed")
        assert out.tokens.equal(ref.tokens)
    return out


@pytest.mark.parametrize("layers", [None, [0, -1]])  # EAGLE-1/2 and fused features (EAGLE-3 style)
def test_bf16_eagle_drafts_stay_lossless_and_still_pass(native, layers):
    target = tiny_target(layers=1, seed=0)
    drafter = EagleDrafter(target, oracle_draft(target, layers), max_depth=4, top_k=2, max_nodes=8)
    assert drafter.dtype == torch.bfloat16 and next(drafter.draft.parameters()).dtype == torch.bfloat16
    assert drafter.head.weight.dtype == torch.bfloat16 and target.lm_head.weight.dtype == torch.float32
    out = greedy_equal(target, drafter, PROMPTS[1:])
    assert out.stats.tau > 2.0  # the oracle still drafts well in bf16 (fp32: above 3)
    lane = drafter.lane()
    assert lane.dtype == torch.bfloat16 and lane.draft is drafter.draft


def test_bf16_dflash_and_standalone_drafts_stay_lossless(native, dflash_target):
    drafter = DFlashDrafter(dflash_target, random_draft(dflash_target), max_depth=4, max_nodes=8, top_k=2)
    assert drafter.head.weight.dtype == torch.bfloat16
    greedy_equal(dflash_target, drafter, PROMPTS[:2])
    small = tiny_target(layers=1, seed=3).to(dd.draft_dtype(dflash_target))  # what the registry loads
    standalone = StandaloneDrafter(small, max_depth=3, top_k=2, max_nodes=6, target=dflash_target)
    greedy_equal(dflash_target, standalone, PROMPTS[:2])


def test_sampling_with_a_bf16_draft_follows_the_target(native):
    """q is computed from the bf16 draft's own logits, the ones it drew from: the joint of the 2nd and 3rd
    sampled tokens still matches the target's exact joint (tests/test_dflash.py's check)."""
    target, draft = sampling_pair()
    drafter = DFlashDrafter(target, draft, max_depth=2, max_nodes=6, top_k=3)
    assert drafter.draft.norm.weight.dtype == torch.bfloat16
    prompt = torch.tensor([1, 2, 3, 1, 2])
    counts, accepted = sampled_counts(target, prompt, drafter, 1200)
    assert_follows(counts, exact_tokens_2_3(target, prompt), accepted, True)


def test_training_evaluations_never_cast_the_draft_in_place(native):
    """The training scripts decode with the draft they train (tree temperature, held-out tau) before saving it:
    the draft must stay in fp32 (a bf16 round trip would be saved)."""
    from draftkit.train.calibrate import tree_drafter

    target = tiny_target(layers=1)
    draft = oracle_draft(target)
    drafter = tree_drafter(target, draft)
    assert drafter.dtype == torch.float32 and next(draft.parameters()).dtype == torch.float32


def test_a_draft_with_its_own_head_makes_no_copy_of_the_target_s(native):
    """EAGLE-3 drafts read their own (reduced) head: no bf16 copy of the target's is made for them."""
    from draftkit.drafters.eagle_reference import Eagle3Draft
    from draftkit.drafters.eagle import EagleConfig

    target = tiny_target(layers=2)
    cfg = EagleConfig.from_target(target, [0, 1, 2])
    cfg.layout = "reference"
    drafter = EagleDrafter(target, Eagle3Draft(cfg), max_depth=3, top_k=2, max_nodes=6)
    assert drafter.dtype == torch.bfloat16 and drafter.head is target.lm_head
    assert "_draftkit_draft_heads" not in target.__dict__
    greedy_equal(target, drafter, PROMPTS[1:2])
