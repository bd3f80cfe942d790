"""Tree masks, positions and the one-forward tree verification against path-by-path logits."""
import pytest
import torch
from tests.models import ARCHS, tiny_model
from draftkit.verify.cache import KVBuffer
from draftkit.verify.contract import DraftTree, NoDrafter
from draftkit.verify.forward import Verifier
from draftkit.verify.tree import run_model
from draftkit.verify.tree_probe import probe_tree_attention
from draftkit.verify.tree import MaskBuffer, path_slots, positions, verify_block, verify_offsets
from draftkit.verify.packed import generate_packed

# a tree with two branches of different depths:  root -> 0 -> 2 -> 4 ; root -> 1 -> 3
TREE = DraftTree(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, -1, 0, 1, 2])).validate()


def test_depths_children_and_ancestors():
    assert TREE.depth == [0, 1, 1, 2, 2, 3]
    assert TREE.children[0] == [1, 2] and TREE.children[1] == [3]
    anc = TREE.ancestors
    assert anc[4].tolist() == [True, False, True, False, True]
    assert anc[3].tolist() == [False, True, False, True, False]
    assert path_slots(TREE, 4) == [0, 2, 4]


def test_mask_and_positions_shape_and_content():
    masks = MaskBuffer(torch.float32, "cpu")
    mask = masks([3], verify_block(TREE, prefix_len=2))
    assert mask.shape == (1, 1, 7, 10)
    allowed = mask[0, 0] == 0
    assert allowed[:, :3].all()  # everyone sees the cache
    assert allowed[0, 3] and not allowed[0, 4]  # the prefix is causal
    assert allowed[2:, 3:5].all()  # nodes see the whole prefix
    assert allowed[6, 5:].tolist() == [True, False, True, False, True]  # node 4 sees 0, 2 and itself
    pos = positions([3], verify_offsets(TREE, prefix_len=2))
    assert pos.tolist() == [[3, 4, 5, 5, 6, 6, 7]]


def test_mask_buffer_is_reused_and_cleared_between_calls():
    masks = MaskBuffer(torch.float32, "cpu")
    first = masks([3], verify_block(TREE, prefix_len=2)).clone()
    chain = DraftTree.chain([1, 2]).validate()
    later = masks([9], verify_block(chain, prefix_len=1))  # the earlier block now lies in the visible past
    assert later.shape == (1, 1, 3, 12)
    assert (later[0, 0, :, :9] == 0).all()  # nothing of the first call survives
    assert (later[0, 0] == 0).sum() == 9 * 3 + 6  # causal 3 x 3 block
    again = masks([3], verify_block(TREE, prefix_len=2))
    assert torch.equal(again, first)


def test_more_rows_do_not_widen_the_buffer():
    """A cost profile times trees of 1..16, 32 and 64 nodes at one context: the buffer grows in rows, its columns
    stay what the widest step needs (doubling them at every new row count reached 35 GB at context 2048)."""
    masks = MaskBuffer(torch.float32, "cpu")
    w = 300
    for q in [*range(2, 18), 33, 65]:
        past = torch.ones(q, w, dtype=torch.bool)
        block = torch.ones(q, q, dtype=torch.bool).tril()
        mask = masks.write(past, block)
        assert mask.shape == (1, 1, q, w + q) and (mask[0, 0, :, :w] == 0).all()
    assert masks.buf.shape[-1] < 2 * (w + 65) and masks.nbytes() <= 4 * 65 * 2 * (w + 65)
    masks.write(torch.ones(2, 4 * w, dtype=torch.bool), torch.ones(2, 2, dtype=torch.bool))  # a wider step
    assert masks.buf.shape[-1] >= 4 * w + 2


def test_ragged_rows_hide_the_columns_past_their_length():
    masks = MaskBuffer(torch.float32, "cpu")
    block = torch.ones(1, 1, dtype=torch.bool)
    mask = masks([2, 5], block)  # row 0 has 2 entries, row 1 has 5; one new token each
    allowed = mask[:, 0, 0] == 0
    assert allowed[0].tolist() == [True, True, True, False, False, False]
    assert allowed[1].tolist() == [True] * 6


def test_is_chain():
    assert DraftTree.chain(torch.tensor([1, 2, 3])).validate().is_chain
    assert DraftTree.empty().validate().is_chain
    assert not TREE.is_chain


def _filled(model, tokens, kv):
    """Run `tokens` into kv as one forward (pending), returning the per-layer keys of a fresh run."""
    run_model(model, kv, None, None, None, input_ids=tokens[None])


