"""tau against tokens trained: trained drafts of one target at their full tree (every step drafts the caps, no
controller), on the same chat-templated prompts, beside plain greedy decoding; a table and a plot.

    python eval/tau_curve.py --target smollm2-135m \
        --draft eagle3=runs/smollm2/eagle3-mix/final --draft eagle3=zoo/smollm2-135m/eagle3 \
        --draft eagle=zoo/smollm2-135m/eagle --out docs/results/smollm2_tau_curve

Each --draft is KIND=FOLDER or KIND=FOLDER@TOKENS. The tokens a draft trained on come from its folder's
train_report.json or, for a shipped draft, the zoo manifest; @TOKENS says them for a folder that keeps neither
(an earlier shipped version taken out of git history). tau here is what a draft's proposals are worth at its
largest tree, the quantity a GPU's flat verify cost turns into speed; compare.py measures the speed on this
machine. Every draft's output is checked against plain decoding token for token. Each finished draft is one line
of <out>/tau_curve.jsonl, so an interrupted run resumes where it stopped (with the same prompts and settings).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class DraftSpec:
    kind: str  # a drafter name (draftkit.DRAFTERS)
    folder: str
    tokens: int  # tokens trained on, in all


def parse_draft(text: str, kinds) -> DraftSpec:
    """KIND=FOLDER[@TOKENS] -> DraftSpec; ValueError naming what is wrong."""
    from draftkit.zoo import tokens_seen_by

    kind, sep, rest = text.partition("=")
    if not sep or not rest:
        raise ValueError(f"--draft {text!r}: expected KIND=FOLDER or KIND=FOLDER@TOKENS")
    if kind not in kinds:
        raise ValueError(f"--draft {text!r}: unknown kind {kind!r} (one of {', '.join(kinds)})")
    folder, at, tokens = rest.rpartition("@") if "@" in rest else (rest, "", "")
    if not os.path.isdir(folder):
        raise ValueError(f"--draft {text!r}: no folder {folder}")
    if at:
        if not tokens.isdigit():
            raise ValueError(f"--draft {text!r}: @TOKENS must be a whole number, got {tokens!r}")
        return DraftSpec(kind, folder, int(tokens))
    seen = tokens_seen_by(folder)
    if seen <= 0:
        raise ValueError(f"--draft {text!r}: {folder} records no tokens trained (no train_report.json, not in "
                         f"the zoo's manifest); say them as {kind}={folder}@TOKENS")
    return DraftSpec(kind, folder, seen)


def parse(argv=None) -> argparse.Namespace:
    import draftkit as dk

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m",
                    help="the target: 'default' (the shipped one), a named real target, a GGUF file or a Hugging "
                         "Face folder (default: %(default)s)")
    ap.add_argument("--draft", action="append", default=[], metavar="KIND=FOLDER[@TOKENS]",
                    help="a trained draft, repeated for each point of the curve (at least one)")
    ap.add_argument("--tasks", default="chat,humaneval",
                    help="compare.py's task names, chat-templated where the target has a template "
                         "(default: %(default)s)")
    ap.add_argument("--prompts", type=int, default=2, help="prompts per task or chat category (default: %(default)s)")
    ap.add_argument("--max-new-tokens", type=int, default=96, help="tokens generated per prompt (default: %(default)s)")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0: greedy, every output checked against plain decoding; above 0: sampled at this "
                         "temperature (seed 0 for every prompt; sampled output is not compared) (default: %(default)s)")
    ap.add_argument("--extrapolate", type=float, default=0.0, metavar="MILLIONS",
                    help="draw each drafter's straight-line fit (least squares over its points, two or more) out to "
                         "this many million tokens, and print its slope; 0: no fit (default: %(default)s)")
    ap.add_argument("--out", default="runs/measure/tau_curve",
                    help="folder for tau_curve.jsonl, tau_curve.txt and tau_curve.png (default: %(default)s)")
    args = ap.parse_args(argv)
    if not args.draft:
        ap.error("name at least one --draft KIND=FOLDER")
    if args.temperature < 0:
        ap.error(f"--temperature must be 0 (greedy) or more, got {args.temperature}")
    if args.extrapolate < 0:
        ap.error(f"--extrapolate must be 0 or more million tokens, got {args.extrapolate}")
    if args.prompts < 1 or args.max_new_tokens < 1:
        ap.error(f"--prompts and --max-new-tokens must be at least 1, got {args.prompts} and {args.max_new_tokens}")
    try:
        args.specs = [parse_draft(d, dk.DRAFTERS) for d in args.draft]
    except ValueError as e:
        ap.error(str(e))
    args.task_list = [t.strip() for t in args.tasks.split(",") if t.strip()]
    return args


def settings(args) -> dict:
    """What makes two measurements comparable: a line measured under other settings is not reused."""
    same = {"target": args.target, "tasks": args.task_list, "prompts": args.prompts,
            "max_new_tokens": args.max_new_tokens}
    return {**same, "temperature": args.temperature} if args.temperature else same  # greedy lines stay as written


def done_lines(path: str, same: dict) -> dict[tuple, dict]:
    """{(kind, folder): line} of the drafts already measured under the same settings."""
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        lines = [json.loads(x) for x in fh if x.strip()]
    return {(x["kind"], x["folder"]): x for x in lines if x["settings"] == same}


def method(name: str, target, drafter, new_tokens: int, temperature: float = 0.0):
    """eval/measure.py's Method for decoding with `drafter` (None: plain) at its full tree: greedy, or sampled at
    `temperature` with seed 0 for every prompt."""
    import draftkit as dk
    from draftkit.eval.measure import Method

    sampling = dk.Sampling(temperature=temperature) if temperature else None

    def run(ids):
        out = dk.generate(target, ids, drafter, max_new_tokens=new_tokens, budget="fixed", sampling=sampling,
                          seed=0 if temperature else None)
        return out.tokens.tolist(), out.stats

    return Method(name, run)


def run_tasks(m, tasks: dict, bar) -> dict:
    """{task: eval/measure.py Result} of one method over each task's prompts; a failure stops the curve."""
    from draftkit.eval.measure import measure

    results = {}
    for task, prompts in tasks.items():
        res = measure([m], [p.ids for p in prompts], 1, bar)[m.name]
        if res.failed:
            raise RuntimeError(f"{m.name} on {task}: {next(iter(res.failed.values()))}")
        results[task] = res
    return results


