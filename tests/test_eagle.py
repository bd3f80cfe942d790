"""EAGLE drafter and its training recipe, on tiny random Llama targets (no downloads).

The "oracle" draft copies a one-layer target: fc passes the token embedding through
(features ignored), the draft layer and final norm are the target's. It then predicts
the target's next feature almost exactly (it only misses the first prompt token, which
it never sees as an input), so it accepts deep and exercises multi-token cache updates.
"""
from __future__ import annotations

import glob
import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.drafters.eagle import EagleConfig, EagleDraftModel, EagleDrafter
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate as _generate
from draftkit.verify.tree import path_slots
from tests.models import config_model


def generate(*args, **kwargs):
    """The loop with the drafter's fixed cap every step: these tests check drafting itself, not the controller."""
    return _generate(*args, **{"budget": "fixed", **kwargs})

torch.set_num_threads(1)


def tiny_target(layers=2, vocab=64, hidden=32, seed=0, logit_scale=1.0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).eval()
    if logit_scale != 1.0:  # a peaked target, so that text and acceptance depend on the draft
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


def oracle_draft(target, feature_layers=None, feature_mix: float = 0.0) -> EagleDraftModel:
    """feature_mix > 0 adds a random share of the input feature, so that the features matter (a wrong
    feature / token pairing then shows) while the draft still accepts often."""
    assert target.config.num_hidden_layers == 1
    torch.manual_seed(1)
    draft = EagleDraftModel.from_target(target, feature_layers, init_from_target=True)
    h = target.config.hidden_size
    with torch.no_grad():
        draft.fc.weight.zero_()
        draft.fc.bias.zero_()
        draft.fc.weight[:, :h] = torch.eye(h)  # input = [emb; feature] -> emb
        draft.fc.weight[:, h:] = feature_mix * torch.randn(h, h) / h ** 0.5
    return draft


@pytest.fixture(scope="module")
def target2():
    return tiny_target(layers=2, seed=0)


@pytest.fixture(scope="module")
def target1():
    return tiny_target(layers=1, seed=3, logit_scale=20.0)


PROMPTS = [torch.tensor([5]), torch.tensor([3, 17, 42, 8, 8, 61, 0, 9]), torch.arange(20) % 7 + 30]


# --- (1) greedy output equals plain greedy decoding ----------------------------------------------------

@pytest.mark.parametrize("kind", ["tree", "chain", "eagle3-tree", "eagle3-chain"])
def test_greedy_matches_plain_random_draft(target2, kind):
    torch.manual_seed(7)
    layers = [0, 1, -1] if kind.startswith("eagle3") else None
    draft = EagleDraftModel.from_target(target2, layers)
    drafter = EagleDrafter(target2, draft, max_depth=4, top_k=1 if kind.endswith("chain") else 3, max_nodes=10)
    for prompt in PROMPTS:
        for n in (1, 6, 17):
            ref = generate(target2, prompt, max_new_tokens=n, eos_token_id=[])
            out = generate(target2, prompt, drafter=drafter, max_new_tokens=n, eos_token_id=[])
            assert out.tokens.tolist() == ref.tokens.tolist(), (kind, prompt.tolist(), n)


@pytest.mark.parametrize("model_type, extra", [("gpt2", {}), ("falcon", {}), ("gemma4_text", {"head_dim": 8})])
def test_targets_without_a_one_layer_body_get_a_llama_layer(model_type, extra):
    """GPT-2-style bodies (no `.layers` list) and Gemma 4 (layers that read per-layer token embeddings) have no
    one-layer model that runs on embeddings alone: the draft is a Llama layer of the target's width, and drafts
    losslessly, EAGLE-1/2 and EAGLE-3 alike."""
    target = config_model(model_type, num_hidden_layers=3, **extra)
    prompt = PROMPTS[2]
    ref = generate(target, prompt, max_new_tokens=12, eos_token_id=[]).tokens.tolist()
    for layers in (None, [0, 1, -1]):
        draft = EagleDraftModel.from_target(target, layers)
        assert draft.config.layer_config["model_type"] == "llama"
        out = generate(target, prompt, drafter=EagleDrafter(target, draft, max_depth=3, top_k=2, max_nodes=6),
                       max_new_tokens=12, eos_token_id=[])
        assert out.tokens.tolist() == ref, (model_type, layers)


