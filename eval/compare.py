"""Compare drafters side by side on the same prompts, machine and run.

    python eval/compare.py                               # every drafter, 4-5 minutes on 2 idle CPU cores
    python eval/compare.py --quick                       # a smoke run of about a minute
    python eval/compare.py --full --out docs/results     # the README's table (about 17 minutes)
    python eval/compare.py --drafters medusa,lookahead --prompts-file question.jsonl
    python eval/compare.py --tasks json                  # structured output: plain constrained decoding as baseline
    python eval/compare.py --compile                     # every method's verify forward compiled (static shapes)

With no model flags it runs on the shipped default models (zoo/). Plain decoding is
always measured as the baseline, interleaved with every method, and transformers'
own `generate` paths (plain greedy, assisted generation, prompt lookup) run as peer rows.
Everything goes into a results folder (printed; --out to choose): rows.jsonl, written
row by row as the run goes, then compare.json, compare.txt and the plots.
Bad input is one line on stderr and exit code 2, before any model loads; a prompt or
method that fails mid-run becomes a FAILED row, the run goes on, and the exit code is 1.
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from draftkit.eval.cli import prepare  # noqa: E402
from draftkit.eval.cli_checks import UsageError, error_message  # noqa: E402


def build_methods(args, target, tokenizer, on_error=None):
    """(method, ...) in table order: plain, each drafter, then the peers. The one place drafters are built.
    on_error(name, message, traceback) is told of a drafter that cannot be built; the others go on."""
    import draftkit as dk
    from draftkit.drafters.registry import REGISTRY
    from draftkit.eval.drafter_flags import drafter_settings
    from draftkit.verify.contract import DraftMismatch
    from draftkit.eval.footprint import footprint, param_count
    from draftkit.eval.measure import Method
    from draftkit.eval.peers import hf_assisted, hf_grammar, hf_plain, hf_prompt_lookup

    n, eos = args.max_new_tokens, None
    sampling = dk.Sampling(temperature=args.temperature, top_p=args.top_p)
    seed_counter = iter(range(10**9))

    def ours(drafter, budget="auto"):
        carry = {"first": None, "keep": False, "grammar": None}

        def run(ids):
            # a drafter that remembers past requests (suffix) starts every prompt fresh, except on the
            # repeated-requests task, where it carries its memory across one repeat's requests in order
            if hasattr(drafter, "forget") and (not carry["keep"] or ids == carry["first"]):
                drafter.forget()
            # sampled runs differ in length per method, so they ignore EOS to time equal work (not under a
            # grammar: its end is an EOS)
            grammar = carry["grammar"]
            out = dk.generate(target, ids, drafter, max_new_tokens=n, sampling=sampling, budget=budget,
                              seed=args.seed + next(seed_counter), grammar=grammar, tokenizer=tokenizer,
                              eos_token_id=[] if args.temperature > 0 and grammar is None else None,
                              compile=args.compile)
            return out.tokens.tolist(), out.stats

        def new_task(first_ids, keep_memory: bool, grammar=None):
            carry.update(first=first_ids, keep=keep_memory, grammar=grammar)

        run.new_task = new_task
        run.drafter = drafter  # --compile's warm-up: its largest tree, whether it reads features, its draft's graphs
        return run

    def memory(obj):
        count = param_count(obj, target)
        return lambda: {**footprint(obj, target), "param_count": count}

    methods = [Method("plain", ours(None), footprint=lambda: {"params": 0, "kv": 0, "buffers": 0}, about="")]
    peers = []
    budgets = ("auto", "fixed") if args.budget == "both" else (args.budget,)
    for name in args.drafter_names:
        entry, path = REGISTRY[name], drafter_path(args, name)
        try:  # one drafter per budget: each keeps its own state (and the controller what it learned)
            drafters = [dk.make_drafter(name, target, path, tokenizer=tokenizer, **drafter_settings(args, name))
                        for _ in budgets]
        except Exception as exc:  # noqa: BLE001 - one drafter that cannot be built must not stop the others
            if isinstance(exc, DraftMismatch) and args.drafters.strip() == "all" and not path:
                # a shipped draft on a target whose shape was not known before it loaded (a hub model not
                # downloaded yet): left out as `all` leaves out what does not fit, not a FAILED row
                print(f"compare.py: left out {name}: {error_message(exc)}", file=sys.stderr)
                continue
            if on_error is None:
                raise
            on_error(name, error_message(exc), traceback.format_exc())
            continue
        for budget, drafter in zip(budgets, drafters):
            cap = drafter.budget_cap
            about = f"{entry.about}; caps: depth {cap.max_depth}, {cap.max_nodes} nodes; budget {budget}"
            label = f"{name} fixed" if args.budget == "both" and budget == "fixed" else name
            counters = getattr(drafter, "member_accepted", None)  # a hybrid's accepted tokens per member
            methods.append(Method(label, ours(drafter, budget), footprint=memory(drafter), about=about,
                                  counters=None if counters is None else counters.copy))
        drafter = drafters[0]
        cap = drafter.budget_cap
        if args.no_peers or args.temperature > 0 or args.grammars:  # their generate paths take no grammar
            continue
        if name == "standalone":
            k = cap.max_depth
            peers.append(Method(f"hf assisted K={k}", hf_assisted(target, drafter.model, k, n, eos), "peer",
                                footprint=memory(drafter.model), about="transformers assistant_model"))
        if name == "lookahead":
            peers.append(Method("hf prompt lookup", hf_prompt_lookup(target, 10, n, eos), "peer",
                                about="transformers prompt_lookup_num_tokens=10"))
    if peers:  # transformers' own plain decoding beside its drafting paths: the peers' ratios are over draftkit's
        # plain decoding, whose forward takes the layouts measured faster on this machine (verify/linear_layout.py)
        peers.insert(0, Method("hf generate", hf_plain(target, n, eos), "peer", about="transformers generate, greedy"))
    if args.grammars and not args.no_peers and args.temperature == 0:
        peers.append(Method("hf generate+grammar", hf_grammar(target, tokenizer, n, eos), "peer",
                            about="transformers generate with xgrammar's logits processor (the task's grammar)"))
    return methods + peers


def drafter_path(args, name: str):
    """What the model flags give drafter `name`: its draft's folder (None: the shipped one); a composite drafter
    (the hybrid) gets every model flag, for its members."""
    from draftkit.drafters.registry import REGISTRY

    flags = {"draft": args.draft, "eagle": args.eagle, "eagle3": args.eagle3, "medusa": args.medusa,
             "peagle": args.peagle, "dflash": args.dflash}
    entry = REGISTRY[name]
    return flags if entry.composite else flags.get(entry.default_model)


def run(args, target_path, tok, tasks, notes, started: float) -> int:
    """Load, measure, write. 0: every row measured; 1: something failed (FAILED rows); 130: interrupted."""
    from tqdm import tqdm

    import draftkit as dk
    from draftkit.eval.target_checks import torch_dtype
    from draftkit.eval.measure import measure, warm_up
    from draftkit.eval.noise import Probe, timing_warnings
    from draftkit.eval.report import RunWriter, format_table, log_wandb, machine_line, quiet_warnings
    from draftkit.eval.rows import error_row, task_rows

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # weight-loading bars: noise before the one progress bar that matters
    writer = RunWriter(args.out)
    print(f"results folder: {args.out}" + (f" (the previous run's results moved to {writer.moved})"
                                           if writer.moved else ""))
    for note in notes:
        print(note)
    report = {"machine": machine_line(), "settings": settings_of(args), "notes": notes, "rows": writer.rows}
    status, warned = 0, {}
    probe = Probe(threads=torch_threads())

    def failed(task, method, message, tb, prompt=None):
        writer.add(error_row(task, method, message, prompt))
        tqdm.write(f"FAILED {method}" + (f" on {prompt}" if prompt else "") + f": {message}", file=sys.stderr)
        if args.debug:
            tqdm.write(tb, file=sys.stderr)

    try:
        with quiet_warnings() as warned:
            target = dk.load_model(target_path, dtype=torch_dtype(args.dtype)).to(args.device)
            report["target_params"] = sum(p.numel() for p in target.parameters())
            report["target_placement"] = f"{args.dtype} on {args.device}"
            follow_up(args, target, tok, tasks)
            methods = build_methods(args, target, tok, on_error=lambda name, msg, tb: failed("all", name, msg, tb))
            total = (sum(len(p) for p in tasks.values()) * args.repeats + 1) * len(methods)
            with tqdm(total=total, desc="compare", unit="run") as bar:
                first = next(iter(tasks.values()))[0].ids
                if args.compile:
                    compile_buckets(args, target, methods, tasks, bar)
                warm_up(methods, first[::-1][:64], bar)  # reversed: text that no task continues
                profiled: set[int] = set()
                for task, prompts in tasks.items():
                    for m in methods:
                        getattr(m.run, "new_task", lambda *a: None)(prompts[0].ids, task == "repeated",
                                                                      args.grammars.get(task))
                    # the verify curve of this run, measured before the timed runs (and saved for the controller)
                    curve = verify_curve(target, len(prompts[0].ids), profiled)
                    res = measure(methods, [p.ids for p in prompts], args.repeats, bar,
                                  on_error=lambda m, i, msg, tb: failed(task, m, msg, tb, prompts[i].source))
                    for row in task_rows(task, methods, res, greedy=args.temperature == 0, cost_curve=curve):
                        writer.add({**row, "chat": prompts[0].messages is not None})
            if args.batch_size_list:
                report["batches"] = batch_rows(args, target, next(iter(tasks.values())), bar, methods, tok)
    except KeyboardInterrupt:
        status, report["interrupted"] = 130, True
        print("\ninterrupted: writing the rows finished so far", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - whatever ends the run, keep what it measured
        failed("all", "run", error_message(exc), traceback.format_exc())
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["timing"] = timing = probe.finish()
    timing["warnings"] = timing_warnings(timing, writer.rows)
    report["warnings"] = timing["warnings"] + [
        f"{text} ({count}x during the run)" for text, count in warned.items()]
    paths = writer.finish(report, plots=not args.no_plots)
    if report.get("batches"):
        from draftkit.eval.bench_batch import format_batches, plot

        print("\n" + format_batches(report["batches"]))
        if not args.no_plots:
            rows = [r for r in report["batches"] if r["drafter"] != "plain"]
            plot(rows, os.path.join(args.out, "speedup_by_batch.png"))
    print("\n" + format_table(report))
    lossy = [r for r in writer.rows if r.get("lossless") is False]
    if lossy:
        print(f"\nWARNING: {len(lossy)} rows differ from plain greedy decoding: "
              + ", ".join(f"{r['drafter']}/{r['task']} ({r['identical_outputs']})" for r in lossy))
    if args.wandb:
        log_wandb(report)
    for text in report["warnings"]:
        print(f"WARNING: {text}")
    print(f"\nran {report['seconds']:.0f} s; wrote {', '.join(os.path.basename(p) for p in paths)} and rows.jsonl "
          f"into {args.out}")
    if writer.errors and not status:
        print(f"{len(writer.errors)} failure(s): see the FAILED rows", file=sys.stderr)
        status = 1
    return status


def follow_up(args, target, tok, tasks) -> None:
    """Spec-Bench's second turns: each follows the target's own greedy answer to the first (written here, untimed)."""
    from draftkit.eval.chat_tasks import follow_turns

    if args.first_turns:  # --quick on a chat target (eval/cli.prepare)
        return
    if any(p.later_turns for prompts in tasks.values() for p in prompts):
        added = follow_turns(tasks, target, tok, args.max_new_tokens, None)
        print(f"second turns: {added} prompts follow the target's own answer to their first turn")


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def drafters_of(methods) -> list:
    """Each method's drafter (None: plain decoding, or a peer)."""
    return [getattr(m.run, "drafter", None) for m in methods]


