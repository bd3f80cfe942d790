"""Medusa drafter and its training recipe, on tiny random Llamas (no downloads)."""
from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.verify.contract import Budget, DecodeState, Drafter, StepResult
from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads, has_adapter, load_medusa, load_target_with_adapter
from draftkit.drafters.medusa_tree import build_tree_choices, check_tree_choices, default_accuracies, expected_accepted
from draftkit.train.medusa import head_losses
from draftkit.train.medusa import main as train_main
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate as _generate


def generate(*args, **kwargs):
    """The loop with the drafter's fixed cap every step: these tests check drafting itself, not the controller."""
    return _generate(*args, **{"budget": "fixed", **kwargs})

torch.set_num_threads(1)


# ----------------------------------------------------------------------------- helpers


def tiny_target(vocab=64, hidden=32, layers=2, seed=0, max_pos=256, tie=False) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=2 * hidden, max_position_embeddings=max_pos,
                      tie_word_embeddings=tie, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


@torch.no_grad()
def generate_batch(model, prompts, new_tokens: int, temperature: float = 0.0, gen=None) -> torch.Tensor:
    """(B, P) prompts -> (B, P + new_tokens), greedy or sampled, without a cache (tiny models); EOS does not stop it."""
    out = prompts
    for _ in range(new_tokens):
        logits = model(input_ids=out).logits[:, -1].float()
        nxt = torch.multinomial((logits / temperature).softmax(-1), 1, generator=gen) if temperature > 0 \
            else logits.argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], 1)
    return out


def fit_heads(target, num_heads=3, steps=60, temperature=0.0, seed=0, share_lm_head=False) -> MedusaHeads:
    """Heads trained briefly on the target's own continuations (so drafts really get accepted)."""
    vocab, hidden = target.get_output_embeddings().weight.shape
    gen = torch.Generator().manual_seed(seed)
    seqs = generate_batch(target, torch.randint(0, vocab, (32, 4), generator=gen), 40, temperature, gen)
    with torch.no_grad():
        hid = target(input_ids=seqs, output_hidden_states=True).hidden_states[-1]
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, vocab, num_heads, share_lm_head=share_lm_head)
    if share_lm_head:
        heads.attach_lm_head(target.get_output_embeddings())
    else:
        heads.init_from_lm_head(target.get_output_embeddings())
    opt = torch.optim.Adam(heads.parameters(), lr=1e-2)
    for _ in range(steps):
        losses, _ = head_losses(heads, hid, seqs)
        sum(losses).backward()
        opt.step()
        opt.zero_grad()
    return heads.eval()


def random_heads(target, num_heads=3, seed=1) -> MedusaHeads:
    vocab, hidden = target.get_output_embeddings().weight.shape
    torch.manual_seed(seed)
    heads = MedusaHeads(hidden, vocab, num_heads).init_from_lm_head(target.get_output_embeddings())
    with torch.no_grad():
        for block in heads.blocks:
            block[0].linear.weight.normal_(0, 0.3)
    return heads.eval()


def assert_greedy_equal(target, drafter, prompts, budgets):
    stats = []
    for p in prompts:
        for n in budgets:
            ref = generate(target, p, max_new_tokens=n, eos_token_id=[])
            out = generate(target, p, drafter=drafter, max_new_tokens=n, eos_token_id=[])
            assert out.tokens.tolist() == ref.tokens.tolist(), (p.tolist(), n)
            assert out.tokens.numel() == n
            stats.append(out.stats)
    return stats


def prompts_for(vocab, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.tensor([5]), torch.randint(0, vocab, (3,), generator=gen),
            torch.randint(0, vocab, (9,), generator=gen), torch.randint(0, vocab, (17,), generator=gen)]


WORDS = ("the quick brown fox jumps over lazy dog def return class import self value list dict for in while "
         "if else print range len open").split()


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    """A tiny .txt corpus, a BPE tokenizer trained on it and a random tiny target saved beside it."""
    from draftkit.train.data import train_tokenizer

    root = tmp_path_factory.mktemp("medusa")
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15))) for _ in range(400)]
    (root / "corpus.txt").write_text("\n".join(lines))
    tok = train_tokenizer(lines, 300)
    target = tiny_target(vocab=len(tok), max_pos=512, tie=True)
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    return root


def train_argv(root, out, *extra):
    return ["--target", str(root / "target"), "--corpus", str(root / "corpus.txt"), "--cache_dir", "",
            "--seq_len", "32", "--batch_size", "4", "--eval_blocks", "8", "--eval_every", "10",
            "--tree_size", "10", "--output_dir", str(out), "--train_rows", "32", "--shard_rows", "16", *extra]


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))


