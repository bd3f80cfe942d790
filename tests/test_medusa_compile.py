"""compile_draft for Medusa: the heads on static shapes, compiled (drafters/medusa_static.py).

The fast tests run the static path through `call_compiled` with the heads' own eager forward standing in for
inductor; the slow one compiles for real."""
from __future__ import annotations

import logging

import pytest
import torch
from torch._dynamo.utils import counters

import draftkit.verify.compiled as compiled
from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads
from draftkit.drafters.medusa_tree import build_tree_choices, default_accuracies
from draftkit.verify.accept import Sampling
from draftkit.verify.packed import generate_packed
from tests.models import tiny_model
from tests.test_static import prompts_of

torch.set_num_threads(1)


def heads_for(target, num_heads=3, seed=1, share_lm_head=False) -> MedusaHeads:
    """Heads that propose something (the LM head's projection, randomly perturbed residual blocks)."""
    torch.manual_seed(seed)
    cfg = target.config
    heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, num_heads, share_lm_head=share_lm_head)
    if share_lm_head:
        heads.attach_lm_head(target.get_output_embeddings())
    else:
        heads.init_from_lm_head(target.get_output_embeddings())
    with torch.no_grad():
        for block in heads.blocks:
            block[0].linear.weight.normal_(0, 0.05)
    return heads


def run(target, prompts, heads, compile_draft: bool, temperature: float = 0.0):
    """Each lane's tokens and every tree its drafter built (tokens, parents), in order."""
    trees, tree = [], MedusaDrafter.tree

    def recorded(self, logits, state):
        out = tree(self, logits, state)
        trees.append((out.tokens.tolist(), out.host_parents))
        return out
    MedusaDrafter.tree = recorded
    try:
        choices = build_tree_choices(default_accuracies(heads.num_heads), 8)
        drafters = [MedusaDrafter(target, heads, choices, compile_draft=compile_draft) for _ in prompts]
        sampling = Sampling(temperature=temperature) if temperature else None
        out = generate_packed(target, prompts, drafters, 32, sampling=sampling, eos_token_id=[], budget="fixed",
                              logprobs=False, seed=3)
    finally:
        MedusaDrafter.tree = tree
    return [o.tokens.tolist() for o in out.outputs], trees


@pytest.fixture
def eager_graphs(monkeypatch):
    """call_compiled runs the heads' own forward: the static path without inductor's compile time."""
    monkeypatch.setattr(compiled, "compiled_forward", lambda m: m.__call__)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("share_lm_head", [False, True])
def test_compiled_heads_build_the_trees_eager_ones_do(eager_graphs, share_lm_head, temperature):
    """Padded to the group's rows, the heads give every lane the tree they give it eagerly, at every step, one
    sequence and a ragged batch of three (greedy and sampled: the same draws); the output is the same."""
    target = tiny_model("llama", layers=2)
    heads = heads_for(target, share_lm_head=share_lm_head)
    for prompts in (prompts_of((12,)), prompts_of((5, 12, 30))):
        eager = run(target, prompts, heads, False, temperature)
        assert run(target, prompts, heads, True, temperature) == eager
        assert len(eager[1]) >= 6 and sum(len(t[0]) for t in eager[1]) >= 30  # trees were compared


def test_heads_compile_every_graph_when_a_sequence_or_a_group_starts(eager_graphs, caplog):
    """A lone drafter's reset compiles each head count for one row, a group of three lanes each head count for
    four rows (its bucket), each said once in one line; drafters started later on the same heads compile
    nothing, and a step never meets a graph that was not compiled ahead."""
    target = tiny_model("llama", layers=2)
    heads = heads_for(target, seed=2)  # graphs are kept on the heads: heads of their own
    choices = build_tree_choices(default_accuracies(3), 8)
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        for _ in range(2):
            MedusaDrafter(target, heads, choices, compile_draft=True).reset(prompts_of((12,))[0])
            lanes = [MedusaDrafter(target, heads, choices, compile_draft=True) for _ in range(3)]
            MedusaDrafter.draft_lanes(lanes)
        ahead = set(compiled.compiled_keys(heads))
        run(target, prompts_of((5, 12, 30)), heads, True)
        run(target, prompts_of((12,)), heads, True)
    assert {(k[1], k[2]) for k in ahead} == {(n, b) for n in (1, 2, 3) for b in (1, 4)}
    assert compiled.compiled_keys(heads) == ahead
    said = [r.getMessage() for r in caplog.records if "Medusa's heads" in r.getMessage()]
    assert len(said) == 2 and "for 1 row " in said[0] and "for 4 rows" in said[1], said


@pytest.mark.parametrize("graphs", [True, False])
def test_compiled_heads_return_copies_a_later_replay_cannot_rewrite(monkeypatch, graphs):
    """Under CUDA graphs each heads call starts a new step and returns a copy: the logits of one call stay as they
    were after the next. Without (graphs=False on the same replaying stand-in) the next call rewrites them."""
    import draftkit.drafters.medusa_static as static
    from draftkit.drafters.medusa_static import head_logits

    marks, pool = [], {}
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(static, "graph_outputs", lambda device: graphs)

    def replays(model):
        def replay(**kw):
            out = model(**kw)
            buf = pool.setdefault(tuple(out.shape), torch.empty_like(out))
            return buf.copy_(out)
        return replay
    monkeypatch.setattr(compiled, "compiled_forward", replays)
    target = tiny_model("llama", layers=2)
    heads = heads_for(target, seed=3)
    width = target.config.hidden_size
    with torch.no_grad():
        first = head_logits(heads, torch.randn(1, width), 2, True)
        kept = first.clone()
        head_logits(heads, torch.randn(1, width), 2, True)
    assert torch.equal(first, kept) == graphs
    assert len(marks) == (2 if graphs else 0)


def test_compare_flags_and_the_hybrid_hand_medusa_compile_draft():
    """--compile (or --medusa-compile-draft) reaches Medusa's settings, and a hybrid with compile_draft hands it to a
    Medusa member, as to the other drafts."""
    from draftkit.drafters.registry import HybridSettings, MedusaSettings, compiled_flag

    assert MedusaSettings(compile_draft=True).compile_draft
    assert compiled_flag("medusa", HybridSettings(members="suffix,medusa", compile_draft=True)) == {"compile_draft": True}
    assert compiled_flag("suffix", HybridSettings(members="suffix,medusa", compile_draft=True)) == {}


@pytest.mark.slow
def test_compiled_heads_never_recompile_after_the_warm_up():
    """Inductor for real: after a sequence's reset compiled the heads, its run compiles nothing more and builds the
    eager heads' trees."""
    target = tiny_model("llama", layers=2)
    heads = heads_for(target, seed=4)
    prompts = prompts_of((12,))
    eager = run(target, prompts, heads, False)
    MedusaDrafter(target, heads, build_tree_choices(default_accuracies(3), 8), compile_draft=True).reset(prompts[0])
    graphs = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = run(target, prompts, heads, True)
    assert out[0] == eager[0]
    assert [t[1] for t in out[1]] == [t[1] for t in eager[1]]  # the same trees' shapes; tokens may tie differently
    assert counters["stats"]["unique_graphs"] == graphs