def test_a_target_with_a_one_layer_body_keeps_its_own_architecture(target2):
    assert EagleDraftModel.from_target(target2).config.layer_config["model_type"] == "llama"
    qwen = config_model("qwen3")
    assert EagleDraftModel.from_target(qwen).config.layer_config["model_type"] == "qwen3"


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("layers", [None, [0, 1]])
def test_greedy_matches_plain_oracle_deep_accepts(target1, chain, layers):
    drafter = EagleDrafter(target1, oracle_draft(target1, layers), max_depth=5, top_k=1 if chain else 4, max_nodes=16)
    deep = 0
    for prompt in PROMPTS:
        for n in (2, 9, 23):  # budgets that end mid-draft
            ref = generate(target1, prompt, max_new_tokens=n, eos_token_id=[])
            out = generate(target1, prompt, drafter=drafter, max_new_tokens=n, eos_token_id=[])
            assert out.tokens.tolist() == ref.tokens.tolist(), (chain, prompt.tolist(), n)
            deep += sum(s.accepted >= 2 for s in out.stats.decode_steps)
    assert deep > 0  # the comparison covered multi-token accepts


# --- (2) the draft KV cache: incremental state equals a from-scratch recomputation ---------------------

class Recorder(EagleDrafter):
    """Keeps, per proposal, the committed tokens, the draft features it computed and the tree."""

    def reset(self, prompt):
        super().reset(prompt)
        self.log = getattr(self, "log", [])

    def propose(self, state):
        tree = super().propose(state)
        if len(tree):
            self.log.append((state.tokens.clone(), self.bank.clone(), tree))
        return tree


@torch.no_grad()
def _from_scratch(target, draft, tokens, path_tokens):
    """(f^ at the root, f^ at the end of the draft path) computed with no cache at all: a full target
    forward over the committed tokens, then the draft over every pair, re-run per path node."""
    embed = target.get_input_embeddings()
    hs = target(input_ids=tokens[None, :-1], output_hidden_states=True).hidden_states
    raw = draft.select(hs)[0]
    feats = draft.fuse(raw) if draft.fuse is not None else raw  # (T - 1, H)
    toks = tokens[1:]
    out = draft(feats[None], embed(toks)[None])[0, -1]
    root = out
    for tok in path_tokens:  # the node goes in as (f^_parent, token)
        feats = torch.cat([feats, out[None]])
        toks = torch.cat([toks, torch.tensor([tok])])
        out = draft(feats[None], embed(toks)[None])[0, -1]
    return root, out


