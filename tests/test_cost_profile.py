"""verify/cost_profile.py: the verify cost curve is measured once per machine + model + context, said when a call
measures it, and read from the cache after."""


def test_a_measured_cost_profile_is_said_once_and_then_read_from_the_cache(tmp_path, monkeypatch, caplog):
    """The one call that measures the verify curve says so (a first call's time is not decoding speed); the next
    call reads the saved profile and says nothing."""
    import logging

    from draftkit.verify.cost_profile import CostProfile
    from tests.models import tiny_model

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model = tiny_model("llama")
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        first = CostProfile.for_model(model, 40)
    message = caplog.records[0].getMessage()
    assert len(caplog.records) == 1 and "verify cost curve (eager forward) at context 128" in message
    assert f"saved under {tmp_path / 'cost'}" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        again = CostProfile.for_model(model, 40)
    assert not caplog.records and again.ratios == first.ratios


def test_a_static_or_compiled_run_is_priced_on_its_own_forward_path(tmp_path, monkeypatch):
    """A static-shaped run (as compile=True runs, without compiling) with the auto budget: the profile is measured on the run's own static
    verifier (saved apart from the eager one), the verifier is empty again for the run, and output is unchanged."""
    import torch

    import draftkit as dk
    from draftkit.drafters.lookahead import LookaheadDrafter
    from draftkit.verify import forward
    from draftkit.verify.cost_profile import CostProfile
    from draftkit.verify.packed import generate_packed
    from tests.models import tiny_model

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model = tiny_model("llama")
    measured_on = []
    real = CostProfile.measure.__func__
    monkeypatch.setattr(CostProfile, "measure", classmethod(
        lambda cls, m, ctx, *a, verifier=None, **kw: measured_on.append(verifier) or real(cls, m, ctx, *a,
                                                                                          verifier=verifier, **kw)))
    prompt = torch.tensor([1, 2, 3, 4] * 6)
    plain = dk.generate(model, prompt, max_new_tokens=24, eos_token_id=[]).tokens
    drafter = LookaheadDrafter()
    out = generate_packed(model, [prompt], [drafter], max_new_tokens=24, eos_token_id=[], static=True).outputs[0]
    assert torch.equal(out.tokens, plain)
    static = model._draftkit_static
    assert measured_on == [static] and drafter._auto_budget.profile.path == "static"
    cap = drafter.budget_cap.max_nodes  # only the sizes (buckets) the run can use, up to the first holding its cap
    sizes = drafter._auto_budget.profile.sizes
    assert sizes[-1] >= cap and (len(sizes) == 2 or sizes[-2] < cap), (sizes, cap)
    eager = dk.generate(model, prompt, LookaheadDrafter(), max_new_tokens=24, eos_token_id=[])
    assert torch.equal(eager.tokens, plain) and measured_on[-1] is None  # its own (eager) profile
    assert len(list((tmp_path / "cost").glob("*.json"))) == 2
    assert forward.static_verifier(model, 8) is static  # the run's buffer, kept for the next run


def test_processes_saving_one_profile_at_once_never_collide(tmp_path):
    """Two benchmarks measuring the same model and machine save the same file: each writes a scratch file of its
    own, so neither fails on the other's rename nor leaves a half-written file."""
    import json
    import threading

    from draftkit.files import write_text_atomically

    file, errors = tmp_path / "cost" / "profile.json", []

    def save(i):
        try:
            for k in range(40):
                write_text_atomically(file, json.dumps({"writer": i, "k": k, "curve": list(range(200))}))
        except Exception as e:  # noqa: BLE001 - collected for the assertion below
            errors.append(e)
    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(file.read_text())["curve"] == list(range(200))
    assert [p.name for p in file.parent.iterdir()] == ["profile.json"]


