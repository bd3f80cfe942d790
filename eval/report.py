"""The results folder of eval/compare.py: rows as they finish, the table with its legend, plots, W&B.

    <folder>/rows.jsonl   one JSON row per (task, method) or failure, appended as each completes
    <folder>/compare.json the whole report: machine, settings, every row
    <folder>/compare.txt  the table and its legend, as printed
    <folder>/speedup.png, acceptance_by_depth.png
"""
from __future__ import annotations

import json
import os
import platform
import warnings
from contextlib import contextmanager

from draftkit.verify.contract import first_line


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and its bf16 matrix units, where the system says (Linux): two machines of one
    architecture can differ 2x in a plain step and in how their verify cost grows with a tree's rows (AMX)."""
    name, flags = "", set()
    try:
        with open(cpuinfo) as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not name:
                    name = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    units = "AMX" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else ""
    base = name or platform.processor() or platform.machine()
    return f"{base}, {units}" if units else base


def machine_line() -> str:
    """The machine a measurement ran on, as every results file names it."""
    import torch

    from draftkit.verify.precision import tf32_matmul

    cpu = f"CPU ({cpu_name()})"
    gpu = torch.cuda.is_available()
    dev = f"{torch.cuda.get_device_name()} (TF32 {'on' if tf32_matmul() else 'off'})" if gpu else cpu
    return (f"{dev}, {os.cpu_count()} cores, torch {torch.__version__} with {torch.get_num_threads()} threads, "
            f"Python {platform.python_version()}")


LEGEND = """\
tau       committed tokens per target forward (plain decoding: 1.00)
alpha     acceptance rate: accepted / (accepted + rejected) draft tokens, over the tokens the target checked
tok/s     generated tokens per second, median over the repeats
speedup   tok/s over plain decoding's in the same repeat: median [min-max] over the repeats
pred.     the cost model's speedup: committed tokens per step over the predicted step time, each step
          costing c(n) plain steps to verify its n nodes (the target's verify curve measured on this
          machine, verify/controller.py) plus its measured drafting time; decoding steps only (tok/s
          also pays the prompt's forward, alike for every method)
budget    the mean budget the controller gave: draft depth / nodes per step (0/0: plain steps)
K*        the seeds' best chain length for this row's alpha and phi (phi: drafting cost per depth over a
          plain step) if verifying were free: S(alpha, K, phi) = (1 - alpha^(K+1)) / ((1 - alpha)(K phi + 1))
draft%    share of decoding time spent drafting (the rest is the target's verification)
adds MB   memory the method adds beside the target: its own parameters + its KV cache + other buffers,
          counted per method (not the process's RSS); peers: the assistant model's parameters only
lossless  outputs identical to plain greedy decoding / prompts compared (n/a when sampling)
by depth  share of steps whose accepted path reached draft depth 1, 2, ..."""


@contextmanager
def quiet_warnings():
    """Python warnings are counted instead of printed (they would break into the progress bar; compare.py
    prints them once, after the table); transformers' log lines go through tqdm.write."""
    from tqdm.contrib.logging import logging_redirect_tqdm

    seen: dict[str, int] = {}

    def count(message, category, *args, **kwargs):
        key = f"{category.__name__}: {first_line(message) if str(message).strip() else ''}"
        seen[key] = seen.get(key, 0) + 1

    shown, warnings.showwarning = warnings.showwarning, count
    try:
        with logging_redirect_tqdm():
            yield seen
    finally:
        warnings.showwarning = shown


def _f(x, fmt):
    """format(x, fmt), or a dash as wide as the field when x is None."""
    width = int("".join(c for c in fmt.split(".")[0] if c.isdigit()) or 0)
    return "-".rjust(width) if x is None else format(x, fmt)


def added_mb(row: dict) -> float | None:
    added = row.get("added_bytes")
    return None if added is None else sum(v or 0 for v in added.values()) / 2**20