# ----------------------------------------------------------------------------- tree choices


def test_build_tree_choices_greedy_order():
    acc = [[0.5, 0.3], [0.5, 0.1]]
    # values: (0,) .5, (1,) .3, (0,0) .25, (1,0) .15, (0,1) .05, (1,1) .03
    assert build_tree_choices(acc, 3) == [(0,), (0, 0), (1,)]
    assert build_tree_choices(acc, 4) == [(0,), (0, 0), (1,), (1, 0)]
    assert len(build_tree_choices(acc, 100)) == 6  # every path of 2 heads x 2 ranks
    assert build_tree_choices(acc, 0) == []
    choices = build_tree_choices(default_accuracies(4), 64)
    assert len(choices) == 64 and max(map(len, choices)) <= 4
    check_tree_choices(choices, num_heads=4)  # parent-closed, no repeats
    assert expected_accepted([(0,), (0, 0)], acc) == pytest.approx(0.75)


def test_check_tree_choices_rejects_bad_trees():
    with pytest.raises(ValueError, match="parent"):
        check_tree_choices([(0,), (1, 0)])
    with pytest.raises(ValueError, match="repeated"):
        check_tree_choices([(0,), (0,)])
    with pytest.raises(ValueError, match="heads"):
        check_tree_choices([(0,), (0, 0), (0, 0, 0)], num_heads=2)
    with pytest.raises(ValueError):
        check_tree_choices([()])
    target = tiny_target()
    with pytest.raises(ValueError, match="parent"):
        MedusaDrafter(target, random_heads(target), [(0,), (1, 1)])


def test_propose_instantiates_head_topk():
    target = tiny_target()
    heads = random_heads(target, num_heads=3)
    choices = [(0,), (0, 0), (0, 0, 0), (0, 1), (1,), (1, 0), (2,)]
    drafter = MedusaDrafter(target, heads, choices)
    assert isinstance(drafter, Drafter) and drafter.hidden_layers == (-1,)
    prompt = torch.tensor([1, 2, 3])
    drafter.reset(prompt)
    state = DecodeState(prompt, 3, budget=Budget(3, 10), greedy=True)
    assert len(drafter.propose(state)) == 0  # no hidden state yet: the empty tree
    h = torch.randn(4, 32)
    drafter.update(StepResult(torch.tensor([4]), prompt, (h,), torch.zeros(1, 64), None, []))
    tree = drafter.propose(state).validate(64)
    assert tree.q is None
    with torch.no_grad():
        top = heads(h[-1][None])[:, 0].topk(3, -1).indices
    want = [int(top[len(p) - 1, p[-1]]) for p in choices]
    assert tree.tokens.tolist() == want
    assert tree.parents.tolist() == [-1, 0, 1, 0, -1, 4, -1]
    small = drafter.propose(DecodeState(prompt, 3, budget=Budget(2, 3), greedy=True)).validate(64)
    assert len(small) == 3 and small.max_depth <= 2  # a smaller budget keeps the most valuable subtree
    # a depth budget of 1 keeps the root's children only; an empty budget nothing
    shallow = drafter.propose(DecodeState(prompt, 3, budget=Budget(1, 10), greedy=True)).validate(64)
    assert shallow.tokens.tolist() == [want[0], want[4], want[6]] and shallow.parents.tolist() == [-1, -1, -1]
    assert len(drafter.propose(DecodeState(prompt, 3, budget=Budget(0, 0), greedy=True))) == 0


# ----------------------------------------------------------------------------- greedy equality


@pytest.mark.parametrize("tree_size", [1, 4, 12, 40])
def test_greedy_equals_plain_decoding_random_heads(tree_size):
    target = tiny_target()
    drafter = MedusaDrafter(target, random_heads(target), build_tree_choices(default_accuracies(3), tree_size))
    assert_greedy_equal(target, drafter, prompts_for(64), [1, 2, 7, 30])


def test_greedy_equals_plain_decoding_trained_heads():
    """Heads fit to the target's own greedy text: real acceptance, budgets ending mid-draft."""
    target = tiny_target(seed=3)
    heads = fit_heads(target, num_heads=3)
    for tree_size in (3, 16, 50):
        drafter = MedusaDrafter(target, heads, build_tree_choices(default_accuracies(3), tree_size))
        stats = assert_greedy_equal(target, drafter, prompts_for(64, seed=1), [1, 2, 3, 5, 31])
        accepted = sum(s.accepted for st in stats for s in st.decode_steps)
        steps = sum(len(st.decode_steps) for st in stats)
        assert accepted / steps > 0.3, f"tree {tree_size}: heads fit to the target should get drafts accepted"


