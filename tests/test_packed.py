"""Several sequences decoded together (verify/packed.py): batches of prompts of unequal lengths with ragged
acceptance, and best-of-N over one shared prompt."""
import pytest
import torch

import draftkit as dk
from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.standalone import StandaloneDrafter
from tests.models import ARCHS, tiny_model
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate
from draftkit.verify.contract import NoDrafter
from draftkit.verify.packed import generate_packed

V = 8


def prompts_of(lengths, vocab=64):
    return [torch.randint(0, vocab, (k,), generator=torch.Generator().manual_seed(k)) for k in lengths]


@pytest.mark.parametrize("arch", ARCHS)
def test_each_row_of_a_batch_equals_that_row_decoded_alone(arch):
    target = tiny_model(arch)
    small = tiny_model(arch, hidden=16, layers=1, seed=1)
    prompts = prompts_of((3, 11, 6, 17))
    alone = [generate(target, p, max_new_tokens=24, eos_token_id=[]).tokens.tolist() for p in prompts]
    eos = alone[1][9]  # a token row 1 emits mid-way: rows now end at different steps
    refs = [generate(target, p, max_new_tokens=24, eos_token_id=[eos]).tokens.tolist() for p in prompts]
    assert len({len(r) for r in refs}) > 1
    makers = {"plain": None, "standalone-tree": lambda: StandaloneDrafter(small, max_depth=3, top_k=2, max_nodes=6),
              "self-chain": lambda: StandaloneDrafter(target, max_depth=4), "lookahead": lambda: LookaheadDrafter()}
    for name, make in makers.items():
        for budget in ("fixed", "auto"):
            outs = dk.generate_batch(target, prompts, make, max_new_tokens=24, eos_token_id=[eos], budget=budget)
            assert [o.tokens.tolist() for o in outs] == refs, (arch, name, budget)
            if name == "self-chain" and budget == "fixed":  # ragged: rows accept different amounts per step
                assert max(o.stats.tau for o in outs) > 2
    # the KV entries the batch committed: each row's prompt and tokens but its last (never fed), also after the
    # rows that ended first handed their KV rows on
    out = generate_packed(target, prompts, [NoDrafter() for _ in prompts], 24, eos_token_id=[eos], logprobs=False)
    assert out.kv_entries == sum(p.numel() + o.tokens.numel() - 1 for p, o in zip(prompts, out.outputs))


def exact_pair(model, prompt):
    """Exact P(t1, t2) at temperature 1 as a (V * V,) vector."""
    with torch.no_grad():
        p1 = model(input_ids=prompt[None]).logits[0, -1].softmax(-1)
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V)[:, None]], 1)
        p2 = model(input_ids=seqs).logits[:, -1].softmax(-1)
    return (p1[:, None] * p2).flatten()


def tv_of(pairs, exact):
    counts = torch.zeros(V * V)
    for a, b in pairs:
        counts[a * V + b] += 1
    return 0.5 * (counts / len(pairs) - exact).abs().sum().item()


def tv_bound(exact, n, quantile=0.999, trials=2000):
    """The TV distance that n exact samples stay under with probability `quantile` (simulated): a bound
    calibrated to the sampling noise, so the test fails on a biased sampler, not on bad luck."""
    draws = torch.multinomial(exact.expand(trials, -1), n, replacement=True,
                              generator=torch.Generator().manual_seed(0))
    counts = torch.zeros(trials, exact.numel()).scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float))
    tvs = 0.5 * (counts / n - exact).abs().sum(1)
    return torch.quantile(tvs, quantile).item()


def test_sampling_at_batch_size_three_follows_the_target():
    target = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=3)
    small = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=4)
    prompts = [torch.tensor([1, 2, 3, 1, 2]), torch.tensor([4, 4, 2]), torch.tensor([7, 1, 0, 3, 3, 5, 6])]
    exact = [exact_pair(target, p) for p in prompts]
    pairs = [[] for _ in prompts]
    n = 250
    for i in range(n):  # one seed per run: the loop gives the draft and the verifier independent streams of it
        outs = dk.generate_batch(target, prompts, lambda: StandaloneDrafter(small, max_depth=2),
                                 max_new_tokens=3, eos_token_id=[], sampling=Sampling(temperature=1.0), seed=i,
                                 budget="fixed")
        for row, out in enumerate(outs):
            pairs[row].append(out.tokens.tolist()[:2])
    for row in range(3):
        assert tv_of(pairs[row], exact[row]) < tv_bound(exact[row], n), row


def test_best_of_n_samples_follow_the_target_and_share_the_prompt():
    target = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=3)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    exact = exact_pair(target, prompt)
    per_sample = [[] for _ in range(4)]
    n = 200
    for i in range(n):
        res = dk.best_of_n(target, prompt, 4, drafter=lambda: LookaheadDrafter(ngram=2, window=2), max_new_tokens=3,
                           eos_token_id=[], seed=i, budget="fixed")
        for k, s in enumerate(res.samples):
            per_sample[k].append(s.tokens.tolist()[:2])
    for k in range(4):
        assert tv_of(per_sample[k], exact) < tv_bound(exact, n), k
    pooled = [pair for rows in per_sample for pair in rows]
    assert tv_of(pooled, exact) < tv_bound(exact, 4 * n)