@pytest.mark.parametrize("chain", [False, True])
@pytest.mark.parametrize("layers", [None, [0, 1]])
@pytest.mark.parametrize("greedy", [True, False])
def test_draft_cache_matches_recomputation(target1, chain, layers, greedy):
    draft = oracle_draft(target1, layers, feature_mix=0.01)
    drafter = Recorder(target1, draft, max_depth=4, top_k=1 if chain else 3, max_nodes=9)
    sampling = Sampling() if greedy else Sampling(temperature=1.0)
    deepest = 0
    for prompt in PROMPTS[:2]:
        out = generate(target1, prompt, drafter=drafter, max_new_tokens=20, sampling=sampling, eos_token_id=[], seed=1)
        stats = out.stats
        assert stats.new_tokens == 20 and len(out.tokens) == 20
        for s in stats.decode_steps:
            assert s.accepted <= s.depth <= 4 and s.drafted <= (4 if chain else 9)
            assert s.committed == s.accepted + 1 or s is stats.steps[-1]
        assert stats.tau == pytest.approx(sum(s.accepted + 1 for s in stats.decode_steps) / len(stats.decode_steps))
        deepest = max([deepest] + [s.accepted for s in stats.decode_steps])
    assert drafter.log and max(len(t) for _, _, t in drafter.log) > 1
    assert deepest >= 2  # updates after multi-token accepts are covered
    checked = 0
    for tokens, bank, tree in drafter.log[:12]:
        for node in range(len(tree)):
            entry = tree.extra[node]
            if entry < 0:
                continue
            path = path_slots(tree, node)
            root, feat = _from_scratch(target1, draft, tokens, tree.tokens[path].tolist())
            torch.testing.assert_close(bank[0], root, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(bank[entry + 1], feat, atol=1e-4, rtol=1e-4)
            checked += 1
    assert checked > 5


@pytest.mark.parametrize("chain", [False, True])
def test_oracle_draft_accepts_deep(target1, chain):
    drafter = EagleDrafter(target1, oracle_draft(target1), max_depth=4, top_k=1 if chain else 4, max_nodes=16)
    stats = None
    for prompt in PROMPTS[1:]:
        out = generate(target1, prompt, drafter=drafter, max_new_tokens=40, eos_token_id=[])
        stats = out.stats if stats is None else stats.merge(out.stats)
    assert stats.tau > 3.0, stats.summary()  # 5.0 at most (depth 4 + bonus)
    assert stats.acceptance_by_depth()[0] > 0.8


# --- (3) sampling through the tree and the sampled chain follows the target exactly --------------------

@torch.no_grad()
def _exact_joint(target, prompt):
    """p(x2, x3 | prompt) of the 2nd and 3rd generated tokens, summed over the 1st (brute force)."""
    v = target.config.vocab_size
    p1 = target(prompt[None]).logits[0, -1].softmax(-1)
    ctx2 = torch.cat([prompt.repeat(v, 1), torch.arange(v)[:, None]], 1)
    p2 = target(ctx2).logits[:, -1].softmax(-1)  # [x1, x2]
    ctx3 = torch.cat([prompt.repeat(v * v, 1), torch.arange(v).repeat_interleave(v)[:, None],
                      torch.arange(v).repeat(v)[:, None]], 1)
    p3 = target(ctx3).logits[:, -1].softmax(-1).view(v, v, v)  # [x1, x2, x3]
    return (p1[:, None, None] * p2[:, :, None] * p3).sum(0)


# the chain (slow): sampled chains are covered in tests/test_accept.py and tests/test_decode.py
@pytest.mark.parametrize("chain", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_sampling_is_lossless(chain):
    """The 1st token comes from the prefill; with 4 new tokens the first draft step is a depth-2 tree
    (or chain) that decides the 2nd and 3rd. Their empirical joint over N seeds must match the exact
    target joint. Bound 0.07: correct sampling measures 0.03 here; resampling from p instead of the
    residual after a rejection measures 0.09 (chain) and 0.13 (tree)."""
    target = tiny_target(layers=1, vocab=16, seed=0, logit_scale=90.0)
    prompt = torch.tensor([3, 7, 1, 12, 5])
    exact = _exact_joint(target, prompt)
    drafter = EagleDrafter(target, oracle_draft(target), max_depth=3, top_k=1 if chain else 4, max_nodes=8)
    n = 2000
    counts = torch.zeros(16, 16)
    for s in range(n):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=4, sampling=Sampling(temperature=1.0),
                       eos_token_id=[], seed=s)
        counts[out.tokens[1], out.tokens[2]] += 1
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    assert tv < 0.07, tv


# --- (5) files and mismatched targets -------------------------------------------------------------------

def test_save_load_roundtrip(tmp_path, target2):
    torch.manual_seed(0)
    draft = EagleDraftModel.from_target(target2, [0, 1, -1])
    draft.save_pretrained(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["hidden_size"] == 32 and cfg["vocab_size"] == 64 and cfg["num_target_layers"] == 2
    assert cfg["feature_layers"] == [0, 1, 2] and (tmp_path / "model.safetensors").exists()
    drafter = EagleDrafter.from_pretrained(str(tmp_path), target2, max_depth=3, top_k=2, max_nodes=6)
    loaded = drafter.draft
    assert next(loaded.parameters()).dtype == torch.float32
    assert not any(k.startswith("embed") or "lm_head" in k for k in loaded.state_dict())
    for k, v in draft.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v.half().float())
    ref = generate(target2, PROMPTS[1], max_new_tokens=8, eos_token_id=[])
    assert generate(target2, PROMPTS[1], drafter=drafter, max_new_tokens=8, eos_token_id=[]).tokens.equal(ref.tokens)


@pytest.mark.parametrize("other", [dict(hidden=48), dict(vocab=80), dict(layers=3)])
def test_mismatched_target_raises(tmp_path, target2, other):
    draft = EagleDraftModel.from_target(target2)
    draft.config.target_name = "tiny-target-A"
    draft.save_pretrained(str(tmp_path))
    wrong = tiny_target(**{"layers": 2, **other})
    wrong.config._name_or_path = "tiny-target-B"
    with pytest.raises(ValueError, match="tiny-target-A.*tiny-target-B"):
        EagleDrafter.from_pretrained(str(tmp_path), wrong)
    with pytest.raises(ValueError, match="mismatch"):
        EagleDrafter(wrong, draft)


def test_bad_feature_layers(target2):
    with pytest.raises(ValueError, match="out of range"):
        EagleConfig.from_target(target2, [0, 5])


# --- (4), (6) the training recipe -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A tiny corpus, tokenizer and peaked target saved like a real one."""
    from tests.parallel_common import make_tiny_run

    return make_tiny_run(tmp_path_factory.mktemp("eagle_train"), layers=2)


def _argv(root, out, steps, *extra):
    return ["--target", str(root / "target"), "--corpus", str(root / "corpus.txt"), "--cache_dir", str(root / "cache"),
            "--seq_len", "32", "--batch_size", "8", "--max_steps", str(steps), "--warmup_steps", "2", "--lr", "3e-3",
            "--eval_every", "1000", "--eval_blocks", "4", "--eval_tau_prompts", "0", "--output_dir", str(out),
            "--train_rows", "64", "--shard_rows", "32", *extra]


def test_training_lowers_losses_and_logs(tiny_run, monkeypatch):
    from draftkit.train import eagle as train_eagle

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tiny_run))
    out = tiny_run / "run_eagle2"
    report = train_eagle.main(_argv(tiny_run, out, 30, "--eval_tau_prompts", "1", "--eval_new_tokens", "8"))
    hist = report["history"]
    first = {k: sum(h[k] for h in hist[:3]) / 3 for k in ("token_loss_0", "feature_loss_0")}
    last = {k: sum(h[k] for h in hist[-3:]) / 3 for k in ("token_loss_0", "feature_loss_0")}
    assert last["token_loss_0"] < first["token_loss_0"] - 0.05, (first, last)
    assert last["feature_loss_0"] < first["feature_loss_0"] * 0.9, (first, last)
    assert glob.glob(str(out / "wandb" / "offline-run-*"))
    final = out / "final"
    assert (final / "config.json").exists() and (final / "model.safetensors").exists()
    assert json.loads((final / "train_report.json").read_text())["steps"] == 30
    assert 0 <= report["heldout_top1"] <= 1 and report["tau"] >= 1.0
    target = LlamaForCausalLM.from_pretrained(str(tiny_run / "target"))
    drafter = EagleDrafter.from_pretrained(str(final), target)
    # the tree temperature fitted at the end (train/calibrate.py), or 1.0 with why when there was nothing to fit on
    assert drafter.tree_temperature == report["tree_temperature"] and "tree_temperature_fit" in report


