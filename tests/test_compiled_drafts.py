"""compile_draft: the draft models' own forwards with static shapes (verify/tree.py `_run_static`), compiled.

The fast tests run the static path through `call_compiled` with the model's own eager forward standing in for
inductor (its compile time is minutes on this suite's budget); the slow one compiles for real."""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import draftkit.verify.compiled as compiled
from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft
from draftkit.drafters.eagle import EagleDrafter, EagleDraftModel
from draftkit.drafters.eagle_reference import make_draft
from draftkit.drafters.peagle import PEagleDrafter, make_peagle_draft
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.verify.packed import generate_packed
from draftkit.verify.tree import COMPILED_ROWS
from tests.models import WINDOWED, tiny_model, windowed_model
from tests.test_static import graph_replays, prompts_of

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models():
    return build_models()


def build_models():
    target = tiny_model("llama", layers=4)
    torch.manual_seed(7)
    eagle3 = make_draft(target, [1, 2, 3], "reference", draft_ids=torch.arange(0, 64, 2))
    eagle3.config.attention_window = 8  # its mask narrowed per query: reads no length of the cache (one graph)
    torch.manual_seed(8)
    peagle = make_peagle_draft(target, [1, 2, 3], mask_token_id=5, draft_ids=torch.arange(0, 64, 2))
    torch.manual_seed(9)
    dflash = make_dflash_draft(target, block_size=5, mask_token_id=5, draft_layers=2, target_layers=[1, 3])
    dflash.config.attention_window = 8  # its static mask narrowed past the window, as the eager one is
    return target, EagleDraftModel.from_target(target), eagle3, peagle, dflash


def makers(target, eagle, eagle3, peagle, dflash):
    """Drafters that accept much (the target as its own draft) and ones that accept little (random EAGLE drafts:
    EAGLE-2's layout; EAGLE-3's reference layout, three fused target layers, a reduced vocabulary, a window;
    P-EAGLE; a DFlash block drafter on its static context buffer)."""
    return {
        "self-chain": lambda c: StandaloneDrafter(target, max_depth=4, compile_draft=c),
        "self-tree": lambda c: StandaloneDrafter(target, max_depth=3, top_k=2, max_nodes=6, compile_draft=c),
        "eagle-tree": lambda c: EagleDrafter(target, eagle, max_depth=3, top_k=3, max_nodes=8, compile_draft=c),
        "eagle3-tree": lambda c: EagleDrafter(target, eagle3, max_depth=3, top_k=2, max_nodes=6, compile_draft=c),
        "peagle-tree": lambda c: PEagleDrafter(target, peagle, max_depth=4, top_k=2, max_nodes=8, compile_draft=c),
        "dflash-tree": lambda c: DFlashDrafter(target, dflash, max_depth=4, top_k=2, max_nodes=8, compile_draft=c),
    }


def run(target, prompts, make, compile_draft: bool):
    """Each lane's tokens and every tree its drafter proposed (the lanes' group records them)."""
    from draftkit.drafters.dflash_lanes import DFlashLanes
    from draftkit.drafters.eagle_lanes import PEagleLanes
    from draftkit.drafters.lanes import DraftLanes

    trees, groups = [], (DraftLanes, PEagleLanes, DFlashLanes)  # one-forward drafters propose with their own method
    proposes = {g: g.propose for g in groups}

    def recording(propose):
        def recorded(self, states):
            out = propose(self, states)
            trees.append([None if t is None else (t.tokens.tolist(), t.host_parents) for t in out])
            return out
        return recorded
    for g in groups:
        g.propose = recording(proposes[g])
    try:
        out = generate_packed(target, prompts, [make(compile_draft) for _ in prompts], 24, eos_token_id=[],
                              budget="fixed", logprobs=False)
    finally:
        for g in groups:
            g.propose = proposes[g]
    return [o.tokens.tolist() for o in out.outputs], trees


