"""The reference EAGLE drafts themselves (drafters/eagle_reference.py): their draft cache against a recomputation,
the reduced draft vocabulary (d2t / t2d, lossless sampling through it) and the training of the reference layout
(the loss falls, the training-time test equals chain decoding). Import and export are in tests/test_formats.py."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.eagle_reference import Eagle3Draft, make_draft
from draftkit.drafters.reference_config import frequent_tokens, vocab_mapping
from draftkit.drafters.formats import detect
from draftkit.train.export import main as export_main
from draftkit.verify.accept import Sampling
from tests.formats_common import DRAFT_IDS, PROMPTS, generate, tiny_target
from tests.test_eagle import _exact_joint, assert_unrolled_steps_are_chain_decoding, unroll_training_time_test

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target8():
    return tiny_target(layers=8)


@pytest.mark.parametrize("draft_layers", [1, 2])
def test_reference_draft_cache_matches_recomputation(target8, draft_layers):
    """The incremental draft (KV cache, tree masks, catch-up) equals running the draft from scratch, also when
    the draft has decoder layers after its first (each with its own cache layer)."""
    from draftkit.verify.tree import path_slots

    torch.manual_seed(0)
    draft = make_draft(target8, [2, 4, 6], "reference", DRAFT_IDS, draft_layers=draft_layers)

    class Log(EagleDrafter):
        def propose(self, state):
            tree = super().propose(state)
            if len(tree):
                self.log.append((state.tokens.clone(), self.bank.clone(), tree))
            return tree

    drafter = Log(target8, draft, max_depth=3, top_k=3, max_nodes=8)
    drafter.log = []
    generate(target8, PROMPTS[1], drafter=drafter, max_new_tokens=12, eos_token_id=[])
    embed = target8.get_input_embeddings()
    checked = 0
    with torch.no_grad():
        for tokens, bank, tree in drafter.log[:4]:
            hs = target8(input_ids=tokens[None, :-1], output_hidden_states=True).hidden_states
            fused = draft.fc(draft.select(hs)[0])
            for node in range(len(tree)):
                if tree.extra[node] < 0:
                    continue
                feats, toks = fused, tokens[1:]
                out = draft(feats[None], embed(toks)[None])[0, -1]
                torch.testing.assert_close(bank[0], out, atol=1e-4, rtol=1e-4)
                for tok in tree.tokens[path_slots(tree, node)].tolist():
                    feats, toks = torch.cat([feats, out[None]]), torch.cat([toks, torch.tensor([tok])])
                    out = draft(feats[None], embed(toks)[None])[0, -1]
                torch.testing.assert_close(bank[tree.extra[node] + 1], out, atol=1e-4, rtol=1e-4)
                checked += 1
    assert checked > 3


# ----------------------------------------------------------------------------- the reduced draft vocabulary


def test_d2t_offsets_map_every_draft_id():
    ids = torch.tensor([40, 3, 7, 0, 63, 12, 3])
    d2t, t2d = vocab_mapping(ids, 64)
    uniq = sorted(set(ids.tolist()))
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool and d2t.numel() == len(uniq)
    assert [i + int(d2t[i]) for i in range(d2t.numel())] == uniq
    assert t2d.nonzero().flatten().tolist() == uniq
    stream = torch.tensor([5, 5, 5, 9, 9, 1, 2, 2, 2, 2])
    assert frequent_tokens(stream, 16, 3).tolist() == [2, 5, 9]
    # the drafter's target-vocabulary logits put draft id i at target id i + d2t[i]
    target = tiny_target(layers=4)
    draft = make_draft(target, [1, 2, 3], "reference", ids)
    f = torch.randn(5, 32)
    small = draft.draft_logits(f)
    full = draft.logits(f, target.lm_head)
    for i in range(d2t.numel()):
        torch.testing.assert_close(full[:, i + int(d2t[i])], small[:, i])
    assert torch.isinf(full[:, ~t2d]).all() and torch.isfinite(full[:, t2d]).all()
    # EAGLE-2 reduced: the target's head restricted to the draft rows
    d1 = make_draft(target, None, "reference", ids)
    torch.testing.assert_close(d1.logits(f, target.lm_head)[:, t2d], target.lm_head(f)[:, t2d])


# the chain (slow): sampled chains are covered in tests/test_accept.py and tests/test_decode.py
@pytest.mark.parametrize("chain", [pytest.param(True, marks=pytest.mark.slow), False])
def test_reduced_vocabulary_sampling_is_lossless(chain):
    """q lives on the draft vocabulary (zero elsewhere); the target's own tokens outside it must still come out
    at their exact rate. As tests/test_eagle.py: the empirical joint of the 2nd and 3rd generated tokens."""
    target = tiny_target(layers=4, vocab=16, seed=2, logit_scale=40.0)
    prompt = torch.tensor([3, 7, 1, 12, 5])
    exact = _exact_joint(target, prompt)
    torch.manual_seed(0)
    vocab = torch.tensor([1, 2, 4, 5, 8, 9, 10, 14])  # leaves out 7, the target's favourite 3rd token, and 6
    draft = make_draft(target, [1, 2, 3], "reference", vocab)
    with torch.no_grad():
        draft.lm_head.weight.mul_(0.1)  # a flat q over the draft vocabulary, so that drafts get accepted
    drafter = EagleDrafter(target, draft, max_depth=3, top_k=1 if chain else 3, max_nodes=6)
    n = 1500
    counts = torch.zeros(16, 16)
    drafted = 0
    for s in range(n):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=4, sampling=Sampling(temperature=1.0),
                       eos_token_id=[], seed=s)
        counts[out.tokens[1], out.tokens[2]] += 1
        drafted += sum(st.accepted for st in out.stats.decode_steps)
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    outside = exact.sum(0)[[0, 3, 6, 7, 11, 12, 13, 15]].sum().item()
    assert outside > 0.3 and drafted > n // 4  # tokens outside the draft vocabulary matter; drafts get accepted
    assert tv < 0.07, tv  # measured 0.03 here


# ----------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny corpus, tokenizer and peaked target saved like a real one."""
    from tests.parallel_common import make_tiny_run

    return make_tiny_run(tmp_path_factory.mktemp("formats_train"), layers=4)


