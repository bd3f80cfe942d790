"""eval/divergence.py: a difference at a near-tie of the target's top two logits is told from a real mismatch."""
import torch

from draftkit.eval.divergence import classify, first_divergence
from tests.models import tiny_model


def test_a_near_tie_in_bf16_is_not_a_mismatch_but_a_clear_gap_is():
    logits = torch.tensor([0.0, 12.0, 12.0625, 3.0])
    assert classify(logits, 2, 1, torch.bfloat16)["near_tie"]
    assert not classify(logits, 2, 1, torch.float32)["near_tie"]  # fp32 resolves 1/16 of a logit
    assert not classify(logits, 2, 3, torch.bfloat16)["near_tie"]  # token 3 is nowhere near the top


def test_first_divergence_finds_the_position_and_reads_the_targets_logits_there():
    model = tiny_model("llama")
    prompt = [1, 2, 3]
    assert first_divergence(model, prompt, [4, 5, 6], [4, 5, 6]) is None
    d = first_divergence(model, prompt, [4, 5, 6], [4, 9, 6])
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits[0, -1]
    assert d["position"] == 1 and d["tokens"] == [5, 9]
    assert abs(d["gap"] - float((ref[5] - ref[9]).abs())) < 1e-5
