"""Static shapes and the compiled verify forward (verify/forward.py): buckets, the capacity-wide mask and KV
read, output identical to the dynamic path for every kind of drafter, sampling draws unchanged by padding,
and a compiled forward that compiles once per bucket and never again."""
import pytest
import torch
from torch._dynamo.utils import counters

import draftkit as dk
from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.verify.accept import Sampling
from draftkit.verify.contract import DraftTree, NoDrafter
from draftkit.verify.compiled import bucket
from draftkit.verify.forward import Verifier, static_verifier, warm_compiled
from draftkit.verify.packed import generate_packed, static_capacity
from tests.models import tiny_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama")


def makers(target):
    """One drafter of each kind: none, a chain, a tree from a second model, EAGLE's tree (a random draft),
    the n-gram drafters."""
    small = tiny_model("llama", hidden=16, layers=1, seed=1)
    torch.manual_seed(7)
    eagle = EagleDraftModel.from_target(target)
    return {
        "plain": NoDrafter,
        "self-chain": lambda: StandaloneDrafter(target, max_depth=4),
        "standalone-tree": lambda: StandaloneDrafter(small, max_depth=3, top_k=2, max_nodes=6),
        "eagle-tree": lambda: EagleDrafter(target, eagle, max_depth=3, top_k=3, max_nodes=8),
        "lookahead": LookaheadDrafter,
        "suffix": lambda: SuffixDrafter(use_global=False),
    }


def prompts_of(lengths):
    return [torch.randint(0, 64, (k,), generator=torch.Generator().manual_seed(k)) for k in lengths]


def tokens(target, prompts, make, **kw):
    out = generate_packed(target, prompts, [make() for _ in prompts], 30, eos_token_id=[], budget="fixed",
                          logprobs=False, **kw)
    return [o.tokens.tolist() for o in out.outputs]


def test_buckets_double_to_64_then_grow_by_64():
    assert [bucket(q) for q in (1, 2, 3, 5, 8, 9, 33, 64, 65, 128, 129)] == [1, 2, 4, 8, 8, 16, 64, 64, 128, 128, 192]


def test_static_tree_logits_equal_the_dynamic_path(target):
    """The padded, capacity-wide forward gives the logits of the exact-size one for a branched tree."""
    prompt = torch.arange(9) % 64
    tree = DraftTree.from_lists([3, 4, 5, 6, 7], [-1, -1, 0, 0, 2]).validate()
    logits = []
    for ver in (Verifier(target, 32), Verifier(target, 32, static=True)):
        ver.forward(prompt[:-1], DraftTree.empty())
        ver.commit(8, [])
        logits.append(ver.forward(prompt[-1:], tree)[0])
    assert logits[1].shape == (6, 64)  # q = 6 rows run as a bucket of 8; the padding rows' logits are cut
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["plain", "self-chain", "standalone-tree", "eagle-tree", "lookahead", "suffix"])
def test_static_shapes_give_the_same_greedy_output(target, kind):
    make = makers(target)[kind]
    prompts = prompts_of((5, 12))
    batch = tokens(target, prompts, make)
    assert tokens(target, prompts, make, static=True) == batch  # a batch: lanes of different lengths, one bucket
    assert tokens(target, prompts[1:], make, static=True) == batch[1:]  # one sequence


def test_static_buffers_are_kept_on_the_model_and_only_grow():
    target = tiny_model("llama", seed=1)
    ver = static_verifier(target, 40)
    assert ver.kv.capacity == 64 and static_verifier(target, 50) is ver  # powers of two, reused
    assert static_verifier(target, 100).kv.capacity == 128 and static_verifier(target, 40).kv.capacity == 128


@pytest.mark.parametrize("kind", ["plain", "standalone-tree"])
def test_padding_changes_no_sampled_draw(target, kind):
    """Same seed, static or not: the same samples (padding rows draw nothing and shift no random stream)."""
    make = makers(target)[kind]
    prompts = prompts_of((7,))
    for seed in range(3):
        kw = dict(sampling=Sampling(temperature=1.0), seed=seed)
        ref = tokens(target, prompts, make, **kw)
        assert tokens(target, prompts, make, static=True, **kw) == ref, seed