def measure_draft(spec: DraftSpec, target, tokenizer, tasks: dict, plain: dict | None, new_tokens: int, bar,
                  temperature: float = 0.0) -> dict:
    """One draft's tau per task at its full tree, and the tasks where its output left plain decoding's (greedy;
    plain None: sampled, nothing compared)."""
    import draftkit as dk
    from draftkit.eval.measure import lossless_check

    drafter = dk.make_drafter(spec.kind, target, spec.folder, tokenizer=tokenizer)
    results = run_tasks(method(spec.kind, target, drafter, new_tokens, temperature), tasks, bar)
    tau = {task: res.stats.tau for task, res in results.items()}
    differs = []
    for task, res in (results.items() if plain is not None else ()):
        same, compared = lossless_check(res, plain[task], range(len(tasks[task])))
        if same < compared:
            differs.append(task)
    chat = [v for k, v in tau.items() if k.startswith("chat/")]
    return {"kind": spec.kind, "folder": spec.folder, "tokens_seen": spec.tokens, "tau": tau,
            "chat_mean": sum(chat) / len(chat) if chat else None, "differs": differs}


def table(lines: list[dict]) -> str:
    rows = ["| drafter | tokens trained | chat set mean tau (range) | HumanEval tau | output identical | folder |",
            "|---|---|---|---|---|---|"]
    for x in sorted(lines, key=lambda x: (x["kind"], x["tokens_seen"])):
        chat = [v for k, v in x["tau"].items() if k.startswith("chat/")]
        span = f"{x['chat_mean']:.2f} ({min(chat):.2f}-{max(chat):.2f})" if chat else "-"
        he = x["tau"].get("humaneval")
        same = "n/a (sampled)" if x["settings"].get("temperature") else \
            "yes" if not x["differs"] else "differs on " + ", ".join(x["differs"])
        rows.append(f"| {x['kind']} | {x['tokens_seen'] / 1e6:.2f}M | {span} | "
                    f"{'-' if he is None else f'{he:.2f}'} | {same} | {x['folder']} |")
    return "\n".join(rows)


PANELS = [("chat set (mean over categories)", lambda x: x["chat_mean"]),
          ("HumanEval", lambda x: x["tau"].get("humaneval"))]


def points(lines: list[dict], kind: str, value) -> list[tuple[float, float]]:
    """(million tokens, tau) of one drafter's lines, in token order, where the panel has a value."""
    return sorted((x["tokens_seen"] / 1e6, value(x)) for x in lines if x["kind"] == kind and value(x))


