"""Shared helpers of the one-forward drafters' tests (P-EAGLE and DFlash): tiny targets, a forward counter,
the exact joint of two sampled tokens, the greedy-equality check and a tiny training setup."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate
from tests.test_sampled_trees import VE, chi2_pvalue, exact_tokens_2_3  # noqa: F401 - shared with these tests

PROMPTS = [torch.tensor([5]), torch.tensor([3, 17, 42, 8, 8, 61, 0, 9]), torch.arange(20) % 7 + 30]


def tiny_target(layers: int = 4, vocab: int = 64, hidden: int = 32, seed: int = 0, logit_scale: float = 1.0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).eval()
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


def assert_greedy_equal(target, drafter, budget: str, lengths=(1, 6, 17), prompts=PROMPTS) -> int:
    """Greedy output with the drafter equals plain greedy decoding; returns the draft tokens accepted."""
    accepted = 0
    for prompt in prompts:
        for n in lengths:
            ref = generate(target, prompt, max_new_tokens=n, eos_token_id=[])
            out = generate(target, prompt, drafter=drafter, max_new_tokens=n, eos_token_id=[], budget=budget)
            assert out.tokens.tolist() == ref.tokens.tolist(), (budget, prompt.tolist(), n)
            accepted += sum(s.accepted for s in out.stats.steps)
    return accepted


def count_forwards(module: torch.nn.Module) -> list[int]:
    """Wrap module.forward so that every call appends to the returned list (read its length)."""
    calls: list[int] = []
    real = module.forward

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    module.forward = counted
    return calls


def forwards_per_drafting_step(target, drafter, module, prompt, new_tokens: int = 24) -> list[int]:
    """Draft forwards of each step that drafted something (the verifier's steps, with the drafter's cap)."""
    calls = count_forwards(module)
    per_step, seen = [], 0
    propose = drafter.propose

    def counted_propose(state):
        nonlocal seen
        tree = propose(state)
        if len(tree):
            per_step.append(len(calls) - seen)
        seen = len(calls)
        return tree

    drafter.propose = counted_propose
    generate(target, prompt, drafter=drafter, max_new_tokens=new_tokens, eos_token_id=[], budget="fixed")
    del drafter.propose, module.forward
    return per_step


def sampled_counts(target, prompt, drafter, n: int, max_new_tokens: int = 4) -> tuple[torch.Tensor, int]:
    """Joint counts of the 2nd and 3rd generated tokens over n seeds, and the draft tokens accepted."""
    counts, accepted = torch.zeros(VE, VE), 0
    for i in range(n):
        out = generate(target, prompt, drafter=drafter, max_new_tokens=max_new_tokens,
                       sampling=Sampling(temperature=1.0), eos_token_id=[], seed=i, budget="fixed")
        t = out.tokens.tolist()
        counts[t[1], t[2]] += 1
        accepted += sum(s.accepted for s in out.stats.steps)
    return counts, accepted


def assert_follows(counts: torch.Tensor, exact: torch.Tensor, accepted: int, exact_rule: bool) -> None:
    """The exact rule fits the target's joint (and drafts were accepted); a wrong one fails by far."""
    pvalue = chi2_pvalue(counts, exact)
    if exact_rule:
        assert accepted > 200 and pvalue > 1e-3, (accepted, pvalue)
    else:
        assert pvalue < 1e-6, pvalue


def shifted_q(drafter):
    """The deliberately wrong q: each node verified against its q rolled by one token (another token's
    probability), as a drafter reporting the wrong distribution would."""
    propose = drafter.propose

    def wrong(state):
        tree = propose(state)
        if tree.q is not None:
            tree.q = tree.q.roll(1, dims=-1)
        return tree
    drafter.propose = wrong
    return drafter


def make_tiny_run(root, layers: int = 4):
    """A tiny corpus, tokenizer and peaked target saved like a real one (for few-step trainings)."""
    import inspect
    import json
    import textwrap

    from draftkit.train.data import train_tokenizer

    text = inspect.getsource(json) + inspect.getsource(textwrap)
    (root / "corpus.txt").write_text(text[:12000])
    tok = train_tokenizer(text[:12000].splitlines(), vocab_size=300)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                      eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(20)
    model.save_pretrained(str(root / "target"))
    tok.save_pretrained(str(root / "target"))
    return root


def train_argv(root, out, steps, *extra):
    return ["--target", str(root / "target"), "--corpus", str(root / "corpus.txt"), "--cache_dir", str(root / "cache"),
            "--seq_len", "32", "--batch_size", "8", "--max_steps", str(steps), "--warmup_steps", "2", "--lr", "3e-3",
            "--eval_every", "1000", "--eval_blocks", "4", "--eval_tau_prompts", "1", "--eval_new_tokens", "8",
            "--wandb", "false", "--output_dir", str(out), "--train_rows", "64", "--shard_rows", "32", *extra]


def early_late(history: list[dict], key: str, n: int = 3) -> tuple[float, float]:
    return sum(h[key] for h in history[:n]) / n, sum(h[key] for h in history[-n:]) / n
