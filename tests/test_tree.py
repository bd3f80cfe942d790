"""Tree masks, positions and the one-forward tree verification against path-by-path logits."""
import pytest
import torch
from transformers import DynamicCache

from drafters.base import DraftTree
from tests.models import ARCHS, tiny_model
from verify.forward import Verifier, probe_tree_attention
from verify.tree import ancestor_matrix, is_chain, path_slots, tree_attention_mask, tree_positions

# a tree with two branches of different depths:  root -> 0 -> 2 -> 4 ; root -> 1 -> 3
TREE = DraftTree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 0, 1, 2])).validate()


def test_depths_children_and_ancestors():
    assert TREE.depth == [0, 1, 1, 2, 2, 3]
    assert TREE.children[0] == [1, 2] and TREE.children[1] == [3]
    anc = ancestor_matrix(TREE)
    assert anc[4].tolist() == [True, False, True, False, True]
    assert anc[3].tolist() == [False, True, False, True, False]
    assert path_slots(TREE, 4) == [0, 2, 4]


def test_mask_and_positions_shape_and_content():
    mask = tree_attention_mask(TREE, cache_len=3, prefix_len=2, dtype=torch.float32, device="cpu")
    assert mask.shape == (1, 1, 7, 10)
    allowed = mask[0, 0] == 0
    assert allowed[:, :3].all()  # everyone sees the cache
    assert allowed[0, 3] and not allowed[0, 4]  # the prefix is causal
    assert allowed[2:, 3:5].all()  # nodes see the whole prefix
    assert allowed[6, 5:].tolist() == [True, False, True, False, True]  # node 4 sees 0, 2 and itself
    pos = tree_positions(TREE, cache_len=3, prefix_len=2, device="cpu")
    assert pos.tolist() == [[3, 4, 5, 5, 6, 6, 7]]


def test_is_chain():
    assert is_chain(DraftTree.chain(torch.tensor([1, 2, 3])).validate())
    assert is_chain(DraftTree.empty().validate())
    assert not is_chain(TREE)


@pytest.mark.parametrize("parents", [[0], [-1, 1], [-1, 5], [-1, -2]])
def test_bad_parents_are_rejected(parents):
    with pytest.raises(ValueError, match="parent"):
        DraftTree(torch.arange(len(parents)), torch.tensor(parents)).validate()


def test_bad_shapes_and_tokens_are_rejected():
    with pytest.raises(ValueError, match="same length"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([-1])).validate()
    with pytest.raises(ValueError, match="lie in"):
        DraftTree(torch.tensor([1, 99]), torch.tensor([-1, 0])).validate(vocab_size=64)
    with pytest.raises(ValueError, match="q must be"):
        DraftTree(torch.tensor([1]), torch.tensor([-1]), q=torch.ones(2, 64)).validate()


TOL = 1e-4  # fp32; observed differences are around 1e-6


@pytest.mark.parametrize("arch", ARCHS)
def test_tree_forward_equals_each_path_run_alone(arch):
    model = tiny_model(arch)
    assert probe_tree_attention(model)
    prompt = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    ver = Verifier(model)
    # put the first 5 tokens in the cache, feed 3 as the prefix, then the tree on top
    ver.forward(prompt[:5], DraftTree.empty().validate(), hidden=False)
    ver.cache_len = 5
    logits, _ = ver.forward(prompt[5:], TREE, hidden=False)
    assert logits.shape == (len(TREE) + 1, 64)
    with torch.no_grad():
        root_ref = model(input_ids=prompt[None]).logits[0, -1]
        assert torch.allclose(logits[0], root_ref, atol=TOL)
        for node in range(len(TREE)):
            path = TREE.tokens[path_slots(TREE, node)]
            ref = model(input_ids=torch.cat([prompt, path])[None]).logits[0, -1]
            assert torch.allclose(logits[node + 1], ref, atol=TOL), (arch, node, (logits[node + 1] - ref).abs().max())


def test_model_without_tree_attention_gets_a_clear_error(monkeypatch):
    from verify.forward import TreeAttentionUnsupported

    model = tiny_model("llama")
    model._draftkit_tree_ok = False  # as if the probe had found wrong tree logits
    ver = Verifier(model)
    ver.forward(torch.tensor([1, 2, 3]), DraftTree.chain(torch.tensor([4, 5])).validate(), hidden=False)  # chains run
    with pytest.raises(TreeAttentionUnsupported, match="LlamaForCausalLM.*chain"):
        ver.forward(torch.tensor([1]), TREE, hidden=False)