def widest(methods) -> int:
    """The largest tree a method of this run drafts."""
    return max(0 if d is None else d.budget_cap.max_nodes for d in drafters_of(methods))


def hidden_kinds(methods) -> tuple[bool, ...]:
    """Whether the run's verify forwards hand the target's features over, without, or both (a graph each)."""
    return tuple(sorted({bool(getattr(d, "hidden_layers", ())) for d in drafters_of(methods)}))


def compile_buckets(args, target, methods, tasks, bar) -> None:
    """--compile: every bucket a single-sequence step of this run can meet, compiled before anything is timed, on a
    KV buffer as large as the longest prompt needs (kept on the model, so no later run recompiles)."""
    from draftkit.verify.forward import warm_compiled
    from draftkit.verify.packed import static_capacity

    longest = max(len(p.ids) for prompts in tasks.values() for p in prompts)
    t0 = time.perf_counter()
    sizes = warm_compiled(target, static_capacity(longest, 1, args.max_new_tokens, widest(methods)),
                          widest(methods) + 2, hidden_kinds(methods))
    bar.write(f"compiled the verify forward for buckets {', '.join(map(str, sizes))} in "
              f"{time.perf_counter() - t0:.0f} s (not timed)")
    # a draft compiles its buckets for the buffer a prompt needs when it is given that prompt (drafters/lanes.py), and
    # its buffer only grows: given the longest prompt now, no timed run meets a buffer size it has not compiled for
    # (the first run of longer prompts compiled inside its timing: EAGLE-3 at 0.36x in one repeat of code)
    import torch

    t0 = time.perf_counter()
    prompt = torch.tensor(next(p.ids for ps in tasks.values() for p in ps if len(p.ids) == longest), device=target.device)
    drafters = [d for d in drafters_of(methods) if d is not None]
    for drafter in drafters:
        drafter.reset(prompt)
    if drafters:
        bar.write(f"compiled the drafts' forwards for the longest prompt in {time.perf_counter() - t0:.0f} s (not timed)")


