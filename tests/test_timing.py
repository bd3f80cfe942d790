"""Step timings: readings wait for the model's own device, and a lane in a batch is charged its own drafting
and its share of the forward, not the batch's."""
import time

import pytest
import torch

import draftkit as dk
from draftkit.verify.contract import DraftTree
from draftkit.verify.timing import StepClock
from tests.models import tiny_model


def test_the_clock_waits_for_the_model_s_own_device(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    StepClock("cuda:1").now()
    assert waited == [torch.device("cuda:1")]  # not the current device
    StepClock("cpu").now()
    assert len(waited) == 1


class SlowChain:
    """Proposes a wrong one-node chain after sleeping: a drafter whose time is easy to recognise."""

    hidden_layers = ()
    budget_cap = dk.Budget(1, 1)

    def __init__(self, seconds):
        self.seconds = seconds

    def reset(self, prompt):
        pass

    def propose(self, state):
        time.sleep(self.seconds)
        return DraftTree.chain([0])

    def update(self, result):
        pass


def test_a_lane_is_charged_its_own_drafting_and_its_share_of_the_forward():
    target = tiny_model("llama")
    prompts = [torch.arange(1, 6), torch.arange(2, 9)]
    makers = iter([lambda: SlowChain(0.02), lambda: dk.NoDrafter()])
    outs = dk.generate_batch(target, prompts, lambda: next(makers)(), max_new_tokens=6, eos_token_id=[],
                             budget="fixed")
    slow, plain = (o.stats.decode_steps for o in outs)
    assert all(s.draft_s >= 0.02 for s in slow if s.drafted)  # the last step is plain: one token left
    assert all(s.draft_s < 0.01 for s in plain)
    for a, b in zip(slow, plain):  # the slow lane fed 1 + a.drafted of the forward's tokens, the plain lane 1
        assert a.lanes == b.lanes == 2
        assert a.verify_s == pytest.approx((1 + a.drafted) * b.verify_s)


class SlowUpdate(SlowChain):
    """Sleeps in update instead: time the loop stamps after the step's read."""

    def propose(self, state):
        return DraftTree.chain([0])

    def update(self, result):
        time.sleep(self.seconds)


@pytest.mark.parametrize("device_path", [False, True])
def test_stamps_read_after_the_step_s_read_charge_every_phase(device_path):
    """On the device path (timing events, read after the step's one read) as on the host: a lane's drafting and
    its update, the latter owed to its next step and the last one settled at the end, are all charged."""
    from draftkit.eval.syncs import DeviceShim

    target = tiny_model("llama")
    drafters = [SlowChain(0.02), SlowUpdate(0.01)]
    with DeviceShim(*drafters) if device_path else _nothing():
        outs = dk.generate_batch(target, [torch.arange(1, 6), torch.arange(2, 9)], lambda: drafters.pop(0),
                                 max_new_tokens=6, eos_token_id=[], budget="fixed")
    slow, updating = (o.stats.decode_steps for o in outs)
    assert all(s.draft_s >= 0.02 for s in slow if s.drafted)
    # each step's update, charged to the lane's next step (the last one to itself): none lost (the prefill's
    # update, a one-time cost, is not a step's)
    assert all(s.draft_s >= 0.01 for s in updating[1:])
    assert sum(s.draft_s for s in updating) >= 0.01 * len(updating)
    assert all(s.verify_s > 0 for s in slow + updating)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass
