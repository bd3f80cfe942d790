"""P-EAGLE (drafters/peagle.py, train/peagle_loss.py): lossless greedy and sampled decoding with random drafts,
one draft forward per step, training equals decoding, a few training steps lower the loss."""
from __future__ import annotations

import pytest
import torch

from draftkit.drafters.eagle import EagleDrafter
from draftkit.drafters.eagle_reference import make_draft
from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
from draftkit.train.peagle_loss import cod_anchors, layout
from tests.parallel_common import (PROMPTS, VE, assert_follows, assert_greedy_equal, early_late, exact_tokens_2_3,
                                   forwards_per_drafting_step, make_tiny_run, shifted_q, sampled_counts, tiny_target,
                                   train_argv)

torch.set_num_threads(1)
LAYERS = [1, 2, 3]  # a 4-layer target: the residual streams entering layers 1, 2, 3


@pytest.fixture(scope="module")
def target():
    return tiny_target(layers=4, seed=0)


def random_draft(target, seed=1, draft_ids=None, layers=LAYERS):
    torch.manual_seed(seed)
    return make_peagle_draft(target, layers, mask_token_id=5, draft_ids=draft_ids)


@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("budget", ["fixed", "auto"])
def test_greedy_matches_plain(target, top_k, budget):
    drafter = PEagleDrafter(target, random_draft(target), max_depth=4, max_nodes=10, top_k=top_k)
    assert_greedy_equal(target, drafter, budget)


def test_greedy_matches_plain_reduced_vocabulary(target):
    draft = random_draft(target, draft_ids=torch.arange(0, 64, 2))  # half the vocabulary: d2t / t2d in play
    assert_greedy_equal(target, PEagleDrafter(target, draft, max_depth=3, max_nodes=8, top_k=2), "fixed")


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["fixed", "auto"])
def test_greedy_matches_plain_on_the_shipped_target(budget):
    from draftkit.models import load_model

    zoo = load_model()
    torch.manual_seed(0)
    draft = make_peagle_draft(zoo, [2, 12, 21], mask_token_id=0, draft_ids=torch.arange(512))
    prompts = [torch.tensor([11, 40, 7, 300, 21, 9])]
    assert_greedy_equal(zoo, PEagleDrafter(zoo, draft, max_depth=4, max_nodes=8, top_k=2), budget, (5, 20), prompts)


@pytest.mark.parametrize("top_k", [1, 3])
def test_one_draft_forward_per_step(target, top_k):
    drafter = PEagleDrafter(target, random_draft(target), max_depth=5, max_nodes=12, top_k=top_k)
    per_step = forwards_per_drafting_step(target, drafter, drafter.draft, PROMPTS[1])
    assert per_step and set(per_step) == {1}, per_step
    # the counter can fail: EAGLE-3 on the same draft runs one forward per depth
    eagle = EagleDrafter(target, make_draft(target, LAYERS, "reference"), max_depth=5, max_nodes=12, top_k=top_k)
    assert max(forwards_per_drafting_step(target, eagle, eagle.draft, PROMPTS[1])) == 5


def sampling_pair(seed=0):
    target = tiny_target(layers=4, vocab=VE, hidden=32, seed=seed, logit_scale=4.0)
    draft = random_draft(target, seed=seed + 1)
    with torch.no_grad():  # a peaked q that often disagrees with p: a wrong rule then shows
        draft.norm.weight.mul_(6.0)
    return target, draft


@pytest.mark.parametrize("top_k, rule", [(3, "exact"), pytest.param(1, "exact", marks=pytest.mark.slow),
                                         pytest.param(1, "shifted q", marks=pytest.mark.slow)])
def test_sampling_follows_the_target(top_k, rule):
    """The joint of the 2nd and 3rd sampled tokens (the first draft step decides both) matches the target's
    exact joint; verifying the same drafts against a wrong q must fail the same test."""
    target, draft = sampling_pair()
    prompt = torch.tensor([1, 2, 3, 1, 2])
    exact = exact_tokens_2_3(target, prompt)
    drafter = PEagleDrafter(target, draft, max_depth=2, max_nodes=6, top_k=top_k)
    counts, accepted = sampled_counts(target, prompt, drafter if rule == "exact" else shifted_q(drafter), 1200)
    assert_follows(counts, exact, accepted, rule == "exact")


def test_cod_anchors_are_nested_and_shrink():
    gen = torch.Generator().manual_seed(0)
    sets = cod_anchors(30, 5, 0.7, 0.2, gen)
    assert len(sets) == 4
    prev = set(range(30))
    for d, a in enumerate(sets, start=2):
        assert set(a.tolist()) <= prev and all(t + d <= 30 for t in a.tolist())
        prev = set(a.tolist())
    assert [a.numel() for a in sets] == sorted([a.numel() for a in sets], reverse=True)