def batch_rows(args, target, prompts, bar, methods, tokenizer=None) -> list[dict]:
    """--batch-sizes: the first task's prompts decoded in batches (eval/bench_batch.py), speedup over plain
    batched decoding of the same size and the KV bytes of each method, interleaved, --repeats timed rounds (the
    median; a first round warms up). Each lane's drafter is built as the single-sequence rows' are: the model flags'
    drafts and the drafter flags' settings."""
    import draftkit as dk
    from draftkit.eval.bench_batch import run_batches
    from draftkit.eval.drafter_flags import drafter_settings

    def make_lanes(name: str, n: int) -> list:
        return dk.lane_drafters(name, target, n, drafter_path(args, name), tokenizer, **drafter_settings(args, name))

    names = list(args.drafter_names)
    ids = [p.ids for p in prompts]
    ids = (ids * (max(args.batch_size_list) // len(ids) + 1))[:max(args.batch_size_list)]
    bar.write(f"batches of {', '.join(map(str, args.batch_size_list))}: {', '.join(names)} and plain")
    budget = "auto" if args.budget == "both" else args.budget
    if args.compile:  # the largest batch's buckets (and buffer) hold every smaller batch's: all compiled untimed
        from draftkit.verify.forward import warm_compiled
        from draftkit.verify.packed import static_capacity

        b, w = max(args.batch_size_list), widest(methods)
        warm_compiled(target, static_capacity(sum(len(x) for x in ids[:b]), b, args.max_new_tokens, w),
                      b * (w + 2), hidden_kinds(methods))
    return run_batches(target, ids, names, args.batch_size_list, args.max_new_tokens, args.repeats, budget,
                       args.compile, make_lanes)


def verify_curve(target, context: int, profiled: set[int]):
    """c(n) of the target at this context, or None for a model the profile cannot time (the predicted-speedup
    column is then left empty). Measured afresh once per context bucket and run (`profiled` remembers which)
    and saved, so the controller plans with the machine as it is now, not as it was when a profile was saved."""
    from draftkit.verify.cost_profile import CostProfile, context_bucket

    bucket = context_bucket(context)
    try:
        curve = CostProfile.for_model(target, context, refresh=bucket not in profiled).c
    except (AttributeError, TypeError, RuntimeError, ValueError):
        return None
    profiled.add(bucket)
    return curve


def settings_of(args) -> dict:
    skip = ("debug", "grammars")  # grammars: Grammar objects cli.prepare derived from the flags
    return {k: list(v) if isinstance(v, tuple) else v for k, v in vars(args).items() if k not in skip}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    started = time.perf_counter()
    try:
        prepared = prepare(argv, __doc__)
    except UsageError as e:
        if "--debug" in argv:
            traceback.print_exc()
        print(f"compare.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("compare.py: interrupted before the run started", file=sys.stderr)
        return 130
    return run(*prepared, started)


def _terminated(signum, frame):
    raise KeyboardInterrupt  # a `kill` or a timeout ends the run like Ctrl-C: the rows so far are written


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminated)
    sys.exit(main())