@pytest.fixture
def eager_graphs(monkeypatch):
    """call_compiled runs the model's own forward: the static path without inductor's compile time."""
    monkeypatch.setattr(compiled, "compiled_forward", lambda m: m.__call__)


@pytest.mark.parametrize("kind", ["self-chain", "self-tree", "eagle-tree", "eagle3-tree", "peagle-tree", "dflash-tree"])
def test_static_draft_forwards_propose_what_eager_ones_do(models, kind, eager_graphs):
    """Padded to buckets on a fixed-size buffer, the lanes' draft forwards propose the trees the eager ones do, at
    every step, one sequence and a ragged batch; the output is plain decoding's either way."""
    target, make = models[0], makers(*models)[kind]
    for prompts in (prompts_of((12,)), prompts_of((5, 12, 30))):
        eager = run(target, prompts, make, False)
        assert run(target, prompts, make, True) == eager
        assert len(eager[1]) >= 4 and sum(len(t[0]) for step in eager[1] for t in step if t) >= 16  # trees compared


@pytest.mark.parametrize("arch", WINDOWED)
def test_static_draft_forwards_past_a_sliding_window_propose_what_eager_ones_do(arch, eager_graphs):
    """A draft of a sliding-window family (here the target as its own draft, several windows past its window):
    the capacity-wide static mask is narrowed per layer type as the eager one is, so the trees are the same."""
    target = windowed_model(arch, 8)
    prompts = [(torch.arange(40) * 5 + 3) % 61, (torch.arange(26) * 7 + 1) % 61]
    make = lambda c: StandaloneDrafter(target, max_depth=3, top_k=2, max_nodes=6, compile_draft=c)  # noqa: E731
    for group in (prompts[:1], prompts):
        eager = run(target, group, make, False)
        assert run(target, group, make, True) == eager


def test_lanes_warm_every_bucket_before_the_first_step(models, eager_graphs, caplog):
    """Forming the group compiles each bucket of up to COMPILED_ROWS rows (EAGLE-3-like drafts: each kind of input)
    for its lanes and buffer, said in one line; a second group of the same shape compiles nothing."""
    import logging

    model = tiny_model("llama", hidden=16, layers=1, seed=4)  # graphs are kept on the model: a model of its own
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        for _ in range(2):
            drafters = [StandaloneDrafter(model, max_depth=3, compile_draft=True) for _ in range(3)]
            for d, p in zip(drafters, prompts_of((5, 12, 30))):
                d.reset(p)
            group = StandaloneDrafter.draft_lanes(drafters)
    keys = {k for k in compiled.compiled_keys(model) if k[0] == 3}
    assert sorted(k[1] for k in keys) == [1, 2, 4, 8, 16] and COMPILED_ROWS == 16
    said = [r.getMessage() for r in caplog.records if "draft forward" in r.getMessage() and "3 lanes" in r.getMessage()]
    assert len(said) == 1 and f"{group.cache.capacity}-entry" in said[0], said