def format_table(report: dict) -> str:
    head = (f"{'task':6} {'method':18} {'tau':>5} {'alpha':>5} {'tok/s':>7} {'speedup':>16} {'pred.':>5} "
            f"{'budget':>8} {'K*':>3} {'draft%':>6} {'adds MB':>7} {'lossless':>9}  accept by depth")
    lines = [f"machine: {report['machine']}" + (f"; target in {report['target_placement']}"
                                                 if report.get("target_placement") else "")]
    if report.get("interrupted"):
        lines.append("INTERRUPTED: the rows below are the ones finished before the run was stopped")
    lines += [f"WARNING: {w}" for w in report.get("timing", {}).get("warnings", [])]  # before any figure
    lines += [head, "-" * len(head)]
    failed = [r for r in report["rows"] if r.get("error")]
    for r in report["rows"]:
        if r.get("error"):
            continue
        spread = f"{r['speedup']:.2f}x [{r['speedup_min']:.2f}-{r['speedup_max']:.2f}]"
        by_depth = " ".join(f"{a:.2f}" for a in r["acceptance_by_depth"][:6])
        lossless = {True: "yes", False: "NO", None: "n/a"}[r["lossless"]]
        if r["identical_outputs"] and r["lossless"] is not None:
            lossless = f"{lossless} {r['identical_outputs']}"
        draft = None if r["draft_share"] is None else 100 * r["draft_share"]
        budget = "-" if r.get("budget_depth") is None else f"{r['budget_depth']:.1f}/{r['budget_nodes']:.0f}"
        lines.append(f"{r['task']:6} {r['drafter']:18} {_f(r['tau'], '5.2f')} {_f(r['alpha'], '5.2f')} "
                     f"{r['tokens_per_s']:7.1f} {spread:>16} {_f(r.get('predicted_speedup'), '5.2f')} "
                     f"{budget:>8} {_f(r.get('seeds_k_star'), '3d')} "
                     f"{_f(draft, '6.0f')} {_f(added_mb(r), '7.1f')} {lossless:>9}  {by_depth}")
    shares = [f"{r['task']} {r['drafter']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["member_shares"].items())
              for r in report["rows"] if r.get("member_shares")]
    if shares:
        lines += ["", "share of accepted tokens per member (a token several members proposed is split evenly):"]
        lines += ["  " + s for s in shares]
    lines += grammar_lines(report["rows"])
    for r in failed:
        where = f" on {r['prompt']}" if r.get("prompt") else ""
        lines.append(f"FAILED {r['task']} {r['drafter']}{where}: {r['error']}")
    settings = [f"{r['drafter']}: {r['settings']}" for r in report["rows"] if r.get("settings")]
    if settings:
        lines += ["", "methods: " + "; ".join(dict.fromkeys(settings))]
    return "\n".join(lines + ["", LEGEND])


def grammar_lines(rows: list[dict]) -> list[str]:
    """Rows decoded under a grammar: tau with the forced tokens, forced tokens, pruned nodes per step."""
    rows = [r for r in rows if not r.get("error") and (r.get("forced_tokens") or r.get("pruned_per_step")
                                                        or r.get("grammar_incomplete"))]
    if not rows:
        return []
    out = ["", "under a grammar: tau+forced (tau counting the tokens the grammar forced, committed without a "
               "forward), forced tokens, draft nodes pruned per step, outputs cut before the grammar completed"]
    for r in rows:
        out.append(f"  {r['task']:6} {r['drafter']:18} tau+forced {_f(r.get('tau_with_forced'), '5.2f')}  forced "
                   f"{r['forced_tokens']:5d}  pruned/step {_f(r.get('pruned_per_step'), '5.1f')}  incomplete "
                   f"{r['grammar_incomplete']}/{r['prompts']}")
    return out


RUN_FILES = ("rows.jsonl", "compare.json", "compare.txt")  # and the plots (*.png)


def keep_previous(folder: str) -> str | None:
    """Move an earlier run's results in `folder` (its rows, report and plots) into folder/previous-<its time>/;
    returns that folder, or None when there was nothing to move. Nothing else in `folder` is touched."""
    import glob
    import shutil
    import time as clock

    found = [os.path.join(folder, f) for f in RUN_FILES if os.path.isfile(os.path.join(folder, f))]
    if not any(os.path.getsize(f) for f in found):
        return None
    found += glob.glob(os.path.join(folder, "*.png"))
    stamp = clock.strftime("%Y%m%d-%H%M%S", clock.localtime(max(os.path.getmtime(f) for f in found)))
    dest = os.path.join(folder, f"previous-{stamp}")
    os.makedirs(dest, exist_ok=True)
    for f in found:
        shutil.move(f, os.path.join(dest, os.path.basename(f)))
    return dest


class RunWriter:
    """Appends each row to rows.jsonl the moment it is known, so a run that dies loses nothing finished."""

    def __init__(self, folder: str):
        self.folder = folder
        self.rows: list[dict] = []
        self.rows_path = os.path.join(folder, "rows.jsonl")
        self.moved = keep_previous(folder)  # a reused folder: the earlier run's results kept, not mixed or lost
        open(self.rows_path, "w").close()

    @property
    def errors(self) -> list[dict]:
        return [r for r in self.rows if r.get("error")]

    def add(self, row: dict) -> None:
        self.rows.append(row)
        with open(self.rows_path, "a") as fh:
            fh.write(json.dumps(row) + "\n")

    def finish(self, report: dict, plots: bool = True) -> list[str]:
        """The plots, compare.json and compare.txt; returns their paths. A plot that fails is a FAILED row."""
        paths = []
        if plots and any(not r.get("error") for r in report["rows"]):
            try:
                paths += plot_results(report, self.folder)
            except Exception as exc:  # noqa: BLE001 - the figures matter more than the pictures
                from draftkit.eval.cli_checks import error_message

                self.add({"drafter": "plots", "task": "all", "kind": "error", "prompt": None,
                          "error": error_message(exc)})
        paths += [os.path.join(self.folder, "compare.json"), os.path.join(self.folder, "compare.txt")]
        with open(paths[-2], "w") as fh:
            json.dump(report, fh, indent=2)
        with open(paths[-1], "w") as fh:
            fh.write(format_table(report) + "\n")
        return paths