def test_training_eagle3_ttt(tiny_run):
    from draftkit.train import eagle as train_eagle

    report = train_eagle.main(_argv(tiny_run, tiny_run / "run_eagle3", 6, "--wandb", "false", "--feature_layers",
                                    "[0, 1, -1]", "--ttt_steps", "3", "--feature_loss_weight", "0",
                                    "--token_loss_weight", "1.0", "--data_mode", "cached", "--regenerate", "true",
                                    "--train_rows", "8", "--shard_rows", "4", "--regen_prompt_len", "8"))
    assert len(report["heldout_top1_by_step"]) == 3 and report["feature_layers"] == [0, 1, 2]
    assert {"acc_0", "acc_1", "acc_2"} <= set(report["history"][-1])
    # one folder per layer, one file per shard of 4 rows (other tests' caches read only the last layer)
    (feats,) = [d for d in glob.glob(str(tiny_run / "cache" / "feats-*")) if os.path.isdir(os.path.join(d, "L0"))]
    assert sorted(os.listdir(feats)) == ["L0", "L1", "L2", "top"] and len(os.listdir(os.path.join(feats, "L2"))) == 2


def test_resume_continues_at_the_right_step(tiny_run, monkeypatch):
    from draftkit.train import eagle as train_eagle

    args = ("--wandb", "false", "--checkpoint_every", "2")
    full = train_eagle.main(_argv(tiny_run, tiny_run / "full", 4, *args))

    from draftkit.train.targetdata import TargetData

    real_batch = TargetData.batch

    def crash_at_3(self, step):
        if step == 3:
            raise KeyboardInterrupt("simulated interruption")
        return real_batch(self, step)

    monkeypatch.setattr(TargetData, "batch", crash_at_3)
    with pytest.raises(KeyboardInterrupt):
        train_eagle.main(_argv(tiny_run, tiny_run / "cut", 4, *args))
    monkeypatch.setattr(TargetData, "batch", real_batch)
    resumed = train_eagle.main(_argv(tiny_run, tiny_run / "cut", 4, *args))
    assert full["resumed_from"] == 0 and resumed["resumed_from"] == 2
    assert [h["loss"] for h in resumed["history"]] == pytest.approx([h["loss"] for h in full["history"][2:]], rel=1e-5)