def test_a_batch_compiles_its_groups_graphs_and_no_lanes_own(eager_graphs, monkeypatch):
    """In a batch, lanes that draft as one group compile the group's graphs only (each lane's one-lane graphs, for a
    buffer of its own prompt's size, would go unused); lanes no group takes (a hybrid's members) compile theirs
    before the first step, as a lone drafter does at its reset."""
    from draftkit.drafters.hybrid import HybridDrafter
    from draftkit.drafters.lanes import DraftLanes
    from draftkit.drafters.suffix import SuffixDrafter
    from draftkit.verify.contract import NoDrafter

    model = tiny_model("llama", hidden=16, layers=1, seed=5)  # graphs are kept on the model: a model of its own
    prompts = prompts_of((5, 12, 30))
    alone = [generate_packed(model, [p], [NoDrafter()], 12, eos_token_id=[], logprobs=False).outputs[0].tokens.tolist()
             for p in prompts]
    lanes = [StandaloneDrafter(model, max_depth=3, compile_draft=True) for _ in prompts]
    out = generate_packed(model, prompts, lanes, 12, eos_token_id=[], logprobs=False).outputs
    assert [o.tokens.tolist() for o in out] == alone
    assert {k[0] for k in compiled.compiled_keys(model)} == {3}  # the group's three lanes; no one-lane graph

    events, warm, propose = [], DraftLanes.warm, DraftLanes.propose
    monkeypatch.setattr(DraftLanes, "warm", lambda self: events.append("warm") or warm(self))
    monkeypatch.setattr(DraftLanes, "propose", lambda self, st: events.append("propose") or propose(self, st))
    hybrids = [HybridDrafter([("suffix", SuffixDrafter(use_global=False)),
                              ("standalone", StandaloneDrafter(model, max_depth=3, compile_draft=True))], skip=False)
               for _ in prompts]
    out = generate_packed(model, prompts, hybrids, 12, eos_token_id=[], logprobs=False).outputs
    assert [o.tokens.tolist() for o in out] == alone
    assert events.index("propose") > len(prompts) - 1 and events[:len(prompts)] == ["warm"] * len(prompts)
    assert 1 in {k[0] for k in compiled.compiled_keys(model)}  # the members' own graphs, compiled ahead


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("kind", ["draft module", "causal LM"])
def test_draft_graph_outputs_are_copies_a_later_replay_cannot_rewrite(models, monkeypatch, graphs, kind):
    """With CUDA-graph outputs (a replay writes the memory an earlier one returned), each compiled draft forward
    starts a new step and returns a copy, so what a drafter keeps across its forwards stays as it was. Without
    (graphs=False on the same replaying stand-in) the first output is rewritten by the second forward."""
    from draftkit.verify.cache import KVBuffer
    from draftkit.verify.tree import MaskBuffer, run_model

    target, eagle = models[:2]
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(compiled, "compiled_forward", graph_replays_any)
    monkeypatch.setattr(compiled, "graph_outputs", lambda device: graphs)
    if kind == "draft module":
        model, layers, width = eagle, eagle.cache_config.num_hidden_layers, target.config.hidden_size
        inputs = lambda seed: dict(features=torch.randn(1, 2, width, generator=torch.Generator().manual_seed(seed)),  # noqa: E731
                                   embeds=torch.randn(1, 2, width, generator=torch.Generator().manual_seed(seed + 1)))
        out_of = lambda out: out  # noqa: E731
    else:
        model, layers = target, target.config.num_hidden_layers
        inputs = lambda seed: dict(input_ids=torch.tensor([[seed, seed + 1]]))  # noqa: E731
        out_of = lambda out: out.logits  # noqa: E731
    kv, masks = KVBuffer(layers, 1, 64, static=True), MaskBuffer(torch.float32, "cpu")
    run_model(model, kv, masks, None, None, False, **inputs(0))  # allocates the buffer (an eager forward)
    kv.drop_pending()
    first = out_of(run_model(model, kv, masks, None, None, True, **inputs(3)))
    kept = first.clone()
    run_model(model, kv, masks, None, None, True, **inputs(9))
    assert torch.equal(first, kept) == graphs
    assert len(marks) == (2 if graphs else 0)


def graph_replays_any(model):
    """A stand-in for a CUDA-graph compiled draft forward: every replay, of any shape, writes its output into the
    same memory (graphs of one pool share it; after a new step starts, any replay may rewrite what an earlier one
    returned). Outputs with logits: graph_replays (one buffer per shape)."""
    if hasattr(model, "get_output_embeddings"):
        return graph_replays(model)
    pool = model.__dict__.setdefault("_test_graph_pool", [torch.empty(0)])

    def replay(**kw):
        out = model(**kw)
        if pool[0].numel() < out.numel():
            pool[0] = torch.empty(out.numel(), dtype=out.dtype)
        return pool[0][:out.numel()].view(out.shape).copy_(out)
    return replay


