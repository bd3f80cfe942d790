"""Scaling curves of trained drafters: held-out top-1 agreement and tau against the tokens each has trained on.

    python eval/plot_scaling.py runs/zoo3/eagle2 runs/zoo3/eagle3 --out docs/results/scaling.png

Each argument is a training run's output folder (its heldout_history.jsonl, written at every held-out
evaluation) or a shipped drafter folder (the `scaling` list of its train_report.json). `--offset NAME=TOKENS`
shifts a run that continued from an earlier draft by the tokens that draft had already seen. Runs of one drafter
(the folder's last part: eagle2, draft, ...) share a color, so a continuation extends its drafter's curve.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from draftkit.runlog import read_history  # noqa: E402


def history(folder: str) -> list[dict]:
    """The evaluations of one run (its heldout_history.jsonl) or of a shipped drafter (its report's scaling)."""
    rows = read_history(folder)
    if rows:
        return rows
    for report in (os.path.join(folder, "train_report.json"), os.path.join(folder, "final", "train_report.json")):
        if os.path.exists(report):
            with open(report) as fh:
                return json.load(fh).get("scaling") or []
    raise SystemExit(f"error: {folder} holds neither heldout_history.jsonl nor a train_report.json")


def label(folder: str) -> str:
    """A run's name in the legend and in --offset: its folder's last two parts (runs/zoo5/eagle3 -> zoo5/eagle3),
    so that continuations of one draft in different runs stay apart."""
    parts = os.path.normpath(folder).split(os.sep)
    return "/".join(parts[-2:])


def top1_key(row: dict) -> str | None:
    """The held-out top-1 metric a recipe logs (EAGLE: acc_0; Medusa: head0_agreement, or head0_top1 in older runs;
    draft: top1_agreement)."""
    return next((k for k in ("acc_0", "head0_agreement", "head0_top1", "top1_agreement", "acc_1") if k in row), None)


def curves(runs: list[str], offsets: dict[str, int]) -> dict[str, tuple[list, list]]:
    """Per run (by label): [(million tokens, held-out top-1)] and [(million tokens, tau)], offsets applied."""
    out = {}
    for folder in runs:
        name = label(folder)
        rows = history(folder)
        key = top1_key(rows[0]) if rows else None
        if not rows or key is None:
            print(f"{folder}: no evaluations yet", file=sys.stderr)
            continue
        x = [(r["tokens_seen"] + offsets.get(name, 0)) / 1e6 for r in rows]
        out[name] = ([(xi, r[key]) for xi, r in zip(x, rows)], [(xi, r["tau"]) for xi, r in zip(x, rows) if "tau" in r])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run output folders or shipped drafter folders")
    parser.add_argument("--out", default="docs/results/scaling.png", help="the PNG to write (default: %(default)s)")
    parser.add_argument("--offset", action="append", default=[],
                        help="NAME=TOKENS: tokens the run's starting draft had already seen, NAME the run folder's "
                             "last two parts (zoo5/eagle3; repeatable); only for runs whose reports predate "
                             "tokens_seen_before (newer continued runs count their starting draft's tokens)")
    args = parser.parse_args(argv)
    offsets = {}
    for item in args.offset:
        name, _, value = item.partition("=")
        if not value.isdigit():
            parser.error(f"--offset {item}: expected NAME=TOKENS, e.g. zoo3/eagle2=1638400")
        offsets[name] = int(value)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    colors: dict[str, str] = {}  # one color per drafter (the folder's last part): its runs continue one another
    for name, (top1, tau) in curves(args.runs, offsets).items():
        drafter = name.split("/")[-1]
        first = drafter not in colors
        colors.setdefault(drafter, f"C{len(colors) % 10}")
        style = dict(marker="o", color=colors[drafter], label=drafter if first else None)
        ax1.plot(*zip(*top1), **style)
        if tau:
            ax2.plot(*zip(*tau), **style)
    ax1.set(xlabel="tokens trained on (M)", ylabel="held-out top-1 agreement with the target",
            title="draft top-1 (first step / head)")
    ax2.set(xlabel="tokens trained on (M)", ylabel="tau (fixed tree, held-out prompts)", title="mean accepted length")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
