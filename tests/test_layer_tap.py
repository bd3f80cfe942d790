"""verify/layer_tap.py: the verifier returns the hidden states a drafter asked for through hooks, equal to
transformers' output_hidden_states, while holding only those layers; models whose modules do not line up keep
output_hidden_states."""
import pytest
import torch

from draftkit.verify.contract import DraftTree
from draftkit.verify.forward import Verifier
from draftkit.verify.layer_tap import LayerTap
from tests.models import tiny_model, windowed_model

torch.set_num_threads(1)


def hidden_of(model, tap_on: bool, layers=(0, 2, -1)):
    model.__dict__.pop("_draftkit_tap", None)
    if not tap_on:
        model.__dict__["_draftkit_tap"] = None
    ver = Verifier(model, 64)
    prompt = torch.arange(20) % 50 + 1
    _, first = ver.forward(prompt, DraftTree.empty(), layers)
    ver.commit(20, [])
    _, tree = ver.forward(torch.tensor([7]), DraftTree.from_lists([3, 4, 5], [-1, -1, 0]), layers)
    return first, tree, ver.peak_hidden_bytes


@pytest.mark.parametrize("make", [lambda: tiny_model("llama", layers=4), lambda: tiny_model("qwen2", layers=4),
                                  lambda: windowed_model("gemma3")])
def test_tapped_layers_equal_output_hidden_states_and_hold_only_those(make):
    model = make()
    with_tap = hidden_of(model, True)
    assert LayerTap.of(model) is not None
    without = hidden_of(model, False)
    for a, b in zip(with_tap[:2], without[:2]):
        assert len(a) == 3 and all(torch.equal(x, y) for x, y in zip(a, b))
    layers = model.config.num_hidden_layers + 1
    assert with_tap[2] * layers == without[2] * 3  # three layers held instead of every one


def test_a_model_whose_modules_do_not_line_up_keeps_output_hidden_states():
    model = tiny_model("gpt2", layers=3)  # hidden_states[0] adds position embeddings to the token embeddings
    assert LayerTap.of(model) is None
    a, b, _ = hidden_of(model, True)
    assert a[0].shape == (20, 32) and b[0].shape == (4, 32)