def test_a_later_context_is_measured_at_the_coarse_sizes_with_the_nearest_padding(tmp_path, monkeypatch, caplog):
    """The first eager curve of a model is dense (every size up to PADDED_REACH, its padding found there); at another
    context bucket only PROFILE_SIZES are timed, fewer times, and the nearest bucket's padding is taken, each size
    priced at what it runs as. A benchmark's refresh measures the dense curve again, REPS times."""
    import logging

    from draftkit.verify import cost_profile as cp
    from tests.models import tiny_model

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model = tiny_model("llama")
    calls = []
    real = cp.CostProfile.measure.__func__
    monkeypatch.setattr(cp.CostProfile, "measure", classmethod(
        lambda cls, m, ctx, *a, **kw: calls.append((ctx, kw["reps"])) or real(cls, m, ctx, *a, **kw)))
    monkeypatch.setattr(cp, "padding", lambda seconds: {2: 3, 5: 8})  # whatever this machine's BLAS does
    first = cp.CostProfile.for_model(model, 40)
    assert first.sizes == list(range(1, cp.PADDED_REACH + 1)) + [32, 64] and first.padded == [[2, 3], [5, 8]]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="draftkit"):
        later = cp.CostProfile.for_model(model, 200)
    assert calls == [(128, cp.REPS_FIRST), (256, cp.REPS_AT_NEXT)]  # inside a user's call: fewer timings
    assert "at context 256" in caplog.records[0].getMessage() and "padding measured at context 128" in \
        caplog.records[0].getMessage()
    assert later.context == 256 and later.sizes == list(cp.PROFILE_SIZES) and later.padded == first.padded
    timed = cp.CostProfile(later.plain_s, later.sizes, later.unpadded)  # as measured, before padding
    assert later.ratios[1] == max(1.0, timed.c(3), later.ratios[0])  # 2 nodes run as 3: priced so
    assert all(b >= a for a, b in zip(later.ratios, later.ratios[1:]))
    dense = cp.CostProfile.for_model(model, 200, refresh=True)
    assert calls[-1] == (256, cp.REPS) and len(dense.sizes) == len(first.sizes)


def test_the_timed_context_repeats_a_short_prompts_entries():
    """A cost profile runs a forward over PROMPT_SEED tokens and repeats their entries up to the context it times
    (what attention costs does not depend on what the keys hold)."""
    import torch

    from draftkit.verify.contract import DraftTree
    from draftkit.verify.forward import Verifier
    from tests.models import tiny_model

    ver = Verifier(tiny_model("llama"), capacity=16)
    ver.forward(torch.arange(1, 6), DraftTree.empty().validate())
    ver.commit(5, [])
    ver.kv.tile(13)
    assert ver.kv.lengths == [13] and ver.kv.capacity >= 13 and ver.cache_len == 13
    for layer in ver.kv.layers:
        for held in (layer.keys, layer.values):
            assert torch.equal(held[0, :, 5:13], held[0, :, [i % 5 for i in range(5, 13)]])
    logits, _ = ver.forward(torch.tensor([7]), DraftTree.chain([3, 4]).validate())  # a step on top runs
    assert logits.shape == (3, 64)


def test_a_model_of_learned_positions_is_timed_within_them(tmp_path, monkeypatch):
    """GPT-2's positions end at n_positions: a 300-token prompt falls in the 512 bucket of a 512-position model, and
    timing trees on top of 512 entries indexed past its position table (the first drafted call died). The trees
    are timed on a context that leaves them room; the profile keeps its bucket."""
    import torch

    import draftkit as dk
    from draftkit.verify.cost_profile import CostProfile
    from tests.models import tiny_model

    monkeypatch.setenv("DRAFTKIT_CACHE", str(tmp_path))
    model = tiny_model("gpt2", max_len=512)
    prof = CostProfile.for_model(model, 300)
    assert prof.context == 512 and prof.sizes[-1] == 64
    prompt = torch.arange(1, 301) % 60
    plain = dk.generate(model, prompt, None, 24, eos_token_id=[]).tokens
    assert torch.equal(dk.generate(model, prompt, dk.make_drafter("lookahead", model), 24, eos_token_id=[]).tokens,
                       plain)
    tiny = tiny_model("gpt2", max_len=40)  # fewer positions than the largest tree: the sizes that fit
    assert CostProfile.measure(tiny, 128, reps=1).sizes[-1] == 32