def test_training_forward_equals_decoding(target):
    """Every pair and placeholder of the training forward gives exactly the logits the decoding forward gives
    at that position: the same inputs, positions and attention."""
    draft = random_draft(target).eval()
    ids = torch.tensor([[3, 17, 42, 8, 8, 61, 0, 9, 12, 30]])
    t, n = ids.shape[1], ids.shape[1] - 2
    hs = target(input_ids=ids, output_hidden_states=True).hidden_states
    feats = torch.cat([hs[k] for k in LAYERS], -1)[0]
    sets = cod_anchors(n, 4, 1.0, 1.0)  # every anchor at every depth
    anchor, depth, allowed = layout(n, sets, ids.device)
    pos = anchor + depth - 1
    x = torch.cat([feats[:n], draft.placeholders(int((depth > 1).sum()))])[None]
    tok = torch.where(depth == 1, ids[0, (anchor + 1).clamp_max(t - 1)], torch.full_like(anchor, 5))[None]
    mask = torch.zeros(allowed.shape).masked_fill_(~allowed, torch.finfo(torch.float32).min)
    emb = target.get_input_embeddings()
    with torch.no_grad():
        train_out = draft(x, emb(tok), attention_mask=mask[None, None], position_ids=pos[None])[0]
        for a in (0, 3, n - 3):
            k = int((depth[anchor == a] > 0).sum())  # the pair and its placeholders
            dec_x = torch.cat([feats[:a + 1], draft.placeholders(k - 1)])[None]
            dec_tok = torch.cat([ids[0, 1:a + 2], torch.full((k - 1,), 5)])[None]
            dec_out = draft(dec_x, emb(dec_tok))[0, a:]  # causal decoding forward: pairs 0..a, then placeholders
            rows = [int(((anchor == a) & (depth == d)).nonzero()) for d in range(1, k + 1)]
            torch.testing.assert_close(train_out[rows], dec_out, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("peagle_train"), layers=4)


TRAIN_FLAGS = ("--layout", "reference", "--feature_layers", "[1, 2, 3]", "--parallel_depths", "3",
               "--draft_vocab_size", "-1", "--feature_noise", "0", "--feature_loss_weight", "0",
               "--token_loss_weight", "1")


@pytest.fixture(scope="module")
def trained(tiny_run):
    """(run folder, report) of a 24-step one-layer P-EAGLE run on the tiny target."""
    from draftkit.train import eagle as train_eagle

    out = tiny_run / "run"
    return out, train_eagle.main(train_argv(tiny_run, out, 24, *TRAIN_FLAGS))


def test_training_lowers_the_loss(tiny_run, trained):
    out, report = trained
    first, last = early_late(report["history"], "loss")
    assert last < first - 0.1, (first, last)
    assert len(report["heldout_top1_by_depth"]) == 3 and report["tau"] >= 1.0
    from transformers import AutoModelForCausalLM

    drafter = PEagleDrafter.from_pretrained(str(out / "final"),
                                            AutoModelForCausalLM.from_pretrained(str(tiny_run / "target")))
    assert tuple(drafter.draft.mask_hidden.shape) == (1, 1, 3 * 32)


def test_warm_start_from_eagle3_keeps_its_first_depth(target):
    """A P-EAGLE draft started from an EAGLE-3 draft (train/eagle.py --init_from) drafts depth 1 as the EAGLE-3
    draft does: same weights, same first-depth tokens; only mask_hidden is new."""
    from draftkit.drafters.peagle import peagle_from_eagle3

    torch.manual_seed(3)
    base = make_draft(target, LAYERS, "reference")
    warm = peagle_from_eagle3(base, mask_token_id=5)
    for name, tensor in base.state_dict().items():
        assert torch.equal(warm.state_dict()[name], tensor), name
    assert warm.config.mask_token_id == 5 and warm.mask_hidden.abs().sum() > 0
    prompt = PROMPTS[1]
    chain = dict(max_depth=1, max_nodes=1, top_k=1)
    a = EagleDrafter(target, base, **chain)
    b = PEagleDrafter(target, warm, **chain)
    tokens = first_depth_tokens(target, a, prompt)
    assert any(tokens) and tokens == first_depth_tokens(target, b, prompt)


def first_depth_tokens(target, drafter, prompt, steps=6):
    """The depth-1 token each step drafts, with a fixed budget of one level."""
    from draftkit.verify.decode import generate

    seen = []
    propose = drafter.propose

    def spy(state):
        tree = propose(state)
        seen.append(tree.host_tokens[:1] if len(tree) else [])
        return tree
    drafter.propose = spy
    generate(target, prompt, drafter, max_new_tokens=steps, budget="fixed")
    return seen


def test_training_grows_a_trained_draft(tiny_run, trained):
    """--init_from a one-layer P-EAGLE run with --draft_layers 2: the run starts from the trained draft's outputs
    (its first loss near the first run's last ones, not a fresh draft's) and ships a two-layer draft."""
    from transformers import AutoModelForCausalLM

    from draftkit.train import eagle as train_eagle

    base, base_report = trained
    base_losses = [h["loss"] for h in base_report["history"]]
    out = tiny_run / "grown"
    report = train_eagle.main(train_argv(tiny_run, out, 4, *TRAIN_FLAGS, "--init_from", str(base / "final"),
                                         "--draft_layers", "2"))
    first = report["history"][0]["loss"]
    assert report["tokens_seen"] > report["tokens_seen_before"] == base_report["tokens_seen"] > 0
    assert first < base_losses[0] - 0.1 and first < max(base_losses[-6:]) + 0.3, (first, base_losses)
    drafter = PEagleDrafter.from_pretrained(str(out / "final"),
                                            AutoModelForCausalLM.from_pretrained(str(tiny_run / "target")))
    assert drafter.draft.layer_config.num_hidden_layers == 2 and len(drafter.draft.later_layers) == 1