def plot_results(report: dict, folder: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    os.makedirs(folder, exist_ok=True)
    rows = [r for r in report["rows"] if not r.get("error")]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    methods = [m for m in dict.fromkeys(r["drafter"] for r in rows) if m != "plain"]
    find = {(r["task"], r["drafter"]): r for r in rows}
    paths = []

    # speedup: bars at the median, error bars from the slowest to the fastest repeat; legend right of the axes
    fig, ax = plt.subplots(figsize=(2.5 + 1.2 * len(tasks) * max(1, len(methods)) / 3, 4))
    width = 0.8 / max(1, len(methods))
    for i, m in enumerate(methods):
        got = [find.get((t, m)) for t in tasks]
        xs = [x + i * width for x, r in zip(range(len(tasks)), got) if r]
        mid = [r["speedup"] for r in got if r]
        err = [[r["speedup"] - r["speedup_min"] for r in got if r], [r["speedup_max"] - r["speedup"] for r in got if r]]
        ax.bar(xs, mid, width, yerr=err, capsize=2, label=m, error_kw={"lw": 0.8})
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(tasks))], tasks)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title("tokens/s over plain decoding (same run; bars: min-max over repeats)", fontsize=9)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    paths.append(os.path.join(folder, "speedup.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)

    # acceptance by depth: error bars from the lowest to the highest prompt; one legend right of the last axes
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.6 * len(tasks) + 1.6, 3.5), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        for j, m in enumerate(methods):
            row = find.get((t, m))
            acc = row["acceptance_by_depth"] if row else []
            if acc:
                spread = row.get("acceptance_by_depth_spread") or [[a, a] for a in acc]
                depths = [d + 1 + 0.04 * (j - len(methods) / 2) for d in range(len(acc))]  # dodge overlapping bars
                err = [[a - lo for a, (lo, _) in zip(acc, spread)], [hi - a for a, (_, hi) in zip(acc, spread)]]
                ax.errorbar(depths, acc, yerr=err, marker="o", ms=3, capsize=2, lw=1, label=m, color=f"C{j}")
        ax.set_title(t)
        ax.set_xlabel("draft depth")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("share of steps reaching depth")
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        axes[0][-1].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    paths.append(os.path.join(folder, "acceptance_by_depth.png"))
    fig.savefig(paths[-1], dpi=120, bbox_inches="tight")
    plt.close(fig)
    if any(r.get("budget_depth") is not None for r in rows if r["drafter"] != "plain"):
        paths.append(plot_budget(rows, methods, tasks, folder))
    return paths


def plot_budget(rows: list[dict], methods: list[str], tasks: list[str], folder: str) -> str:
    """The controller's chosen draft depth (mean over steps, plain steps as 0) against the acceptance it
    measured, one point per method and task, beside the seeds' flat-cost K*(alpha) at the run's median phi."""
    import matplotlib.pyplot as plt

    from draftkit.verify.estimates import seeds_best_k

    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    marks = "osD^vP*X"
    for j, m in enumerate(methods):
        for k, t in enumerate(tasks):
            r = next((r for r in rows if r["drafter"] == m and r["task"] == t), None)
            if r and r.get("budget_depth") is not None and r.get("alpha") is not None:
                ax.scatter(r["alpha"], r["budget_depth"], color=f"C{j}", marker=marks[k % len(marks)], s=30,
                           label=m if k == 0 else None)
    phis = sorted(r["phi"] for r in rows if r.get("phi") and r["drafter"] != "plain")
    if phis:
        phi = phis[len(phis) // 2]
        alphas = [a / 100 for a in range(0, 96)]
        ax.plot(alphas, [seeds_best_k(a, phi, max_k=16)[0] for a in alphas], color="grey", lw=1, ls="--",
                label=f"seeds' K* (flat verify, phi {phi:.2f})")
    for k, t in enumerate(tasks):  # task markers, in grey, for the legend only
        ax.scatter([], [], color="grey", marker=marks[k % len(marks)], s=30, label=f"task: {t}")
    ax.set_xlabel("measured acceptance alpha")
    ax.set_ylabel("mean draft depth chosen (plain steps = 0)")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_title("budget chosen by the controller vs acceptance", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    path = os.path.join(folder, "budget_vs_acceptance.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def log_wandb(report: dict) -> None:
    import wandb

    os.environ.setdefault("WANDB_MODE", "offline")
    run = wandb.init(project="draftkit-compare", config=report["settings"], dir=os.environ.get("WANDB_DIR", "runs"))
    cols = ["task", "drafter", "tau", "alpha", "tokens_per_s", "speedup", "predicted_speedup", "lossless"]
    rows = [r for r in report["rows"] if not r.get("error")]
    run.log({"compare": wandb.Table(columns=cols, data=[[r[c] for c in cols] for r in rows])})
    run.finish()