def test_compiled_forward_is_identical_and_never_recompiles():
    """Plain decoding compiles one bucket (q = 1) once; a second run, a shorter prompt on the buffer the first
    left on the model, recompiles nothing."""
    target = tiny_model("llama", seed=2)  # a model of its own: compiled graphs are kept on the model
    prompts = prompts_of((19, 6))
    ref = [dk.generate(target, p, max_new_tokens=12, eos_token_id=[]).tokens.tolist() for p in prompts]
    graphs = counters["stats"]["unique_graphs"]
    assert dk.generate(target, prompts[0], max_new_tokens=12, eos_token_id=[], compile=True).tokens.tolist() == ref[0]
    assert counters["stats"]["unique_graphs"] == graphs + 1
    with torch._dynamo.config.patch(error_on_recompile=True):
        out = dk.generate(target, prompts[1], max_new_tokens=12, eos_token_id=[], compile=True)
    assert out.tokens.tolist() == ref[1]
    assert counters["stats"]["unique_graphs"] == graphs + 1


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["self-chain", "eagle-tree", "lookahead", "suffix"])
def test_compiled_drafters_are_identical_after_one_warm_up(kind):
    """Every bucket compiled up front (what compare.py --compile does); then no drafter's run recompiles."""
    target = tiny_model("llama", seed=3)
    make = makers(target)[kind]
    prompts = prompts_of((5, 12))
    ref = tokens(target, prompts, make)
    drafter = make()
    widest = drafter.budget_cap.max_nodes
    warm_compiled(target, static_capacity(5 + 12, 2, 30, widest), 2 * (widest + 2),
                  (bool(getattr(drafter, "hidden_layers", ())),))
    with torch._dynamo.config.patch(error_on_recompile=True):
        assert tokens(target, prompts, make, compile=True) == ref
        assert tokens(target, prompts[1:], make, compile=True) == ref[1:]


def graph_replays(model):
    """A stand-in for a CUDA-graph compiled forward: every replay of a bucket writes its logits into the same
    memory, as a graph's static output buffer does (kept on the model, as compiled_forward keeps its function)."""
    buffers = model.__dict__.setdefault("_test_graph_buffers", {})

    def replay(**kw):
        out = model(**kw)
        buf = buffers.setdefault(tuple(out.logits.shape), torch.empty_like(out.logits))
        out.logits = buf.copy_(out.logits)
        return out
    return replay


@pytest.mark.parametrize("owned", [True, False])
def test_graph_outputs_kept_past_a_step_are_copies(target, monkeypatch, owned):
    """With graph outputs (CUDA graphs), each step is marked and the logits the loop keeps are copies: a later
    replay leaves them as they were. Without the copies (owned=False) the same two steps show the aliasing."""
    import draftkit.verify.compiled as fw

    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    monkeypatch.setattr(fw, "compiled_forward", graph_replays)
    ver = Verifier(target, 64, compile=True)
    ver.graph_outputs = owned
    ver.forward(torch.arange(6) % 64, DraftTree.empty())
    ver.commit(6, [])
    first, _ = ver.forward(torch.tensor([7]), DraftTree.chain([8, 9, 10]))
    kept = first.clone()
    ver.kv.drop_pending()
    ver.forward(torch.tensor([11]), DraftTree.chain([12, 13, 14]))
    assert torch.equal(first, kept) == owned
    assert len(marks) == (2 if owned else 0)


def test_a_graph_that_compiles_inside_a_call_says_so_once_with_or_without_hidden_states(monkeypatch, caplog):
    """A forward that hands hidden states over is a graph of its own: its first use of a bucket is announced too
    (it compiled silently for seconds inside a call), and neither is announced twice."""
    import logging

    import draftkit.verify.compiled as fw

    model = tiny_model("llama", seed=5)  # compiled graphs (and what was announced) are kept on the model
    monkeypatch.setattr(fw, "compiled_forward", lambda m: m.__call__)  # the path, without inductor's compile time
    ver = Verifier(model, 64, compile=True)
    ver.forward(torch.arange(6) % 64, DraftTree.empty())
    ver.commit(6, [])
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        for layers in ((), (-1,), (), (-1,)):
            ver.forward(torch.tensor([7]), DraftTree.chain([8, 9, 10]), layers)
            ver.kv.drop_pending()
    said = [r.getMessage() for r in caplog.records if "compiled the verify forward" in r.getMessage()]
    assert len(said) == 2 and "with hidden states" in said[1] and "hidden" not in said[0], said