def test_train_reference_eagle3_lowers_loss_and_exports(tiny_run, tmp_path):
    from draftkit.train import eagle as train_eagle

    out = tmp_path / "run"
    report = train_eagle.main([
        "--target", str(tiny_run / "target"), "--corpus", str(tiny_run / "corpus.txt"), "--cache_dir",
        str(tiny_run / "cache"), "--seq_len", "32", "--batch_size", "8", "--max_steps", "24", "--warmup_steps", "2",
        "--lr", "3e-3", "--eval_every", "1000", "--eval_blocks", "4", "--eval_tau_prompts", "1", "--eval_new_tokens",
        "8", "--output_dir", str(out), "--wandb", "false", "--layout", "reference", "--feature_layers", "[1, 2, 3]",
        "--ttt_steps", "2", "--feature_loss_weight", "0", "--token_loss_weight", "1.0", "--draft_vocab_size", "64"])
    hist = report["history"]
    first = sum(h["token_loss_0"] for h in hist[:3]) / 3
    last = sum(h["token_loss_0"] for h in hist[-3:]) / 3
    assert last < first - 0.1, (first, last)
    assert report["layout"] == "reference" and report["draft_vocab_size"] == 64 and report["tau"] >= 1.0
    final = out / "final"
    assert detect(str(final)) == "draftkit-eagle-reference"
    target = LlamaForCausalLM.from_pretrained(str(tiny_run / "target"))
    drafter = EagleDrafter.from_pretrained(str(final), target)
    assert isinstance(drafter.draft, Eagle3Draft) and drafter.draft.draft_vocab == 64
    assert export_main([str(final), "--format", "vllm", "--out", str(tmp_path / "exp")]) == 0


def test_reference_training_time_test_matches_chain_decoding(target8):
    """Unrolled step i of the reference EAGLE-3 loss is what decoding computes for the depth-i chain node:
    same cache, masks and positions, the draft's own pre-norm output fed back, the reduced vocabulary."""
    torch.manual_seed(0)
    draft = make_draft(target8, [2, 4, 6], "reference", DRAFT_IDS)
    ids = torch.randint(0, 64, (2, 10))
    preds, res, feats = unroll_training_time_test(draft, target8, ids)
    assert len(preds) == 3 and torch.isfinite(res["loss"]) and {"acc_2", "token_loss_2"} <= set(res)
    assert_unrolled_steps_are_chain_decoding(draft, target8, ids, feats, preds, draft.cache_config)
