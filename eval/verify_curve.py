"""The verify cost curve of one or more targets on this machine: c(n), the time of one forward over the root and
n draft nodes in plain steps, as measured and as steps run it (padded to a cheaper row count where one was
measured, verify/forward.py), printed as a table and drawn as one plot.

    python eval/verify_curve.py                                    # the shipped target (about 10 seconds)
    python eval/verify_curve.py --targets default,smollm2-135m --out docs/results/verify_curve
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="default",
                    help="comma-separated targets: 'default' (the shipped one), a named real target "
                         "(smollm2-135m), a GGUF file or a Hugging Face folder (default: %(default)s)")
    ap.add_argument("--context", type=int, default=256,
                    help="committed tokens the forwards run on top of (default: %(default)s)")
    ap.add_argument("--out", default="runs/measure/verify_curve",
                    help="folder for verify_curve.png and verify_curve.txt (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.context < 1:
        ap.error(f"--context must be at least 1, got {args.context}")
    args.target_list = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not args.target_list:
        ap.error("--targets names no target")
    return args


def table(curves: dict) -> str:
    """One row per size: each target's measured and padded c(n)."""
    names = list(curves)
    sizes = sorted({n for prof in curves.values() for n in prof.sizes})
    head = "nodes " + " ".join(f"{name[:18]:>18s} measured / runs as" for name in names)
    rows = [head]
    for n in sizes:
        cells = []
        for prof in curves.values():
            at = dict(zip(prof.sizes, zip(prof.unpadded, prof.ratios)))
            raw, run = at.get(n, (float("nan"), float("nan")))
            pad = dict(prof.padded).get(n)
            cells.append(f"{raw:>18.2f} / {run:.2f}" + (f" (as {pad})" if pad else "        "))
        rows.append(f"{n:5d} " + " ".join(cells))
    return "\n".join(rows)


def plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (name, prof) in enumerate(curves.items()):
        color = f"C{i}"
        name = "shipped target" if name == "default" else name
        ax.plot(prof.sizes, prof.unpadded, "o--", color=color, alpha=0.5, label=f"{name}: measured")
        ax.plot(prof.sizes, prof.ratios, "o-", color=color, label=f"{name}: as steps run it (padded)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("draft nodes verified with the root (log scale)")
    ax.set_ylabel("forward time / plain step")
    ax.set_title("Verify cost curve on this machine")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure_one(name: str, context: int):
    """The CostProfile of one target (its curve at every size, measured and padded)."""
    import torch

    import draftkit as dk
    from draftkit.verify.cost_profile import CostProfile

    target, _ = dk.load_target(None if name == "default" else name)
    with torch.no_grad():
        return CostProfile.measure(target, context)


def main(argv=None) -> int:
    args = parse(argv)
    from draftkit.eval.cli import target_info
    from draftkit.eval.cli_checks import UsageError
    from draftkit.eval.report import machine_line

    for name in args.target_list:  # every target found (a real one converted) before any is measured
        try:
            target_info(None if name == "default" else name)
        except UsageError as e:
            print(f"error: {str(e).replace('--target', '--targets', 1)}", file=sys.stderr)
            return 2

    curves = {}
    for name in args.target_list:  # each in a fresh process: a target measured after another in one process read
        # 10-30% dearer at 2-8 nodes here (the same sizes, alone and second)
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            curves[name] = pool.submit(measure_one, name, args.context).result()
    os.makedirs(args.out, exist_ok=True)
    text = f"{machine_line()}\ncontext {args.context}; c(n) in plain steps\n{table(curves)}\n"
    print(text, end="")
    with open(os.path.join(args.out, "verify_curve.txt"), "w") as fh:
        fh.write(text)
    plot(curves, os.path.join(args.out, "verify_curve.png"))
    print(f"wrote verify_curve.png and verify_curve.txt into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