def test_best_of_n_stores_the_prompt_once_and_picks_the_best():
    target = tiny_model("llama")
    prompt = torch.arange(1, 31)
    res = dk.best_of_n(target, prompt, 5, drafter="lookahead", max_new_tokens=12, eos_token_id=[], seed=0)
    lengths = [s.tokens.numel() for s in res.samples]
    p = prompt.numel()
    assert res.kv_entries == p + sum(l - 1 for l in lengths)  # p + N * l, not N * (p + l)
    assert res.kv_entries_independent == sum(p + l - 1 for l in lengths)
    assert res.best == max(range(5), key=res.rewards.__getitem__)
    custom = dk.best_of_n(target, prompt, 3, reward=lambda s: -s.tokens.float().sum().item(), max_new_tokens=6,
                          eos_token_id=[], seed=1)
    sums = [s.tokens.sum().item() for s in custom.samples]
    assert custom.best == sums.index(min(sums))


def test_a_batch_may_mix_drafters_that_read_hidden_states_with_drafters_that_do_not():
    """One lane's drafter reads the target's hidden states (EAGLE, layers 1 and -1), the others read none: each
    row still equals that row decoded alone."""
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter

    target = tiny_model("llama", layers=3)
    draft = EagleDraftModel.from_target(target, feature_layers=[1, -1])
    prompts = prompts_of((5, 9, 7))
    refs = [generate(target, p, max_new_tokens=12, eos_token_id=[]).tokens.tolist() for p in prompts]
    made = iter([EagleDrafter(target, draft, max_depth=3, top_k=2, max_nodes=6), LookaheadDrafter(), NoDrafter()])
    outs = dk.generate_batch(target, prompts, lambda: next(made), max_new_tokens=12, eos_token_id=[], budget="fixed")
    assert [o.tokens.tolist() for o in outs] == refs
    assert any(s.drafted for s in outs[0].stats.steps)  # the EAGLE lane drafted


def test_bad_calls_are_clear_errors():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="n must be"):
        dk.best_of_n(target, torch.tensor([1, 2]), 0)
    with pytest.raises(TypeError, match="fresh drafter"):
        dk.generate_batch(target, [torch.tensor([1])], LookaheadDrafter())


def test_equal_seeds_for_draft_and_verifier_stay_exact():
    """The loop's one seed gives the drafter and the verifier a stream each (salted apart): with a shared stream
    the draft would be tested by the uniforms that drew it (TV about 0.5)."""
    target = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=3)
    small = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=4)
    prompt = torch.tensor([1, 2, 3, 1, 2])
    exact = exact_pair(target, prompt)
    n = 250
    pairs = [generate(target, prompt, StandaloneDrafter(small, max_depth=2), max_new_tokens=3, eos_token_id=[],
                      sampling=Sampling(temperature=1.0), seed=i, budget="fixed").tokens.tolist()[:2] for i in range(n)]
    assert tv_of(pairs, exact) < tv_bound(exact, n)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_the_loop_runs_on_every_available_device(device):
    """Greedy equality and seeded sampling with a drafter on each device (generators live on the logits' device:
    a CPU generator cannot drive sampling on a CUDA tensor)."""
    target = tiny_model("llama").to(device)
    small = tiny_model("llama", hidden=16, layers=1, seed=1).to(device)
    prompt = torch.tensor([1, 2, 3, 4], device=device)
    ref = generate(target, prompt, max_new_tokens=16, eos_token_id=[]).tokens.tolist()
    for budget in ("fixed", "auto"):
        out = generate(target, prompt, StandaloneDrafter(small, max_depth=3, top_k=2, max_nodes=6), max_new_tokens=16,
                       eos_token_id=[], budget=budget)
        assert out.tokens.tolist() == ref
    sampled = [generate(target, prompt, StandaloneDrafter(small, max_depth=3, top_k=2, max_nodes=6),
                        max_new_tokens=12, eos_token_id=[], sampling=Sampling(temperature=0.9, top_p=0.95),
                        seed=3, budget="fixed").tokens.tolist() for _ in range(2)]
    # seeded and with a fixed budget: reproducible (an auto budget depends on timings, so its trees and with them
    # the draws may differ from run to run; the distribution does not)
    assert sampled[0] == sampled[1] and len(sampled[0]) == 12
    batch = dk.generate_batch(target, [prompt, prompt[:2]], lambda: LookaheadDrafter(), max_new_tokens=8,
                              eos_token_id=[], sampling=Sampling(temperature=0.9), seed=1)
    assert [o.tokens.numel() for o in batch] == [8, 8]


@pytest.mark.parametrize("batch", [1, 3])
def test_the_first_masks_checks_run_before_any_step_is_timed(batch, monkeypatch):
    """The tree-attention probe (and the layout read) of a model's first hand-built mask run before a drafting
    run's first timed step: inside it they read as verify time, and the controller priced drafting at 4.4 times
    its cost for the rest of the call (SmolLM2)."""
    import time

    from draftkit.verify import forward, tree_probe

    real = tree_probe.probe_tree_attention

    def slow_probe(model):
        time.sleep(1.5)  # a batch step's verify time is shared out among its 3 lanes
        return real(model)

    monkeypatch.setattr(forward, "probe_tree_attention", slow_probe)
    target = tiny_model("llama")
    outs = dk.generate_batch(target, prompts_of((5, 9, 7))[:batch], lambda: LookaheadDrafter(max_depth=4, max_nodes=8),
                             max_new_tokens=16, eos_token_id=[])
    steps = [s for o in outs for s in o.stats.steps]
    assert any(s.drafted for s in steps) and max(s.verify_s for s in steps) < 0.4