@pytest.mark.parametrize("keep", [[0, 1, 2, 3], [0, 1, 4, 6], [0, 1], [0, 1, 5]])
def test_commit_keeps_exactly_the_right_entries(keep):
    """After commit(keep) the buffer equals a cache built from scratch for the kept tokens (prefix,
    non-prefix and empty acceptances), because the kept entries' positions were their final ones."""
    model = tiny_model("llama")
    seq = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5])
    kv = KVBuffer.for_model(model, capacity=4)  # small: forces the buffer to grow
    _filled(model, seq[:2], kv)
    kv.commit([0, 1])
    # a tree whose nodes all sit at position 2 + depth - 1 == 2 (siblings): their keys depend on position
    tree = DraftTree.from_lists(seq[2:9].tolist(), [-1] * 7).validate()
    run_model(model, kv, MaskBuffer(torch.float32, "cpu"), verify_block(tree, 0), verify_offsets(tree, 0) + 1,
              input_ids=tree.tokens[None])
    kept_nodes = [k - 2 for k in keep[2:]]
    kv.commit([k - 2 for k in keep[2:]])  # offsets among the pending entries
    assert kv.lengths == [2 + len(kept_nodes)]
    # reference: each kept sibling run on its own after the prefix, at the same position (it saw only the prefix)
    for i, node in enumerate(kept_nodes):
        ref = KVBuffer.for_model(model, capacity=16)
        _filled(model, seq[:2], ref)
        ref.commit([0, 1])
        run_model(model, ref, MaskBuffer(torch.float32, "cpu"), torch.ones(1, 1, dtype=torch.bool),
                  torch.tensor([1]), input_ids=tree.tokens[node][None, None])
        for a, b in zip(kv.layers, ref.layers):
            torch.testing.assert_close(a.keys[:, :, :2], b.keys[:, :, :2])
            torch.testing.assert_close(a.keys[:, :, 2 + i], b.keys[:, :, 2])
            torch.testing.assert_close(a.values[:, :, 2 + i], b.values[:, :, 2])


def test_commit_copies_only_what_moves(monkeypatch):
    kv = KVBuffer(num_layers=2, capacity=8)
    k = torch.arange(6.0).view(1, 1, 6, 1)
    for layer in kv.layers:
        layer.update(k, k)
    kv.end_forward()
    moved = []
    monkeypatch.setattr(type(kv.layers[0]), "move", lambda self, r, s, d: moved.append(s.tolist()))
    kv.commit([0, 1, 2])
    assert moved == []  # a prefix: nothing copied
    kv.reset()
    for layer in kv.layers:
        layer.update(k, k)
    kv.end_forward()
    kv.commit([0, 1, 4])
    assert moved == [[4], [4]]  # one entry per layer, nothing else


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
    ver = Verifier(model, capacity=6)
    # put the first 5 tokens in the cache, feed 3 as the prefix, then the tree on top
    ver.forward(prompt[:5], DraftTree.empty().validate())
    ver.commit(5, [])
    logits, _ = ver.forward(prompt[5:], TREE)
    assert logits.shape == (len(TREE) + 1, 64)
    with torch.no_grad():
        root_ref = model(input_ids=prompt[None]).logits[0, -1]
        assert torch.allclose(logits[0], root_ref, atol=TOL)
        for node in range(len(TREE)):
            path = TREE.tokens[path_slots(TREE, node)]
            ref = model(input_ids=torch.cat([prompt, path])[None]).logits[0, -1]
            assert torch.allclose(logits[node + 1], ref, atol=TOL), (arch, node, (logits[node + 1] - ref).abs().max())


def test_model_without_tree_attention_gets_a_clear_error(monkeypatch):
    from draftkit.verify.tree_probe import TreeAttentionUnsupported

    model = tiny_model("llama")
    model._draftkit_tree_ok = False  # as if the probe had found wrong tree logits
    ver = Verifier(model)
    ver.forward(torch.tensor([1, 2, 3]), DraftTree.chain(torch.tensor([4, 5])).validate())  # chains run
    ver.commit(3, [0, 1])
    with pytest.raises(TreeAttentionUnsupported, match="LlamaForCausalLM.*chain"):
        ver.forward(torch.tensor([1]), TREE)
    with pytest.raises(TreeAttentionUnsupported, match="LlamaForCausalLM.*one sequence"):  # a batch of rows, too
        generate_packed(model, [torch.tensor([1, 2, 3]), torch.tensor([4, 5])], [NoDrafter(), NoDrafter()], 4)


