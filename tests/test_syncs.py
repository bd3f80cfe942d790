"""Host <-> device transfers per decoding step, counted by patching verify/sync.py (the loop's own upload and read)
and tensor reads / uploads (eval/syncs.py, conservative on a CPU: every tensor read counts).

Per step, for every drafter, greedy and sampled: exactly one upload (the step's layout) and one read (every lane's
accepted path and bonus, with argmax p of every row). Per-run transfers (the prompt, the prefill) are taken out by
counting two runs of different lengths and dividing the difference by the difference in steps.

The drafters' own transfers per step, as measured here (tests/test_syncs.py asserts the first four rows):
  plain, lookahead, prompt lookup, suffix      0 reads, 0 uploads (they learn from the host copies the loop reads)
  standalone and EAGLE chains                  0 (the chain's tokens stay on the device: its topology is known)
  EAGLE-2 / standalone top-k trees (greedy)    0 (the tree is chosen on the device; its topology comes back with
                                               the step's read); the standalone draft's KV rollback may upload
                                               its kept rows
  Medusa (greedy)                              0 (the tree stays on the device; its layout is uploaded once)
  sampled trees (standalone, EAGLE, Medusa)    about 2 reads and 2-5 uploads: the draws without replacement are
                                               laid out on the host level by level (drafters/tree_search.py)
"""
import pytest
import torch

from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads
from draftkit.drafters.standalone import StandaloneDrafter
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.eval.syncs import SyncCounter
from draftkit.verify.accept import Sampling
from draftkit.verify.contract import NoDrafter
from draftkit.verify.decode import generate
from draftkit.verify.tree_probe import probe_tree_attention
from tests.models import tiny_model

TARGET = tiny_model("llama")
probe_tree_attention(TARGET)  # once per model, before any counting
SMALL = tiny_model("llama", hidden=16, layers=1, seed=1)
PROMPT = torch.tensor([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])
MAKERS = {
    "plain": NoDrafter,
    "lookahead": LookaheadDrafter,
    "prompt-lookup": lambda: LookaheadDrafter(window=0),
    "suffix": lambda: SuffixDrafter(use_global=False),
    "standalone-chain": lambda: StandaloneDrafter(SMALL, max_depth=3),
    "standalone-tree": lambda: StandaloneDrafter(SMALL, max_depth=3, top_k=2, max_nodes=6),
    "eagle-chain": lambda: EagleDrafter(TARGET, EagleDraftModel.from_target(TARGET), max_depth=3, top_k=1),
    "eagle-tree": lambda: EagleDrafter(TARGET, EagleDraftModel.from_target(TARGET), max_depth=3, top_k=2, max_nodes=6),
    "medusa": lambda: MedusaDrafter(TARGET, MedusaHeads(32, 64, 3).init_from_lm_head(TARGET.get_output_embeddings()),
                                    [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]),
}
HOST_ONLY = ("plain", "lookahead", "prompt-lookup", "suffix")


def per_step(name: str, sampling: Sampling) -> dict[str, float]:
    """Transfers per decoding step, past what a run pays once."""
    drafter = MAKERS[name]()
    runs = []
    generate(TARGET, PROMPT, drafter, max_new_tokens=4, eos_token_id=[], budget="fixed")  # one-time costs (the probe)
    for n in (8, 32):
        with SyncCounter(drafter, device_only=False) as counter:
            out = generate(TARGET, PROMPT, drafter, max_new_tokens=n, eos_token_id=[], budget="fixed",
                           sampling=sampling, seed=0)
        runs.append((len(out.stats.steps), counter.counts))
    (s1, c1), (s2, c2) = runs
    assert s2 > s1
    return {k: (c2[k] - c1[k]) / (s2 - s1) for k in set(c1) | set(c2)}


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize("name", list(MAKERS))
def test_one_upload_and_one_read_per_step(name, greedy):
    counts = per_step(name, Sampling() if greedy else Sampling(temperature=1.0))
    assert counts.get("loop_upload") == pytest.approx(1.0) and counts.get("loop_read") == pytest.approx(1.0), counts
    if name in HOST_ONLY:
        assert sum(v for k, v in counts.items() if not k.startswith("loop")) == pytest.approx(0.0), counts
    elif greedy and name != "medusa":  # one read of the drafter's own tree (medusa's tokens stay on the device)
        assert counts.get("drafter_read", 0) <= 1.0 and counts.get("drafter_upload", 0) <= 0.5, counts


def test_the_counter_sees_a_read_the_loop_did_not_route():
    """A drafter that reads the logits back every update is caught (the counter can fail)."""
    class Reader(LookaheadDrafter):
        def update(self, result):
            result.logits.argmax(-1).tolist()
            super().update(result)

    MAKERS["reader"] = Reader
    try:
        assert per_step("reader", Sampling()).get("drafter_read", 0) >= 1.0
    finally:
        del MAKERS["reader"]


def test_the_counter_counts_synchronizes(monkeypatch):
    """A synchronize is a wait the GPU check counts beside the reads (eval/gpu_check.py)."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    with SyncCounter(device_only=True) as counter:
        torch.cuda.synchronize()
        torch.cuda.synchronize("cuda:0")
    assert counter.counts["synchronize"] == 2 and calls == [None, "cuda:0"]
    torch.cuda.synchronize()
    assert counter.counts["synchronize"] == 2  # restored on exit
