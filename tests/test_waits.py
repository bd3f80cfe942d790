"""Waits of the host for the device per decoding step, on the device code path run on a CPU (eval/syncs.DeviceShim):
the loop's timing events, its one read, every tensor read, blocking upload, synchronize and data-dependent shape.

Per step, past what a run pays once (two runs of different lengths, the difference over the difference in steps),
greedy and sampled, every drafter and a batch: one wait. Trees (EAGLE-2, standalone; top-k greedy, drawn without
replacement when sampling) are chosen on the device and their topology comes back with the verifier's read
(DraftTree.on_device_topology); Medusa's layout is known on the host, its sampled draws past a head's support stay
in the tree (never accepted) rather than being read to drop them.
The phase timings (StepClock stamps) never wait: they are read after the step's one read."""
import pytest
import torch

import draftkit as dk
from draftkit.eval.syncs import DeviceShim
from draftkit.verify.accept import Sampling
from draftkit.verify.decode import generate
from draftkit.verify.timing import StepClock
from tests.test_syncs import MAKERS, PROMPT, TARGET


def waits_per_step(run) -> tuple[dict[str, float], list]:
    """Waits per step of `run(n) -> (outputs, drafters)` past the per-run ones, by kind; and the last run's stats."""
    counts = []
    for n in (8, 32):
        outputs, drafters = run(n, None)
        with DeviceShim(*drafters) as shim:
            outputs, _ = run(n, drafters)
        counts.append((max(len(o.stats.steps) for o in outputs), shim.waits))
    (s1, w1), (s2, w2) = counts
    assert s2 > s1
    return {k: (w2[k] - w1[k]) / (s2 - s1) for k in set(w1) | set(w2)}, [o.stats for o in outputs]


def single(name: str, sampling: Sampling):
    def run(n, drafters):
        drafters = drafters or [MAKERS[name]()]
        out = generate(TARGET, PROMPT, drafters[0], max_new_tokens=n, eos_token_id=[], budget="fixed",
                       sampling=sampling, seed=0)
        return [out], drafters
    return run


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("name", list(MAKERS))
def test_waits_per_step_on_the_device_path(name, greedy):
    waits, stats = waits_per_step(single(name, Sampling() if greedy else Sampling(temperature=1.0)))
    total = sum(waits.values())
    assert waits.get("synchronize", 0) == 0 and waits.get("event_wait", 0) == 0, waits  # timing costs no wait
    assert total == pytest.approx(1.0), waits
    steps = [s for s in stats[0].steps if not s.prefill]
    assert all(s.verify_s > 0 for s in steps), "every step's verify time is read from its stamps"
    assert sum(s.draft_s for s in steps) > 0


@pytest.mark.parametrize("method", ["none", "eagle", "eagle-tree", "suffix", "medusa"])
@pytest.mark.parametrize("greedy", [True, False])
def test_a_batch_waits_once_per_step(method, greedy):
    prompts = [PROMPT, PROMPT[:7], torch.tensor([5, 6, 7, 8, 5, 6, 7, 8, 5])]

    def run(n, drafters):
        made = []

        def make():  # the same drafters again in the counted run (their one-time costs paid)
            made.append(drafters[len(made)] if drafters else
                        MAKERS[{"eagle": "eagle-chain", "none": "plain"}.get(method, method)]())
            return made[-1]
        outs = dk.generate_batch(TARGET, prompts, make, max_new_tokens=n, eos_token_id=[], budget="fixed", seed=0,
                                 sampling=Sampling() if greedy else Sampling(temperature=1.0))
        return outs, made

    waits, _ = waits_per_step(run)
    assert sum(waits.values()) == pytest.approx(1.0), waits


def test_the_shim_counts_what_a_gpu_would_wait_for():
    """A read, a synchronize, a boolean index and an incomplete event each count: the counts above can fail."""
    clock = StepClock("cpu")
    with DeviceShim() as shim:
        clock = StepClock("cpu")  # inside: the device path (events)
        assert clock.events
        a = clock.stamp()
        b = clock.stamp()
        x = torch.arange(4)
        x[x > 1]  # size depends on the data
        torch.cuda.synchronize()
        c = clock.stamp()
        assert clock.seconds(a, b) >= 0  # complete: recorded before the waits above
        assert shim.waits["event_wait"] == 0
        clock.seconds(b, c)  # c was recorded after every wait: reading it waits
        int(x[0])
    assert shim.waits == {"shape": 1, "synchronize": 1, "event_wait": 1, "read": 1}
    with pytest.raises(RuntimeError, match="not yet complete"):
        with DeviceShim():
            clock = StepClock("cpu")
            clock.stamp().elapsed_time(clock.stamp())
    assert not StepClock("cpu").events  # outside: the host path again


def test_a_drafter_that_reads_every_step_is_caught():
    class Reader(type(MAKERS["lookahead"]())):
        def update(self, result):
            result.logits.max().item()
            super().update(result)

    MAKERS["reader"] = Reader
    try:
        waits, _ = waits_per_step(single("reader", Sampling()))
        assert sum(waits.values()) >= 2.0, waits
    finally:
        del MAKERS["reader"]
