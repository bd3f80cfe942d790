import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
# cost profiles measured by the budget controller go to a scratch folder, not the user's cache
os.environ.setdefault("DRAFTKIT_CACHE", tempfile.mkdtemp(prefix="draftkit-test-cache-"))
# two threads, or one per worker when pytest-xdist runs workers side by side on the cores
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, torch.get_num_threads())))

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def drafts_in_the_target_dtype(monkeypatch):
    """The tests' drafts run in their fp32 targets' dtype, as on a CPU without native bf16 products, so that the
    draft caches can be checked against recomputation to 1e-4; tests/test_draft_dtype.py runs them in bf16
    (drafters/draft_dtype.py: the default on a CPU with native bf16 products); trainings likewise run in fp32
    (train/loop.py takes bf16 autocast there; tests/test_training_precision.py runs each recipe in both)."""
    monkeypatch.setattr("draftkit.drafters.draft_dtype.native_bf16", lambda device: False)