def unroll_training_time_test(draft, target, ids):
    """EagleLoss's 3-step training-time test on `ids`: (each unrolled step's draft outputs, the loss dict, the
    draft's input features)."""
    from types import SimpleNamespace

    from draftkit.train.eagle import EagleLoss

    cfg = SimpleNamespace(ttt_steps=3, ttt_decay=0.8, feature_loss_weight=0.0, token_loss_weight=1.0, feature_noise=0.0,
                          acceptance_loss=0.0)
    loss_fn = EagleLoss(draft, target, cfg)
    with torch.no_grad():
        hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    feats = draft.select(hs)
    preds, forward = [], draft.forward
    draft.forward = lambda *a, **k: preds.append(forward(*a, **k)) or preds[-1]
    try:
        res = loss_fn(ids, feats, hs[-1], noise=False)
    finally:
        del draft.forward
    return preds, res, feats


def assert_unrolled_steps_are_chain_decoding(draft, target, ids, feats, preds, cache_config):
    """Unrolled step i at index t equals the depth-i chain node decoded off the committed pairs 0..t (true
    tokens, the draft's own features), run with a decoding cache of `cache_config`."""
    from transformers import DynamicCache

    embed = target.get_input_embeddings()
    n = ids.shape[1]
    with torch.no_grad():
        for b in range(ids.shape[0]):
            for t in range(n - 1):
                cache = DynamicCache(config=cache_config)
                f = draft(feats[b:b + 1, :t + 1], embed(ids[b:b + 1, 1:t + 2]), cache=cache)[:, -1:]
                torch.testing.assert_close(f[0, 0], preds[0][b, t].detach(), atol=1e-5, rtol=1e-5)
                for i in (1, 2):
                    if t + 1 + i >= n:
                        break
                    f = draft(f, embed(ids[b:b + 1, t + 1 + i:t + 2 + i]), cache=cache)[:, -1:]
                    torch.testing.assert_close(f[0, 0], preds[i][b, t].detach(), atol=1e-5, rtol=1e-5)


def test_training_time_test_matches_chain_decoding(target2):
    """Unrolled step i at index t must be exactly what decoding computes for the depth-i chain node hanging
    off the committed pairs 0..t (true tokens, the draft's own features): same cache, mask and positions."""
    torch.manual_seed(0)
    draft = EagleDraftModel.from_target(target2, [0, 1, -1])
    ids = torch.randint(0, 64, (2, 12))
    preds, res, feats = unroll_training_time_test(draft, target2, ids)
    assert len(preds) == 3 and {"acc_2", "token_loss_2"} <= set(res)
    assert_unrolled_steps_are_chain_decoding(draft, target2, ids, feats, preds, draft.body.config)


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_acceptance_loss_is_the_log_of_the_draws_pass_chance_mixed_with_cross_entropy(target2, share):
    """acceptance_loss = lambda: the token loss is (1 - lambda) CE(p, q) - lambda log(sum_x min(p(x), q(x))), p the
    target's next-token distribution, q the draft's, each computed here from the two models directly; the pass
    chance is reported (overlap_0) whatever lambda, and the mixed loss carries a gradient to the draft."""
    from types import SimpleNamespace

    from draftkit.train.eagle import EagleLoss

    torch.manual_seed(0)
    draft = EagleDraftModel.from_target(target2, [])
    cfg = SimpleNamespace(ttt_steps=1, ttt_decay=0.8, feature_loss_weight=0.0, token_loss_weight=1.0,
                          feature_noise=0.0, acceptance_loss=share)
    loss_fn = EagleLoss(draft, target2, cfg)
    ids = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        hs = target2(input_ids=ids, output_hidden_states=True).hidden_states
    feats = draft.select(hs)
    res = loss_fn(ids, feats, hs[-1], noise=False)
    head = target2.get_output_embeddings()
    with torch.no_grad():
        p = head(hs[-1][:, 1:]).softmax(-1)  # (2, 9, V): the target's next token after each pair
        q = head(draft(feats[:, :-1], target2.get_input_embeddings()(ids[:, 1:]))).softmax(-1)
    passes = torch.minimum(p, q).sum(-1)
    ce = -(p * q.log()).sum(-1)
    torch.testing.assert_close(res["overlap_0"], passes.mean(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res["token_loss_0"], ((1 - share) * ce - share * passes.log()).mean(),
                               atol=1e-5, rtol=1e-5)
    res["loss"].backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in draft.parameters() if w.requires_grad)


def test_acceptance_loss_out_of_range_is_refused(tiny_run, capsys):
    from draftkit.train import eagle as train_eagle

    with pytest.raises(SystemExit):
        train_eagle.main(_argv(tiny_run, tiny_run / "x", 2, "--acceptance_loss", "1.5"))
    assert "acceptance_loss must be a share in [0, 1], got 1.5" in capsys.readouterr().err