def test_verify_never_imports_drafters():
    """The contract lives in verify/; drafters/ implement it. An import the other way is an error."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent / "verify"
    offenders = [str(p.name) for p in root.glob("*.py")
                 if re.search(r"^\s*(from|import)\s+(draftkit\.)?drafters\b", p.read_text(), re.M)]
    assert root.exists() and len(list(root.glob("*.py"))) >= 6
    assert offenders == []


def test_eval_and_the_library_never_import_train():
    """train/ writes checkpoints; verify/, drafters/, eval/ and draftkit/ must run without it."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    files = [p for d in ("verify", "drafters", "eval", "draftkit") for p in (root / d).glob("*.py")]
    offenders = [str(p.relative_to(root)) for p in files
                 if re.search(r"^\s*(from|import)\s+(draftkit\.)?train\b", p.read_text(), re.M)]
    assert offenders == []


class FakeAttention(torch.nn.Module):
    """A one-layer 'model' whose logits at a position are a fixed function of the tokens it may see, written
    through the KV cache like a real model's: what a correct tree mask gives, computed in fp32 and rounded
    to `dtype`. `jitter` scales the logits of masked (tree) forwards by 1 + jitter before rounding, so the two
    routes differ by the dtype's rounding; `see_all` ignores the mask (a model that gets tree attention wrong)."""

    def __init__(self, dtype=torch.bfloat16, jitter=2 ** -8, see_all=False, fail=None, vocab=16):
        super().__init__()
        from transformers import LlamaConfig

        self.config = LlamaConfig(vocab_size=vocab, num_hidden_layers=1, hidden_size=8, num_attention_heads=1)
        self.dtype_, self.jitter, self.see_all, self.fail = dtype, jitter, see_all, fail
        g = torch.Generator().manual_seed(0)
        self.seen = torch.randn(vocab, vocab, generator=g) * 4  # what seeing token t adds to the logits
        self.own = torch.randn(vocab, vocab, generator=g) * 4

    dtype = property(lambda self: self.dtype_)
    device = property(lambda self: torch.device("cpu"))

    def forward(self, input_ids, cache=None, attention_mask=None, position_ids=None, **kwargs):
        from types import SimpleNamespace

        if self.fail is not None:
            raise self.fail
        ids = input_ids[0]
        q = ids.numel()
        visible = torch.ones(q, q).tril()
        if cache is not None:  # the cache holds every token this row may see (keys = token ids)
            keys, _ = cache.layers[0].update(ids.float()[None, None, :, None], ids.float()[None, None, :, None], 0)
            ids_all = keys[0, 0, :, 0].long()
            if attention_mask is not None:
                visible = (attention_mask[0, 0] == 0).float()
                if self.see_all:
                    visible = torch.ones_like(visible)
            else:
                visible = torch.cat([torch.ones(q, ids_all.numel() - q), visible], 1)
        else:
            ids_all = ids
        logits = visible @ self.seen[ids_all] / visible.sum(1, keepdim=True) + self.own[ids]
        if attention_mask is not None:
            logits = logits * (1 + self.jitter)
        return SimpleNamespace(logits=logits.to(self.dtype_)[None])


def test_the_probe_passes_bf16_logits_that_differ_by_rounding():
    from draftkit.verify.tree_probe import tree_logits_agree

    assert probe_tree_attention(FakeAttention(torch.bfloat16))
    # the same rounding in fp32 would be a real difference: the tolerance follows the dtype
    assert not probe_tree_attention(FakeAttention(torch.float32, jitter=2 ** -5))
    assert not probe_tree_attention(FakeAttention(torch.bfloat16, see_all=True))  # a wrong mask still fails
    ref = torch.randn(3, 16) * 5
    assert tree_logits_agree(ref.bfloat16(), ref, torch.bfloat16)
    assert not tree_logits_agree(ref.bfloat16(), ref, torch.float32)


def test_out_of_memory_in_the_probe_reaches_the_user():
    model = FakeAttention(fail=torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    with pytest.raises(torch.OutOfMemoryError):
        probe_tree_attention(model)
    assert getattr(model, "_draftkit_tree_ok", None) is None  # nothing decided: the next call probes again
    with pytest.raises(KeyError):
        probe_tree_attention(FakeAttention(fail=KeyError("a bug in the model")))
    assert not probe_tree_attention(FakeAttention(fail=TypeError("unexpected keyword argument 'position_ids'")))


def test_a_model_limited_to_chains_still_decodes_chains_under_the_auto_budget(monkeypatch, tmp_path):
    from draftkit.drafters.standalone import StandaloneDrafter
    from draftkit.verify.decode import generate

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))  # no saved profile: this one is measured here
    model = tiny_model("llama")
    prompt = torch.tensor([1, 2, 3])
    ref = generate(model, prompt, max_new_tokens=20, eos_token_id=[]).tokens.tolist()
    model._draftkit_tree_ok = False  # the cost profile must measure chains, not bushy trees
    out = generate(model, prompt, StandaloneDrafter(model, max_depth=3), max_new_tokens=20, eos_token_id=[],
                   budget="auto")
    assert out.tokens.tolist() == ref
