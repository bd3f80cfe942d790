"""DFlash (drafters/dflash.py, train/dflash_loss.py, train/dflash.py): lossless greedy and sampled decoding with
random drafts, one draft forward per step, the context cache equals a recomputation, training equals decoding,
a few training steps lower the loss, the not-shipped message."""
from __future__ import annotations

import pytest
import torch

from draftkit.drafters.dflash import ContextCache, DFlashDrafter, default_target_layers, make_dflash_draft
from draftkit.train.dflash_loss import DFlashLoss, block_mask, pick_anchors
from tests.parallel_common import (PROMPTS, VE, assert_follows, assert_greedy_equal, early_late, exact_tokens_2_3,
                                   forwards_per_drafting_step, make_tiny_run, sampled_counts, shifted_q, tiny_target,
                                   train_argv)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=4, seed=0)


def random_draft(target, seed=1, block=5, layers=2):
    torch.manual_seed(seed)
    return make_dflash_draft(target, block_size=block, mask_token_id=5, draft_layers=layers, target_layers=[1, 3])


@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("budget", ["fixed", "auto"])
def test_greedy_matches_plain(target, top_k, budget):
    drafter = DFlashDrafter(target, random_draft(target), max_depth=4, max_nodes=10, top_k=top_k)
    assert_greedy_equal(target, drafter, budget)


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["fixed", "auto"])
def test_greedy_matches_plain_on_the_shipped_target(budget):
    from draftkit.models import load_model

    zoo = load_model()
    torch.manual_seed(0)
    draft = make_dflash_draft(zoo, block_size=9, mask_token_id=0, draft_layers=3)
    assert draft.config.target_layers == [2, 12, 22]  # z-lab's spread for 3 draft layers of 24 (ids 1, 11, 21)
    prompts = [torch.tensor([11, 40, 7, 300, 21, 9])]
    assert_greedy_equal(zoo, DFlashDrafter(zoo, draft, max_depth=8, max_nodes=12, top_k=2), budget, (5, 20), prompts)


def test_default_target_layers_follow_zlab():
    # z-lab build_target_layer_ids(36, 5) = [1, 9, 17, 25, 33]; ours are hidden_states indices (id + 1)
    assert default_target_layers(36, 5) == [2, 10, 18, 26, 34]
    assert default_target_layers(24, 1) == [13]


@pytest.mark.parametrize("top_k", [1, 3])
def test_one_draft_forward_per_step(target, top_k):
    drafter = DFlashDrafter(target, random_draft(target), max_depth=4, max_nodes=12, top_k=top_k)
    per_step = forwards_per_drafting_step(target, drafter, drafter.draft, PROMPTS[1])
    assert per_step and set(per_step) == {1}, per_step


def test_context_cache_equals_recomputation(target):
    """After several steps, the block logits from the incremental cache equal one forward over the whole
    committed context from scratch."""
    draft = random_draft(target).eval()
    drafter = DFlashDrafter(target, draft, max_depth=4, max_nodes=8, top_k=2)
    seen = []
    propose = drafter.propose

    def recording(state):
        tree = propose(state)
        seen.append(state.tokens.clone())
        return tree
    drafter.propose = recording
    from draftkit.verify.decode import generate

    out = generate(target, PROMPTS[2], drafter=drafter, max_new_tokens=12, eos_token_id=[], budget="fixed")
    tokens = seen[-1]
    root = tokens.numel() - 1
    assert drafter.cache.lengths == [root]
    with torch.no_grad():
        hs = target(input_ids=tokens[None, :root], output_hidden_states=True).hidden_states
        feats = draft.fuse([hs[k] for k in draft.config.target_layers])
        block = torch.full((1, 5), 5)
        block[0, 0] = tokens[-1]
        emb = target.get_input_embeddings()
        fresh = draft(emb(block), torch.arange(root, root + 5)[None], feats, torch.arange(root)[None])
        cached = draft(emb(block), torch.arange(root, root + 5)[None], feats[:, :0], torch.arange(root, root)[None],
                       drafter.cache)
    torch.testing.assert_close(cached, fresh, atol=1e-5, rtol=1e-5)
    assert out.stats.tau >= 1.0


def test_context_cache_grows_without_losing_entries():
    cache = ContextCache(num_layers=1)
    k = torch.randn(1, 2, 100, 4)
    for a, b in ((0, 3), (3, 70), (70, 100)):
        full_k, _ = cache.append(0, k[:, :, a:b], k[:, :, a:b])
    torch.testing.assert_close(full_k, k)
    assert cache.nbytes() == 2 * cache.k[0].numel() * 4 >= 2 * k.numel() * 4  # keys and values, fp32, grown


def test_max_depth_beyond_the_block_is_an_error(target):
    with pytest.raises(ValueError, match="block_size - 1 = 4"):
        DFlashDrafter(target, random_draft(target), max_depth=5)


def sampling_pair(seed=0):
    target = tiny_target(layers=4, vocab=VE, hidden=32, seed=seed, logit_scale=4.0)
    torch.manual_seed(seed + 1)
    draft = make_dflash_draft(target, block_size=3, mask_token_id=5, draft_layers=1, target_layers=[2])
    with torch.no_grad():  # q peaked through the target's head: a wrong rule then shows
        draft.norm.weight.mul_(6.0)
    return target, draft


