r"""Copy a trained model folder into zoo/ and record it in zoo/manifest.json.

    python train/ship.py --name target --source runs/target/final \
        --recipe recipes/zoo/target.yaml \
        --command "accelerate launch train/pretrain.py --config recipes/zoo/target.yaml"

The manifest keeps, per model: the command and recipe that made it, the corpus
fingerprint and held-out metrics from the run's train_report.json, the
parameter count, and the sha256 and size of every file (checked at load time).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from draftkit.zoo import ZOO, sha256  # noqa: E402

SKIP = {"train_report.json", "training_args.bin"}


def compare_taus(path: str, drafter: str) -> dict:
    """{task: tau} of `drafter`'s rows in a compare.json, with the command-line settings and machine of that run."""
    report = json.loads(Path(path).read_text())
    rows = [r for r in report.get("rows", []) if r.get("drafter") == drafter and r.get("tau") is not None]
    if not rows:
        raise ValueError(f"{path} has no rows of drafter {drafter!r}")
    return {"tau_by_task": {r["task"]: round(r["tau"], 3) for r in rows}, "compare_settings": report.get("settings"),
            "compare_machine": report.get("machine")}


def ship(name: str, source: str, recipe: str, command: str, zoo: Path | None = None,
         evaluation: dict | None = None) -> dict:
    zoo = Path(zoo or ZOO)
    src, dst = Path(source), zoo / name
    if not src.is_dir():
        raise FileNotFoundError(f"{src} is not a model folder")
    if src.resolve() != dst.resolve():  # a folder already in zoo/ (the tokenizer) is only recorded
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        for file in sorted(src.rglob("*")):
            if file.is_file() and file.name not in SKIP:
                target = dst / file.relative_to(src)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
    man_path = zoo / "manifest.json"
    man = json.loads(man_path.read_text()) if man_path.exists() else {"models": {}}
    report_path = src / "train_report.json"
    if report_path.exists():
        report = json.loads(report_path.read_text())
    elif src.resolve() == dst.resolve():  # re-recorded in place (a new --compare): the zoo keeps no report, so
        report = {k: v for k, v in man["models"].get(name, {}).items()  # keep what the entry says of its training
                  if k not in ("path", "command", "recipe", "files", *(evaluation or {}))}
    else:
        report = {}
    files = {str(f.relative_to(dst)): {"sha256": sha256(f), "bytes": f.stat().st_size}
             for f in sorted(dst.rglob("*")) if f.is_file()}
    entry = {"path": name, "command": command, "recipe": recipe, **report, **(evaluation or {}), "files": files}
    man["models"][name] = entry
    man_path.write_text(json.dumps(man, indent=2, sort_keys=True) + "\n")
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True, help="folder name under zoo/ (target, draft, medusa, eagle, ...)")
    ap.add_argument("--source", required=True, help="the trained model folder (a run's final/ or export_dir)")
    ap.add_argument("--recipe", required=True, help="the recipe YAML the run used")
    ap.add_argument("--command", required=True, help="the exact command that trained it")
    ap.add_argument("--compare", help="a compare.json that measured it: its tau per task is recorded in the manifest")
    ap.add_argument("--drafter", help="with --compare: the drafter's name in that run (default: the last part of "
                                      "--name)")
    args = ap.parse_args(argv)
    evaluation = None
    if args.compare:
        try:
            evaluation = compare_taus(args.compare, args.drafter or args.name.split("/")[-1])
        except (OSError, ValueError) as err:
            ap.error(f"--compare {args.compare}: {err}")
    entry = ship(args.name, args.source, args.recipe, args.command, evaluation=evaluation)
    total = sum(f["bytes"] for f in entry["files"].values())
    print(f"shipped {args.name}: {len(entry['files'])} files, {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
