"""Tables, plots and W&B logging for eval/compare.py's report."""
from __future__ import annotations

import os


def _f(x, fmt):
    """format(x, fmt), or a dash as wide as the field when x is None."""
    width = int("".join(c for c in fmt.split(".")[0] if c.isdigit()) or 0)
    return "-".rjust(width) if x is None else format(x, fmt)


def print_table(report: dict) -> None:
    print(f"\nmachine: {report['machine']}")
    head = (f"{'task':6} {'method':18} {'tau':>5} {'alpha':>5} {'tok/s':>7} {'speedup':>16} {'pred.':>5} "
            f"{'draft%':>6} {'RSS MB':>7} {'lossless':>9}  accept by depth")
    print(head)
    print("-" * len(head))
    for r in report["rows"]:
        spread = f"{r['speedup']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}]"
        by_depth = " ".join(f"{a:.2f}" for a in r["acceptance_by_depth"][:6])
        lossless = {True: "yes", False: "NO", None: "n/a"}[r["lossless"]]
        if r["identical_outputs"] and r["lossless"] is not None:
            lossless = f"{lossless} {r['identical_outputs']}"
        draft = None if r["draft_share"] is None else 100 * r["draft_share"]
        print(f"{r['task']:6} {r['drafter']:18} {_f(r['tau'], '5.2f')} {_f(r['alpha'], '5.2f')} "
              f"{r['tokens_per_s']:7.1f} {spread:>16} {_f(r['predicted_speedup'], '5.2f')} {_f(draft, '6.0f')} "
              f"{r['peak_rss_mb']:7.0f} {lossless:>9}  {by_depth}")


def plot_results(report: dict, folder: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(folder, exist_ok=True)
    rows = report["rows"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = [m for m in dict.fromkeys(r["drafter"] for r in rows) if m != "plain"]
    paths = []

    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(tasks) * max(1, len(methods)) / 3, 4))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        vals = [next((r["speedup"] for r in rows if r["task"] == t and r["drafter"] == m), 0) for t in tasks]
        ax.bar([x + i * width for x in range(len(tasks))], vals, width, label=m)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(tasks))], tasks)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("tokens/s relative to plain decoding (same run)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    paths.append(os.path.join(folder, "speedup.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(tasks), figsize=(4 * len(tasks), 3.5), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        for m in methods:
            row = next((r for r in rows if r["task"] == t and r["drafter"] == m), None)
            if row and row["acceptance_by_depth"]:
                depths = range(1, len(row["acceptance_by_depth"]) + 1)
                ax.plot(depths, row["acceptance_by_depth"], marker="o", label=m)
        ax.set_title(t)
        ax.set_xlabel("draft depth")
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("share of steps reaching depth")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    paths.append(os.path.join(folder, "acceptance_by_depth.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def log_wandb(report: dict) -> None:
    import wandb

    os.environ.setdefault("WANDB_MODE", "offline")
    run = wandb.init(project="draftkit-compare", config=report["settings"], dir=os.environ.get("WANDB_DIR", "runs"))
    cols = ["task", "drafter", "tau", "alpha", "tokens_per_s", "speedup", "predicted_speedup", "lossless"]
    run.log({"compare": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in report["rows"]])})
    run.finish()