@pytest.mark.slow
def test_compiled_drafts_never_recompile_after_the_warm_up():
    """Inductor for real: a compiled draft's run recompiles nothing after its lanes warmed (a graph compiled inside
    a step would be read as seconds of drafting), and its output is the eager draft's. Models of its own: the
    fast tests' stand-in marks graphs as compiled on the models it ran."""
    models = build_models()
    target = models[0]
    for kind in ("self-chain", "eagle3-tree", "peagle-tree", "dflash-tree"):
        make = makers(*models)[kind]
        prompts = prompts_of((12,))
        eager = run(target, prompts, make, False)
        make(True).reset(prompts[0])  # warms: every bucket for one lane and this buffer (graphs kept on the model)
        graphs = counters["stats"]["unique_graphs"]
        with torch._dynamo.config.patch(error_on_recompile=True):
            assert run(target, prompts, make, True) == eager
        assert counters["stats"]["unique_graphs"] == graphs


@pytest.mark.slow
def test_past_the_graph_limit_a_compiled_call_fails_in_one_line_instead_of_running_eagerly(monkeypatch):
    """Dynamo's own behaviour past its graphs per code object is to run eagerly without a word (a "compiled" run
    timed as compiled); call_compiled raises a one-line error naming the forward instead."""
    torch._dynamo.reset()  # this process's earlier graphs sit on the same transformers code objects
    monkeypatch.setattr(compiled, "RECOMPILE_LIMIT", 1)
    model = tiny_model("llama", seed=6)
    with torch.no_grad():
        compiled.call_compiled(model, ("a",), "a forward of 3 tokens", "", False, input_ids=torch.zeros(1, 3).long())
        with pytest.raises(RuntimeError, match="a forward of 5 tokens would be graph number 2"):
            compiled.call_compiled(model, ("b",), "a forward of 5 tokens", "", False,
                                   input_ids=torch.zeros(1, 5).long())
    torch._dynamo.reset()


def test_dflash_warms_each_bucket_once_and_keeps_no_graph_memory(models, eager_graphs, monkeypatch, caplog):
    """DFlash's static block: a lone drafter's reset compiles every bucket of up to COMPILED_ROWS new context
    entries for its buffer, said in one line, and a second drafter on the same draft compiles nothing; under CUDA
    graphs each block forward returns a copy, so a later replay cannot rewrite what an earlier one returned."""
    import logging

    from draftkit.drafters.dflash_static import run_static, static_block, static_inputs

    target = models[0]
    torch.manual_seed(10)  # graphs are kept on the draft: a draft of its own
    dflash = make_dflash_draft(target, block_size=5, mask_token_id=5, draft_layers=1, target_layers=[1, 3])
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        for _ in range(2):
            drafter = DFlashDrafter(target, dflash, compile_draft=True)
            drafter.reset(prompts_of((12,))[0])
    said = [r.getMessage() for r in caplog.records if "DFlash's block forward" in r.getMessage()]
    keys = compiled.compiled_keys(static_block(dflash))
    assert sorted(k[2] for k in keys) == [1, 2, 4, 8, 16] and {k[1:4:2] for k in keys} == {(1, drafter.cache.capacity)}
    assert len(said) == 1 and "1 lane," in said[0] and f"{drafter.cache.capacity}-entry" in said[0], said

    monkeypatch.setattr(compiled, "compiled_forward", graph_replays_any)
    monkeypatch.setattr(compiled, "graph_outputs", lambda device: True)
    monkeypatch.setattr("draftkit.drafters.dflash_static.graph_outputs", lambda device: True)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)
    width = len(dflash.config.target_layers) * dflash.config.hidden_size
    outs = []
    for seed in (0, 1):
        feats = torch.randn(1, 2, width, generator=torch.Generator().manual_seed(seed))
        inputs = static_inputs(drafter.cache, [0], feats, [4], dflash.config.block_size, 0)  # the sink: no state
        outs.append(run_static(dflash, drafter.cache, torch.randn(1, dflash.config.block_size, width // 2), inputs,
                               True))
    kept = outs[0].clone()
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[0], kept)
