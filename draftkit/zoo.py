"""The shipped default model family under zoo/, checked against its manifest.

zoo/manifest.json records, for every shipped model folder, how it was made
(command, recipe, corpus fingerprint, held-out metrics, parameter count) and
the sha256 of every file. Loading verifies the hashes first, so a corrupt or
missing file is a clear error instead of garbage weights.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path



def default_zoo() -> Path:
    """$DRAFTKIT_ZOO; else a checkout's zoo/ (beside draftkit/); else the copy an installed wheel carries inside the
    package (draftkit/_zoo, pyproject's package-data), so a non-editable install finds it from any folder."""
    if os.environ.get("DRAFTKIT_ZOO"):
        return Path(os.environ["DRAFTKIT_ZOO"])
    here = Path(__file__).resolve().parent
    checkout = here.parent / "zoo"
    return checkout if (checkout / "manifest.json").is_file() else here / "_zoo"


ZOO = default_zoo()


class ZooError(RuntimeError):
    pass


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest(zoo: Path | None = None) -> dict:
    path = Path(zoo or ZOO) / "manifest.json"
    if not path.exists():
        raise ZooError(f"no manifest at {path}: the default models are missing; train them with the recipes "
                       "under recipes/ (see README) or pass your own model")
    return json.loads(path.read_text())


def verified_path(name: str, zoo: Path | None = None) -> str:
    """The folder of shipped model `name` after checking every file's sha256."""
    zoo = Path(zoo or ZOO)
    entry = manifest(zoo).get("models", {}).get(name)
    if entry is None:
        raise ZooError(f"the default model family has no {name!r}; it has {sorted(manifest(zoo).get('models', {}))}")
    folder = zoo / entry["path"]
    for rel, want in entry["files"].items():
        file = folder / rel
        if not file.exists():
            raise ZooError(f"{file} is missing (listed in {zoo / 'manifest.json'})")
        got = sha256(file)
        if got != want["sha256"]:
            raise ZooError(f"{file} is corrupt: sha256 {got[:12]}... does not match the manifest's "
                           f"{want['sha256'][:12]}...; restore it with `git checkout -- {file}`")
    return str(folder)


def available(zoo: Path | None = None) -> list[str]:
    try:
        return sorted(manifest(zoo).get("models", {}))
    except ZooError:
        return []


SHOWN = ("heldout_loss", "top1_agreement", "head_agreement", "head_top1", "heldout_target_loss", "heldout_top1", "tau")


def table(zoo: Path | None = None) -> str:
    """The manifest as a markdown table (python -m draftkit.zoo)."""
    lines = ["| model | params | held-out metrics | size | made by |", "|---|---|---|---|---|"]
    for name, e in sorted(manifest(zoo)["models"].items()):
        def fmt(v):
            return f"{v:.3f}" if isinstance(v, float) else "[" + " ".join(f"{x:.2f}" for x in v) + "]"

        metrics = ", ".join(f"{k} {fmt(v)}" for k, v in e.items() if k in SHOWN and isinstance(v, (float, list)))
        size = sum(f["bytes"] for f in e["files"].values()) / 1e6
        n = e.get("params") or e.get("trainable_params")
        params = f"{n / 1e6:.2f}M" if n else "-"
        lines.append(f"| {name} | {params} | {metrics or '-'} | {size:.1f} MB | `{e['command']}` |")
    return "\n".join(lines)


def shipped_for(family: str, zoo: Path | None = None) -> set[str]:
    """The kinds of draft the zoo ships for the named real target `family` (entries `<family>/<kind>`)."""
    return {k.split("/", 1)[1] for k in available(zoo) if k.startswith(family + "/")}


def tokens_seen_by(folder: str | os.PathLike) -> int:
    """The tokens a trained model folder has seen in all: its run's train_report.json, or for a shipped model the
    zoo manifest's entry (the zoo keeps no report); 0 when neither says (a hub model, a folder trained elsewhere)."""
    report = Path(folder) / "train_report.json"
    if report.is_file():
        return int(json.loads(report.read_text()).get("tokens_seen") or 0)
    try:
        name = Path(folder).resolve().relative_to(Path(ZOO).resolve()).as_posix()  # a shipped model's manifest name
        entry = manifest(ZOO)["models"].get(name, {})
    except (ValueError, ZooError):  # not under the zoo, or no zoo
        return 0
    return int(entry.get("tokens_seen") or 0)


if __name__ == "__main__":
    print(table())