def test_shared_lm_head_and_save_roundtrip(tmp_path):
    target = tiny_target(seed=4)
    heads = fit_heads(target, num_heads=2, share_lm_head=True, steps=30)
    drafter = MedusaDrafter(target, heads, build_tree_choices(default_accuracies(2), 6),
                            accuracies=default_accuracies(2))
    assert_greedy_equal(target, drafter, prompts_for(64)[:2], [9])
    drafter.save_pretrained(str(tmp_path / "m"))
    from safetensors.torch import load_file

    assert not any(k.startswith("proj") for k in load_file(str(tmp_path / "m" / "model.safetensors")))
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    assert cfg["share_lm_head"] and cfg["target"]["hidden_size"] == 32 and cfg["target"]["vocab_size"] == 64
    loaded = MedusaDrafter.from_pretrained(str(tmp_path / "m"), target)
    assert loaded.tree_choices == drafter.tree_choices
    assert_greedy_equal(target, loaded, prompts_for(64)[:2], [9])
    assert len(MedusaDrafter.from_pretrained(str(tmp_path / "m"), target, tree_size=3).tree_choices) == 3


def test_typical_acceptance_runs():
    target = tiny_target(seed=5)
    drafter = MedusaDrafter(target, fit_heads(target, num_heads=2, steps=30),
                            build_tree_choices(default_accuracies(2), 8))
    out = generate(target, torch.tensor([1, 2]), drafter=drafter, max_new_tokens=20, eos_token_id=[],
                   sampling=Sampling(temperature=0.7, acceptance="typical"), seed=0)
    assert out.tokens.numel() == 20 and not out.lossless
    plain = generate(target, torch.tensor([1, 2]), max_new_tokens=5, sampling=Sampling(0.7, acceptance="typical"))
    assert plain.lossless  # nothing drafted: every token is the target's own draw


# ----------------------------------------------------------------------------- lossless sampling


def test_sampling_through_tree_matches_target_distribution():
    """First three sampled tokens vs the exact target distribution (brute force over a 16-token vocabulary).

    Each run drafts depth-1 siblings after the prefill, so the second and third tokens go through
    accept / reject / residual. A bonus drawn from p instead of the residual gives TV ~0.16 here.
    """
    V, N = 16, 2000
    target = tiny_target(vocab=V, layers=1, seed=0, max_pos=64)
    with torch.no_grad():
        target.lm_head.weight.mul_(60)  # a peaked p: drafts are accepted often and TV noise is small
    heads = fit_heads(target, num_heads=2, temperature=1.0, seed=0)
    drafter = MedusaDrafter(target, heads, [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])
    prompt = torch.tensor([3, 7, 1])
    with torch.no_grad():
        p1 = target(prompt[None]).logits[0, -1].softmax(-1)
        x2 = torch.cat([prompt.repeat(V, 1), torch.arange(V)[:, None]], 1)
        p2 = target(x2).logits[:, -1].softmax(-1)
        x3 = torch.cat([prompt.repeat(V * V, 1), torch.arange(V).repeat_interleave(V)[:, None],
                        torch.arange(V).repeat(V)[:, None]], 1)
        p3 = target(x3).logits[:, -1].softmax(-1).view(V, V, V)
    joint = p1[:, None] * p2
    third = (joint[:, :, None] * p3).sum((0, 1))
    counts, counts3, accepted = torch.zeros(V, V), torch.zeros(V), 0
    sampling = Sampling(temperature=1.0)
    for i in range(N):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=4, sampling=sampling, eos_token_id=[], seed=i)
        a, b, c = out.tokens.tolist()[:3]
        counts[a, b] += 1
        counts3[c] += 1
        accepted += sum(s.accepted for s in out.stats.steps)
    assert accepted / N > 0.3  # the drafts are exercised, not just the bonus path
    tv_joint = 0.5 * (counts / N - joint).abs().sum().item()
    tv_third = 0.5 * (counts3 / N - third).abs().sum().item()
    assert tv_joint < 0.08, tv_joint
    assert tv_third < 0.08, tv_third


# ----------------------------------------------------------------------------- loading