@pytest.mark.parametrize("top_k, rule", [(3, "exact"), pytest.param(1, "exact", marks=pytest.mark.slow),
                                         pytest.param(1, "shifted q", marks=pytest.mark.slow)])
def test_sampling_follows_the_target(top_k, rule):
    """The joint of the 2nd and 3rd sampled tokens matches the target's exact joint; a wrong q fails."""
    target, draft = sampling_pair()
    prompt = torch.tensor([1, 2, 3, 1, 2])
    exact = exact_tokens_2_3(target, prompt)
    drafter = DFlashDrafter(target, draft, max_depth=2, max_nodes=6, top_k=top_k)
    counts, accepted = sampled_counts(target, prompt, drafter if rule == "exact" else shifted_q(drafter), 1200)
    assert_follows(counts, exact, accepted, rule == "exact")


def test_training_forward_equals_decoding(target):
    """A training block at anchor a gives exactly the logits of the decoding forward whose context is
    positions < a and whose root is x_a."""
    draft = random_draft(target).eval()
    ids = torch.tensor([[3, 17, 42, 8, 8, 61, 0, 9, 12, 30, 4, 4]])
    t = ids.shape[1]
    hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    feats = draft.fuse([hs[k] for k in draft.config.target_layers])
    anchors = torch.tensor([[1, 4, 7]])
    where = (anchors[:, :, None] + torch.arange(5)).flatten(1)
    tokens = torch.full_like(where, 5)
    tokens[:, ::5] = ids.gather(1, anchors)
    emb = target.get_input_embeddings()
    with torch.no_grad():
        train = draft(emb(tokens), where, feats, torch.arange(t)[None], mask=block_mask(anchors, t, 5))[0]
        for i, a in enumerate(anchors[0].tolist()):
            dec = draft(emb(tokens[:, 5 * i:5 * i + 5]), where[:, 5 * i:5 * i + 5], feats[:, :a],
                        torch.arange(a)[None])[0]
            torch.testing.assert_close(train[5 * i:5 * i + 5], dec, atol=1e-5, rtol=1e-5)


def test_anchors_prefer_trained_positions():
    mask = torch.zeros(2, 40, dtype=torch.bool)
    mask[:, 20:] = True
    anchors = pick_anchors(mask, 5, 6, torch.Generator().manual_seed(0))
    assert anchors.shape == (2, 6) and bool((anchors >= 19).all()) and bool((anchors <= 35).all())


def test_loss_is_finite_and_reports_slots(target):
    draft = random_draft(target)
    ids = torch.randint(0, 64, (2, 20))
    hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    res = DFlashLoss(draft, target, anchors=4)(ids, torch.ones_like(ids, dtype=torch.bool),
                                                {k: hs[k] for k in (1, 3)}, hs[-1])
    assert torch.isfinite(res["loss"]) and {"acc_1", "acc_4", "accepted_length"} <= set(res)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("dflash_train"), layers=4)


def test_training_lowers_the_loss(tiny_run):
    from transformers import AutoModelForCausalLM

    from draftkit.train import dflash as train_dflash

    out = tiny_run / "run"
    report = train_dflash.main(train_argv(tiny_run, out, 24, "--block_size", "4", "--draft_layers", "1",
                                          "--anchors", "8"))
    first, last = early_late(report["history"], "loss")
    assert last < first - 0.1, (first, last)
    assert len(report["heldout_top1_by_slot"]) == 3 and report["tau"] >= 1.0
    target = AutoModelForCausalLM.from_pretrained(str(tiny_run / "target"))
    drafter = DFlashDrafter.from_pretrained(str(out / "final"), target, max_depth=3)
    assert drafter.draft.config.block_size == 4
    # the tree temperature fitted at the end (train/calibrate.py), or 1.0 with why when there was nothing to fit on
    assert drafter.tree_temperature == report["tree_temperature"] and "tree_temperature_fit" in report
    # --init_from continues the trained draft: its first loss is the trained one's, not a new draft's
    more = train_dflash.main(train_argv(tiny_run, tiny_run / "more", 4, "--block_size", "4", "--draft_layers", "1",
                                        "--anchors", "8", "--init_from", str(out / "final")))
    assert more["history"][0]["loss"] < report["history"][0]["loss"] - 0.1
    # and counts the tokens its starting draft had seen: tokens_seen is the draft's total
    assert more["tokens_seen_before"] == report["tokens_seen"] > 0 and report["tokens_seen_before"] == 0
    assert more["tokens_seen"] > report["tokens_seen"]
    from draftkit.train.config import TrainError
    with pytest.raises(TrainError, match="has block 4, 1 layer"):  # another shape is named, in one line
        train_dflash.main(train_argv(tiny_run, tiny_run / "bad", 4, "--block_size", "5", "--draft_layers", "1",
                                     "--init_from", str(out / "final")))


def test_not_shipped_is_one_line(target, monkeypatch):
    import draftkit as dk
    from draftkit.zoo import ZooError

    monkeypatch.setattr("draftkit.zoo.available", lambda zoo=None: ["target"])
    for name, recipe in (("dflash", "recipes/dflash/dflash.yaml"), ("peagle", "recipes/eagle/peagle.yaml")):
        with pytest.raises(ZooError) as err:
            dk.make_drafter(name, target)
        assert "\n" not in str(err.value) and "is shipped yet" in str(err.value) and recipe in str(err.value)