def fit(pts: list[tuple[float, float]]) -> tuple[float, float] | None:
    """(slope per million tokens, intercept) of the least-squares line through pts; None below two token counts."""
    xs, ys = zip(*pts) if pts else ((), ())
    if len(set(xs)) < 2:
        return None
    line = statistics.linear_regression(xs, ys)
    return line.slope, line.intercept


def slopes(lines: list[dict], to: float) -> str:
    """One line per panel and drafter: its fitted slope and where the fit stands at `to` million tokens."""
    out = []
    for name, value in PANELS:
        for kind in sorted({x["kind"] for x in lines}):
            f = fit(points(lines, kind, value))
            if f:
                out.append(f"{name}, {kind}: {f[0]:+.3f} tau per million tokens; the fit at {to:g}M: "
                           f"{f[0] * to + f[1]:.2f}")
    return "\n".join(out)


def plot(lines: list[dict], path: str, title: str, extrapolate: float = 0.0) -> None:
    """Two panels, chat set mean and HumanEval, tau against million tokens trained, one line per drafter (and its
    straight-line fit, dashed, out to `extrapolate` million tokens when that is past its last point)."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, (name, value) in zip(axes, PANELS):
        for kind in sorted({x["kind"] for x in lines}):
            pts = points(lines, kind, value)
            if not pts:
                continue
            drawn = ax.plot(*zip(*pts), marker="o", label=kind)[0]
            f = fit(pts) if extrapolate > pts[-1][0] else None
            if f:
                xs = [pts[-1][0], extrapolate]
                ax.plot(xs, [f[0] * x + f[1] for x in xs], "--", color=drawn.get_color(), alpha=0.6)
        ax.set_title(name)
        ax.set_xlabel("million tokens trained on" + (" (dashed: straight-line fit)" if extrapolate else ""))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("tau at the full tree (tokens per verify forward)")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(textwrap.fill(title, 170), fontsize=8)  # the machine lines run past the figure's width
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse(argv)
    import draftkit as dk
    from tqdm import tqdm

    from draftkit.eval.cli import target_info
    from draftkit.eval.cli_checks import UsageError
    from draftkit.eval.report import machine_line
    from draftkit.eval.tasks import build_tasks

    try:  # found (a real target converted) and readable before any weights load
        target_info(None if args.target == "default" else args.target)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path, same = os.path.join(args.out, "tau_curve.jsonl"), settings(args)
    done = done_lines(path, same)
    todo = [s for s in args.specs if (s.kind, s.folder) not in done]
    machine = machine_line()
    if todo:  # the target loads only when a draft is left to measure: a finished run redraws from its lines
        target, tokenizer = dk.load_target(None if args.target == "default" else args.target)
        tasks = build_tasks(tokenizer, args.task_list, n=args.prompts)
        n_prompts = sum(len(v) for v in tasks.values())
        greedy = not args.temperature  # plain decoding runs only to check greedy outputs against
        with tqdm(total=n_prompts * (len(todo) + greedy), desc="tau curve", unit="prompt") as bar:
            plain = run_tasks(method("plain", target, None, args.max_new_tokens), tasks, bar) if greedy else None
            for spec in todo:
                line = {**measure_draft(spec, target, tokenizer, tasks, plain, args.max_new_tokens, bar,
                                        args.temperature),
                        "settings": same, "machine": machine}
                with open(path, "a") as fh:  # one line per finished draft: an interruption loses at most one
                    fh.write(json.dumps(line) + "\n")
                done[(spec.kind, spec.folder)] = line
    lines = [done[(s.kind, s.folder)] for s in args.specs]
    machines = sorted({x.get("machine", machine) for x in lines})
    mode = f"sampled at temperature {args.temperature:g} (seed 0)" if args.temperature else "greedy"
    text = (f"tau at the full tree, {mode}, {args.prompts} prompt(s) per task, {args.max_new_tokens} new tokens, "
            f"target {args.target}; {'; '.join(machines)}\n\n{table(lines)}\n")
    if args.extrapolate:
        text += "\n" + slopes(lines, args.extrapolate) + "\n"
    with open(os.path.join(args.out, "tau_curve.txt"), "w") as fh:
        fh.write(text)
    plot(lines, os.path.join(args.out, "tau_curve.png"),
         f"{args.target}: tau against tokens trained; {'; '.join(machines)}", args.extrapolate)
    print(text)
    bad = [x for x in lines if x["differs"]]
    for x in bad:
        print(f"error: {x['kind']} {x['folder']} differs from plain decoding on {', '.join(x['differs'])}",
              file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
