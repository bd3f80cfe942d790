"""What every training recipe shares: typed configs, the accelerate loop pieces,
W&B tracking, and checkpoints that survive interruption.

A recipe is a dataclass whose fields are both the YAML keys under recipes/ and
the command-line flags (`--config recipes/x.yaml --max_steps 10`); flags win.
Checkpoints hold model, optimizer, scheduler and RNG (accelerate's save_state)
plus the step; the data position is the step itself (see data.BlockSampler).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
import yaml


def field(default, help: str):
    """A config field with help text for --help."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass
class DataConfig:
    """Fields every recipe shares: where the text comes from, how it is batched, tracking."""

    corpus: str = field("stdlib", "stdlib, a folder of .py files, a .txt/.json/.jsonl file, or a hub dataset name")
    text_column: str = field("text", "text column of a json or hub dataset")
    cache_dir: str = field("runs/cache", "where packed token streams (and cached features) are kept (empty: none)")
    seq_len: int = field(256, "training block length in tokens")
    batch_size: int = field(8, "blocks per optimizer step")
    wandb: bool = field(True, "log to Weights & Biases through accelerate (offline unless WANDB_MODE is set)")


def parse_config(cls, argv=None, description: str = ""):
    """Build `cls` from --config YAML, then command-line overrides."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML recipe under recipes/ (its keys are the flags below)")
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, type) else eval(f.type, {}, {})  # noqa: S307 - our own annotations
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if kind is bool:
            parser.add_argument(f"--{f.name}", type=lambda s: s.lower() in ("1", "true", "yes"),
                                default=None, help=f"{f.metadata.get('help', '')} (default: {default})")
        elif kind in (list, dict):
            parser.add_argument(f"--{f.name}", type=json.loads, default=None,
                                help=f"{f.metadata.get('help', '')} (JSON; default: {default})")
        else:
            parser.add_argument(f"--{f.name}", type=kind, default=None,
                                help=f"{f.metadata.get('help', '')} (default: {default})")
    args = parser.parse_args(argv)
    values: dict[str, Any] = {}
    if args.config:
        values.update(load_recipe(args.config, cls))
    values.update({k: v for k, v in vars(args).items() if k != "config" and v is not None})
    return cls(**values)


def load_recipe(path: str, cls) -> dict:
    """The YAML's keys, checked against the recipe's fields (a typo is an error, not a silent default)."""
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown} for {cls.__name__}; known: {sorted(names)}")
    return data


def make_accelerator(cfg, project: str):
    """An Accelerator logging to W&B (offline unless WANDB_MODE says otherwise)."""
    from accelerate import Accelerator

    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    os.makedirs(cfg.output_dir, exist_ok=True)
    trackers = ["wandb"] if cfg.wandb else []
    acc = Accelerator(log_with=trackers or None, project_dir=cfg.output_dir)
    if trackers:
        acc.init_trackers(project, config=dataclasses.asdict(cfg),
                          init_kwargs={"wandb": {"dir": cfg.output_dir, "name": Path(cfg.output_dir).name}})
    return acc


def finish(acc) -> None:
    """End tracking; also stop W&B's background service so that a later run in the same
    process (tests, notebooks) starts a fresh one and writes its own run file."""
    acc.end_training()
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


def cosine_lr(step: int, total: int, warmup: int, min_ratio: float = 0.1) -> float:
    """LR multiplier: linear warmup, then cosine decay to min_ratio."""
    if step < warmup:
        return (step + 1) / max(1, warmup)
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


class Checkpoints:
    """step_N folders under output_dir/checkpoints, newest one resumed; older ones pruned."""

    def __init__(self, output_dir: str, keep: int = 2):
        self.root = Path(output_dir) / "checkpoints"
        self.keep = keep

    def latest(self) -> Path | None:
        steps = sorted(self.root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
        done = [p for p in steps if (p / "step.json").exists()]
        return done[-1] if done else None

    def save(self, acc, step: int) -> None:
        acc.wait_for_everyone()
        target = self.root / f"step_{step}"
        acc.save_state(str(target))
        if acc.is_main_process:
            # step.json is written last: a folder without it is an interrupted save and is ignored.
            (target / "step.json").write_text(json.dumps({"step": step}))
            for old in sorted(self.root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)

    def resume(self, acc) -> int:
        """Load the newest complete checkpoint into the prepared objects; the step to continue from."""
        ckpt = self.latest()
        if ckpt is None:
            return 0
        try:
            acc.load_state(str(ckpt))
            step = json.loads((ckpt / "step.json").read_text())["step"]
        except Exception as err:  # a truncated or foreign file: say which and how to recover
            raise RuntimeError(f"checkpoint {ckpt} is corrupt or incompatible ({type(err).__name__}: {err}); "
                               f"delete it to resume from an older one, or start over with a new output_dir") from err
        acc.print(f"resumed from {ckpt} at step {step}")
        return step


def save_hf(model, tokenizer, out_dir: str, dtype=torch.float16) -> None:
    """Save a Hugging Face model (+ tokenizer) in half precision safetensors."""
    os.makedirs(out_dir, exist_ok=True)
    model = model.to(dtype)
    model.save_pretrained(out_dir, safe_serialization=True)
    model.to(torch.float32)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