def test_heads_for_another_target_raise(tmp_path):
    small = tiny_target(hidden=32)
    drafter = MedusaDrafter(small, random_heads(small), [(0,), (1,)])
    drafter.save_pretrained(str(tmp_path / "m"))
    other = tiny_target(hidden=48)
    with pytest.raises(ValueError, match=r"hidden size 32.*hidden size 48"):
        MedusaDrafter.from_pretrained(str(tmp_path / "m"), other)
    with pytest.raises(ValueError, match="vocabulary 64.*vocabulary 80"):
        MedusaDrafter.from_pretrained(str(tmp_path / "m"), tiny_target(vocab=80))
    with pytest.raises(ValueError, match="hidden size"):
        MedusaDrafter(other, random_heads(small), [(0,)])


# ----------------------------------------------------------------------------- training recipe


def test_train_medusa1_lowers_head_loss_and_logs(tiny_setup, tmp_path, wandb_offline):
    out = tmp_path / "m1"
    report = train_main(train_argv(tiny_setup, out, "--max_steps", "25", "--num_heads", "3",
                                   "--checkpoint_every", "100"))
    assert sum(report["heldout_head_loss"]) < sum(report["initial_heldout_head_loss"])
    assert report["resumed_from"] == 0 and len(report["head_top1"]) == 3
    assert list((out / "wandb").glob("offline-run-*")), "no W&B offline run under output_dir"
    final = out / "final"
    for name in ("config.json", "model.safetensors", "tree.json", "train_report.json"):
        assert (final / name).exists(), name
    tree = json.loads((final / "tree.json").read_text())
    assert len(tree["choices"]) == 10 and len(tree["accuracies"]) == 3 and len(tree["accuracies"][0]) == 10
    cfg = json.loads((final / "config.json").read_text())
    assert cfg["mode"] == "medusa1" and cfg["target"]["num_layers"] == 2 and not has_adapter(str(final))
    target = LlamaForCausalLM.from_pretrained(str(tiny_setup / "target"), dtype=torch.float32).eval()
    drafter = MedusaDrafter.from_pretrained(str(final), target)
    assert_greedy_equal(target, drafter, prompts_for(target.config.vocab_size)[:2], [12])


def test_train_resumes_from_checkpoint(tiny_setup, tmp_path, wandb_offline):
    out = tmp_path / "resume"
    first = train_main(train_argv(tiny_setup, out, "--max_steps", "2", "--checkpoint_every", "2"))
    assert first["resumed_from"] == 0
    assert json.loads((out / "checkpoints" / "checkpoint-2" / "trainer_state.json").read_text())["step"] == 2
    second = train_main(train_argv(tiny_setup, out, "--max_steps", "4", "--checkpoint_every", "2"))
    assert second["resumed_from"] == 2
    assert json.loads((out / "checkpoints" / "checkpoint-4" / "trainer_state.json").read_text())["step"] == 4


def test_train_medusa2_greedy_equals_merged_target(tiny_setup, tmp_path, wandb_offline):
    out = tmp_path / "m2"
    report = train_main(train_argv(tiny_setup, out, "--mode", "medusa2", "--max_steps", "6", "--num_heads", "2",
                                   "--lr", "0.01", "--regenerate", "true", "--train_rows", "8", "--shard_rows", "4",
                                   "--regen_prompt_len", "8", "--data_mode", "online"))
    assert "heldout_target_loss" in report and "heldout_target_loss_original" in report
    final = out / "final"
    assert has_adapter(str(final)) and (final / "adapter_model.safetensors").exists()
    base = LlamaForCausalLM.from_pretrained(str(tiny_setup / "target"), dtype=torch.float32).eval()
    original = LlamaForCausalLM.from_pretrained(str(tiny_setup / "target"), dtype=torch.float32).eval()
    with pytest.warns(UserWarning, match="adapter"):
        MedusaDrafter.from_pretrained(str(final), original)  # heads without the fine-tuned target: warned
    target, drafter = load_medusa(str(final), base)
    assert not isinstance(target, type(None)) and type(target).__name__ == "LlamaForCausalLM"
    changed = any(not torch.equal(a, b) for a, b in zip(target.state_dict().values(), original.state_dict().values()))
    assert changed, "the merged Medusa-2 target should differ from the original"
    assert_greedy_equal(target, drafter, prompts_for(target.config.vocab_size), [1, 6, 20])
    assert load_target_with_adapter(str(tiny_setup / "target"), original) is original  # no adapter: unchanged


