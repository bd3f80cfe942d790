r"""`accelerate launch` that checks the recipe first and ends the way the scripts do.

    python train/launch.py --config_file recipes/accelerate/single.yaml \
        train/eagle.py --config recipes/eagle/eagle2.yaml

Takes accelerate launch's arguments, unchanged. Before any process starts it parses the recipe's settings (the
--config YAML and the flags) exactly as the script will, so a missing file, a YAML typo or a bad value is one
line on stderr and exit code 2, once, whatever the number of processes. Then accelerate's launcher runs the
script; when the script fails (it has printed its own one line, or its traceback), this ends with the script's
exit code instead of adding the launcher's traceback (`accelerate launch` itself ends such a run in a
CalledProcessError traceback and exit code 1).
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from draftkit.train.config import TrainConfig, parse_config  # noqa: E402


def recipe_config(script: str):
    """The TrainConfig dataclass of a draftkit recipe script (train/<name>.py), or None for another script."""
    path = Path(script).resolve()
    if path.parent != Path(__file__).resolve().parent or not path.exists():
        return None
    module = importlib.import_module(f"draftkit.train.{path.stem}")
    found = [v for v in vars(module).values() if isinstance(v, type) and dataclasses.is_dataclass(v)
             and issubclass(v, TrainConfig) and v.__module__ == module.__name__]
    return found[0] if found else None


def child_exit_code(err: BaseException) -> int | None:
    """The failed script's exit code from accelerate's launchers (single process / DeepSpeed, or torchrun)."""
    if isinstance(err, subprocess.CalledProcessError):
        return err.returncode
    failures = getattr(err, "failures", None)  # torch.distributed.elastic's ChildFailedError
    if failures:
        return next(iter(failures.values())).exitcode
    return None


def main(argv=None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    cls = recipe_config(args.training_script)
    if cls is not None:
        try:
            # exits 2 with one line on a bad setting (0 on --help)
            parse_config(cls, args.training_script_args, prog=Path(args.training_script).name)
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else 2
    try:
        launch_command(args)
    except Exception as err:  # noqa: BLE001 - a failed script: its own output already says why
        code = child_exit_code(err)
        if code is None:
            raise
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
