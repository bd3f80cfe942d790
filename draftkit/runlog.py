"""A training run's held-out history: train/loop.py appends to it, eval/plot_scaling.py reads it."""
from __future__ import annotations

import json
import os

HISTORY_FILE = "heldout_history.jsonl"


def read_history(output_dir: str) -> list[dict]:
    """The run's evaluations in step order, one per step (a resumed run's repeats replaced by the newest)."""
    path = os.path.join(output_dir, HISTORY_FILE)
    if not os.path.exists(path):
        return []
    rows = {}
    with open(path) as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                rows[row["step"]] = row
    return [rows[k] for k in sorted(rows)]


def append_history(output_dir: str, row: dict) -> None:
    with open(os.path.join(output_dir, HISTORY_FILE), "a") as fh:
        fh.write(json.dumps(row) + "\n")