def test_head_outputs_pair_each_position_with_the_token_k_plus_2_ahead_and_subsample_those_pairs():
    """Every pair (h_t, x_{t+k+2}) that is trained on, checked against a direct loop; a subsample of positions
    keeps only pairs of the full set (the same pairing), about the asked fraction of them."""
    from draftkit.train.medusa import head_outputs

    torch.manual_seed(0)
    B, T, H, V, K = 2, 12, 8, 16, 3
    heads = MedusaHeads(H, V, num_heads=K)
    hidden, tokens = torch.randn(B, T, H), torch.randint(0, V, (B, T))
    mask = torch.rand(B, T) > 0.3
    full = head_outputs(heads, hidden, tokens, mask)
    with torch.no_grad():
        for k, (logits, labels) in enumerate(full):
            want = [(b, t) for b in range(B) for t in range(T - k - 2) if mask[b, t + k + 1]]
            assert labels.tolist() == [int(tokens[b, t + k + 2]) for b, t in want]
            ref = torch.stack([heads.head_logits(k, hidden[b, t]) for b, t in want])
            assert torch.allclose(logits, ref, atol=1e-5)
    torch.manual_seed(1)
    half = head_outputs(heads, hidden, tokens, mask, positions=0.5)
    with torch.no_grad():
        for (logits, labels), (f_logits, f_labels) in zip(half, full):
            rows = {tuple(r.round(decimals=4).tolist()) for r in f_logits}
            assert 0 < len(labels) < len(f_labels)
            assert all(tuple(r.round(decimals=4).tolist()) in rows for r in logits)


def test_heldout_agreement_compares_each_head_with_the_targets_own_prediction():
    """evaluate_heads' agreement: head k's top-1 at position t against the target's argmax for token t + k + 2
    (its logits at t + k + 1), checked against a direct loop; the text's own tokens give the other figure. Only
    the labels the rows train on count (a conversation's answer: here a prompt of 4 tokens and 2 of padding left
    out)."""
    from draftkit.train.medusa import evaluate_heads

    target = tiny_target(vocab=32, hidden=16, layers=1)
    heads = fit_heads(target, num_heads=2, steps=20)
    rows = generate_batch(target, torch.randint(0, 32, (3, 4), generator=torch.Generator().manual_seed(5)), 10)
    rows[:, 9] = (rows[:, 9] + 1) % 32  # mostly the target's own text, with breaks: both cases occur
    rows[0, 6] = (rows[0, 6] + 1) % 32
    mask = torch.zeros(rows.shape, dtype=torch.bool)
    mask[:, 3:11] = True  # labels 4 .. 11 are trained on (mask[:, j - 1] marks label j)

    class Rows:
        def heldout_tokens(self, blocks):
            yield rows, mask

    res = evaluate_heads(target, heads, Rows(), blocks=3, top_k=2)
    with torch.no_grad():
        out = target(input_ids=rows, output_hidden_states=True)
        for k in range(2):
            agree, text, followed = [], [], []
            for b in range(3):
                for t in range(14 - k - 2):
                    if not mask[b, t + k + 1]:
                        continue
                    guess = int(heads.head_logits(k, out.hidden_states[-1][b, t]).argmax())
                    agree.append(guess == int(out.logits[b, t + k + 1].argmax()))
                    text.append(guess == int(rows[b, t + k + 2]))
                    if all(int(out.logits[b, j - 1].argmax()) == int(rows[b, j]) for j in range(t + 1, t + k + 2)):
                        followed.append(agree[-1])
            assert len(agree) == 3 * 8
            assert res["agree_topk"][k][0] == pytest.approx(sum(agree) / len(agree))
            assert res["topk"][k][0] == pytest.approx(sum(text) / len(text))
            assert 0 < res["follow_positions"][k] == len(followed) < len(agree)
            assert res["follow_top1"][k] == pytest.approx(sum(followed) / max(1, len(followed)))


def test_heads_made_for_a_target_of_another_depth_are_refused(tmp_path):
    """Heads record the target they were trained for; one of the same width and vocabulary but other layers (a
    truncated or other model) is refused in one line, as EAGLE drafts are, rather than drafting from features of
    another model."""
    from draftkit.drafters.medusa import save_medusa
    from draftkit.verify.contract import DraftMismatch
    from tests.models import tiny_model

    trained_on, other = tiny_model("llama", layers=2), tiny_model("llama", layers=3)
    save_medusa(str(tmp_path), MedusaHeads(32, 64, num_heads=2), [[0], [0, 0]], trained_on)
    MedusaDrafter.from_pretrained(str(tmp_path), trained_on)
    with pytest.raises(DraftMismatch, match="2 layers\\); this target .* 3 layers"):
        MedusaDrafter.from_pretrained(str(tmp_path), other)


def test_a_path_given_to_a_drafter_without_a_model_is_refused():
    import draftkit as dk
    from tests.models import tiny_model

    with pytest.raises(ValueError, match="lookahead drafts without a model of its own: it takes no path"):
        dk.make_drafter("lookahead", tiny_model("llama"), "/nonexistent")
