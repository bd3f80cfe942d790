"""compare.py's command line: flags, presets, and every check that runs before a model loads.

`prepare(argv)` parses the flags, fills what no flag gave from the chosen preset (an
explicit flag always wins), checks every flag and the prompts file (eval/cli_checks.py),
reads the target's config and tokenizer (not its weights) to check the lengths against
its context, builds the prompts and creates the results folder. Any bad input is a
`UsageError`: one line, exit code 2.
"""
from __future__ import annotations

import argparse
import functools
import sys

from draftkit.eval import cli_checks as check
from draftkit.eval.cli_checks import UsageError
from draftkit.eval.target_checks import placement, target_info  # noqa: F401 (target_info: tests replace it here)
from draftkit.eval.drafter_flags import add_drafter_flags, check_drafter_flags
from draftkit.eval.tasks import TASKS
from draftkit.models import hub_problem


def is_real(name) -> bool:
    from draftkit.gguf import REAL_TARGETS, is_gguf

    return name in REAL_TARGETS or is_gguf(name)

# What a run measures unless a flag says otherwise; an explicit flag always wins over a preset.
# default: 4-5 minutes on 2 idle CPU cores with every drafter; full: the README's table.
PRESETS = {
    "default": {"tasks": "code,copy,prose", "prompts": 3, "prompt_len": 192, "max_new_tokens": 80, "repeats": 2},
    "quick": {"tasks": "code,copy", "prompts": 2, "prompt_len": 192, "max_new_tokens": 32, "repeats": 1},
    "full": {"tasks": "code,copy,prose", "prompts": 6, "prompt_len": 192, "max_new_tokens": 128, "repeats": 3},
}


CHAT_PRESET_TASKS = ("chat", "humaneval")  # the tasks of every preset when the target has a chat template
CHAT_QUICK_PROMPTS = 1  # --quick's prompts per task there (13 tasks, each its own row)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Appends "(default: ...)" to every option that does not say its default itself."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is argparse.SUPPRESS or not action.option_strings:
            return text
        value = "off" if action.default is False else action.default
        return f"{text} (default: {str(value).replace('%', '%%')})"


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block: main() prints it and exits with 2
        raise UsageError(message)


def _preset_help(key: str, text: str) -> str:
    d, q, f = (PRESETS[p][key] for p in ("default", "quick", "full"))
    return f"{text} (default: {d}; --quick: {q}; --full: {f})"


def build_parser(description: str | None = None) -> Parser:
    ap = Parser(prog="compare.py", description=description, formatter_class=HelpFormatter)
    ap.add_argument("--drafters", default="all",
                    help="comma list of drafters (standalone, medusa, eagle, eagle-chain: EAGLE drafting a chain "
                         "of --max-depth, eagle3, lookahead, suffix, peagle, dflash, hybrid: the trees of "
                         "--hybrid-members merged into one) or 'all' (peagle and dflash only once their drafts are "
                         "shipped or named by --peagle / --dflash) (default: %(default)s)")
    ap.add_argument("--target", help="target: a named real target (smollm2-135m, gemma3-270m: docs/real-models.md), "
                                     "a GGUF file, a Hugging Face hub id or folder (default: the shipped target, "
                                     "zoo/target)")
    ap.add_argument("--draft", help="standalone draft model: HF hub id or folder (default: the shipped draft)")
    ap.add_argument("--medusa", help="saved Medusa heads folder (default: the shipped heads)")
    ap.add_argument("--eagle", help="EAGLE-1/2 draft folder for eagle and eagle-chain, draftkit's or a public layout "
                                    "(default: the shipped EAGLE-2 draft, zoo/eagle)")
    ap.add_argument("--eagle3", help="EAGLE-3 draft folder for eagle3, draftkit's or a public layout (default: the "
                                     "shipped EAGLE-3 draft, zoo/eagle3)")
    ap.add_argument("--peagle", help="P-EAGLE draft folder for peagle (train/eagle.py --config "
                                     "recipes/eagle/peagle.yaml, or a vLLM / speculators export) (default: the "
                                     "shipped one, zoo/peagle; 'all' leaves peagle out while none is shipped)")
    ap.add_argument("--dflash", help="DFlash draft folder for dflash (train/dflash.py, or a z-lab / vLLM / "
                                     "speculators folder) (default: the shipped one, zoo/dflash; 'all' leaves "
                                     "dflash out while none is shipped)")
    ap.add_argument("--tasks", help=_preset_help("tasks", f"comma list of built-in tasks: {', '.join(TASKS)} (json: "
                                                 "prompts for a JSON object of a shipped schema, decoded under it)"))
    ap.add_argument("--prompts-file", help="JSONL of prompts ({\"prompt\": ...} or Spec-Bench's \"turns\"); "
                                           "replaces --tasks (default: none, the built-in tasks)")
    ap.add_argument("--prompts", type=int, help=_preset_help("prompts", "prompts per task"))
    ap.add_argument("--prompt-len", type=int, help=_preset_help("prompt_len", "prompt length in tokens of the "
                                                                "built-in tasks"))
    ap.add_argument("--max-new-tokens", type=int, help=_preset_help("max_new_tokens", "tokens generated per prompt"))
    ap.add_argument("--repeats", type=int, help=_preset_help("repeats", "interleaved repeats; speedup is their "
                                                             "median"))
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy; > 0 samples with fixed seeds (and generates max-new-tokens, ignoring EOS)")
    ap.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for p (sampling only)")
    ap.add_argument("--seed", type=int, default=0, help="seed for prompts and sampling")
    ap.add_argument("--threads", default="auto",
                    help="torch CPU threads: a count, or auto: the cores not busy with other work when the run "
                         "starts (cores less the load average, at least 1; a thread sharing its core with other "
                         "work stalls every op of a forward) (default: %(default)s)")
    ap.add_argument("--device", default="auto",
                    help="where the target and the drafts run: cpu, cuda, cuda:N, or auto: cuda when a GPU is there, "
                         "else cpu (default: %(default)s)")
    ap.add_argument("--dtype", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                    help="the target's precision (the drafts follow it): auto: fp32 on a CPU (faster there), on a "
                         "GPU the checkpoint's bf16 / fp16, else bf16 (default: %(default)s)")
    ap.add_argument("--tf32", choices=("off", "on", "keep"), default="off",
                    help="float32 matrix products on an NVIDIA GPU: off (IEEE fp32), on (TF32) or keep (as torch and "
                         "your imports left them); printed in the machine line; nothing on a CPU "
                         "(verify/precision.py) (default: %(default)s)")
    ap.add_argument("--no-peers", action="store_true", help="skip transformers' generate peer rows")
    ap.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                    help="render prompts with the target's chat template (--chat: every task; --no-chat: none; "
                         "default: the chat, humaneval and prompts-file tasks when the target has a template; "
                         "a second Spec-Bench turn follows the target's own answer to the first)")
    ap.add_argument("--grammar", help="constrain every prompt's output to a grammar: a .json schema file, a .ebnf "
                                      "grammar file or regex:PATTERN; plain decoding then is plain constrained "
                                      "decoding (needs xgrammar: pip install 'draftkit[grammar]') (default: none)")
    ap.add_argument("--batch-sizes", help="comma list such as 1,4,16: also decode the first task's prompts in "
                                          "batches of these sizes (speedup over plain batched decoding, KV bytes; "
                                          "--repeats timed rounds each)")
    ap.add_argument("--compile", action="store_true",
                    help="run the target's verify forward with static shapes (steps padded to buckets of 1, 2, 4, "
                         "..., 64, then multiples of 64 rows; a fixed-size KV buffer and mask) compiled by "
                         "torch.compile, CUDA graphs on a GPU, for plain decoding and every drafter alike (greedy "
                         "output is unchanged). Each bucket compiles once, all of them before the timed runs (a "
                         "warm-up of seconds to a minute per bucket on a CPU; with --batch-sizes, the larger buckets "
                         "of each batch size too), so compile time is in no timing. The drafts' own forwards "
                         "compile too (standalone, EAGLE-1/2/3 and the hybrid's members: --<method>-compile-draft, "
                         "on here unless set off), each draft's buckets when it is first given a prompt, before "
                         "any step is timed; P-EAGLE, DFlash and Medusa draft uncompiled (default: off)")
    add_drafter_flags(ap)
    preset = ap.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true", help="smoke run: " + ", ".join(
        f"{k.replace('_', '-')} {v}" for k, v in PRESETS["quick"].items()) + f"; with a chat target, tasks "
        f"{','.join(CHAT_PRESET_TASKS)} with {CHAT_QUICK_PROMPTS} prompt each, first turns only; on a real target "
        "(smollm2-135m, a GGUF file) all leaves out eagle-chain, EAGLE-2's draft as a chain (explicit flags win)")
    preset.add_argument("--full", action="store_true", help="the README's table: " + ", ".join(
        f"{k.replace('_', '-')} {v}" for k, v in PRESETS["full"].items()) + " (explicit flags win)")
    ap.add_argument("--out", help="results folder (default: runs/compare/<date-time>/)")
    ap.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    ap.add_argument("--wandb", action="store_true", help="log the table to W&B (offline unless WANDB_MODE is set)")
    ap.add_argument("--debug", action="store_true", help="print tracebacks of errors and failures")
    return ap


def parse_args(argv=None, description: str | None = None) -> argparse.Namespace:
    """Parse, then fill what no flag gave from the preset (so an explicit flag always wins)."""
    args = build_parser(description).parse_args(argv)
    args.preset = "quick" if args.quick else "full" if args.full else "default"
    args.first_turns = False  # only the first turn of multi-turn chat prompts (--quick on a chat target)
    args.explicit = sorted(k for k in PRESETS[args.preset] if getattr(args, k) is not None)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def batch_sizes(text: str | None) -> list[int]:
    if text is None:
        return []
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--batch-sizes takes a comma list of integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise UsageError(f"--batch-sizes needs integers >= 1, got {text!r}")
    if len(set(sizes)) < len(sizes):
        raise UsageError(f"--batch-sizes names a size twice: {text!r}")
    return sorted(sizes)


def check_flags(args) -> list[check.PromptText] | None:
    """Every check that needs no model; returns the prompts file's prompts (None: built-in tasks)."""
    for flag, low in (("prompts", 1), ("prompt_len", 1), ("max_new_tokens", 1), ("repeats", 1)):
        check.at_least("--" + flag.replace("_", "-"), getattr(args, flag), low)
    check_drafter_flags(args)
    args.batch_size_list = batch_sizes(args.batch_sizes)
    check.temperature(args.temperature)
    check.top_p(args.top_p)
    for flag in ("target", "draft", "medusa", "eagle", "eagle3"):
        if flag == "target" and is_real(args.target):
            continue  # a named real target or a GGUF file: target_info finds (or converts) it
        check.model_ref(f"--{flag}", getattr(args, flag))
        problem = getattr(args, flag) and hub_problem(getattr(args, flag))
        if problem:
            raise UsageError(f"--{flag} {getattr(args, flag)}: {problem}")
    if args.prompts_file is None:
        args.task_names = check.names("--tasks", args.tasks, TASKS)
        return None
    for key in ("tasks", "prompt_len"):
        if key in args.explicit:
            flag = "--" + key.replace("_", "-")
            raise UsageError(f"{flag} applies to the built-in tasks; --prompts-file replaces them")
    args.task_names = None
    return check.read_prompts_file(args.prompts_file)


# which drafters each model flag feeds: a flag whose drafters are all left out is a mistake
MODEL_FLAGS = {"--draft": ("standalone",), "--medusa": ("medusa",), "--eagle": ("eagle", "eagle-chain"),
               "--eagle3": ("eagle3",), "--peagle": ("peagle",), "--dflash": ("dflash",)}


def _family(args) -> str | None:
    """The named real target --target is (by name or as its GGUF file), or None."""
    from draftkit.gguf import REAL_TARGETS, real_name

    return args.target if args.target in REAL_TARGETS else real_name(args.target or "")


def _unshipped(args) -> set[str]:
    """Drafters whose model the zoo does not ship yet (for a named real target: not for it) and no flag names: `all`
    leaves them out."""
    from draftkit.drafters.registry import REGISTRY
    from draftkit.zoo import available

    from draftkit.zoo import shipped_for

    family = _family(args)
    if family is None and not _shipped_family_fits(args.target):  # your own model: the shipped drafts are not its
        return {name for name, e in REGISTRY.items() if e.default_model and getattr(args, e.default_model, None)
                is None}
    if family is None:
        shipped = set(available())
        return {name for name, e in REGISTRY.items() if e.train_hint and e.default_model not in shipped
                and getattr(args, e.default_model, None) is None}
    # a real target: only the drafts shipped for it (and those a flag names); a hybrid takes the members it has
    # (drafters/registry.available_members)
    shipped = shipped_for(family)
    return {name for name, e in REGISTRY.items() if e.default_model and e.default_model not in shipped
            and getattr(args, e.default_model, None) is None}


@functools.lru_cache(maxsize=8)  # asked by _unshipped and again by unshipped_error
def _shipped_family_fits(target: str | None) -> bool:
    """Is --target the shipped target, or of its shape (hidden size, vocabulary, layers: a fine-tune of it), so that
    the shipped family's drafts fit it? Read from the configs on this machine, before any weights and without the
    hub (a hub model not downloaded yet answers yes, as does a config that cannot be read: target_info then says
    what is wrong with it)."""
    from transformers import AutoConfig

    from draftkit.models import resolve

    if target in (None, "", "default"):
        return True
    try:
        ours, theirs = (AutoConfig.from_pretrained(resolve(name, "target"), local_files_only=True)
                        for name in (None, target))
    except Exception:  # noqa: BLE001 - any unreadable config is reported by target_info, in one line
        return True

    def shape(cfg):
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        return tuple(getattr(text, k, None) for k in ("hidden_size", "vocab_size", "num_hidden_layers"))

    return shape(ours) == shape(theirs)


def unshipped_error(args, missing: list[str]) -> str:
    """The one line for drafters named in --drafters whose draft the zoo does not ship (for this target)."""
    from draftkit.drafters.registry import REGISTRY

    e, family = REGISTRY[missing[0]], _family(args)
    how = "recipes/smollm2/build.sh trains every draft for it" if family else \
        e.train_hint or "train one with the recipes under recipes/ (docs/training.md)"
    also = f" ({', '.join(missing[1:])} too)" if missing[1:] else ""
    if family is None and not _shipped_family_fits(args.target):
        return (f"--drafters: {missing[0]} needs a draft made for {args.target}{also}; the shipped drafts were "
                f"made for the shipped target: {how}, then pass its folder with --{e.default_model} DIR")
    return (f"--drafters: {missing[0]} needs a {e.default_model} draft and none is shipped"
            f"{' for ' + family if family else ''}{also}: {how}, then pass its folder with --{e.default_model} DIR")


def check_drafters(args, choices) -> None:
    from draftkit.drafters.registry import REGISTRY, uses
    from draftkit.eval.drafter_flags import drafter_settings

    unshipped = _unshipped(args)
    if args.drafters.strip() == "all":
        left_out = [c for c in choices if c in unshipped]
        if left_out:  # said, not silent: a user reading the table should know why a method is missing
            print(f"compare.py: all leaves out {', '.join(left_out)}: no draft of theirs is shipped for this target "
                  "(train one, docs/training.md, and pass its folder with the drafter's flag)", file=sys.stderr)
        choices = tuple(c for c in choices if c not in unshipped)
        if args.preset == "quick" and is_real(args.target):  # a smoke run on a real target (about 15 tokens/s on
            choices = tuple(c for c in choices if c != "eagle-chain")  # a CPU): eagle-chain is EAGLE-2 as a chain
    args.drafter_names = check.names("--drafters", args.drafters, choices, "all")
    missing = [n for n in args.drafter_names if n in unshipped]
    if missing:  # named on purpose: refused before any model loads, not a FAILED row after the others ran
        raise UsageError(unshipped_error(args, missing))
    running = set(args.drafter_names)  # with a hybrid's members, which the model flags may feed
    for name in set(args.drafter_names) & set(REGISTRY):
        running.update(uses(name, **drafter_settings(args, name)))
        if REGISTRY[name].composite and drafter_settings(args, name).get("members", "auto") == "auto" and args.eagle3:
            running.add("eagle3")  # the default members take a given EAGLE-3 draft (drafters.registry.available_members)
    for flag, users in MODEL_FLAGS.items():
        if getattr(args, flag[2:]) is not None and not set(users) & running:
            raise UsageError(f"{flag} is given but --drafters ({', '.join(args.drafter_names)}) has no "
                             f"{' or '.join(users)}")


def drafter_choices() -> tuple[str, ...]:
    import draftkit as dk

    return tuple(dict.fromkeys((*dk.DRAFTERS, "eagle-chain")))


def build_prompts(args, tok, texts):
    from draftkit.eval.chat_tasks import MissingBenchmark
    from draftkit.eval.tasks import build_tasks, from_texts

    try:
        if texts is not None:
            return from_texts(texts, tok, args.prompts, args.chat)
        return build_tasks(tok, args.task_names, args.prompts, args.prompt_len, args.seed, args.chat)
    except MissingBenchmark as e:
        raise UsageError(f"--tasks humaneval: {e}") from None
    except ValueError as e:
        if args.chat and not getattr(tok, "chat_template", None):
            raise UsageError("--chat: the target's tokenizer has no chat template (its tokenizer_config.json sets "
                             "none); leave --chat out to run its prompts as plain text") from None
        raise UsageError(str(e) if texts is not None else f"--prompt-len {args.prompt_len}: {e}") from None


def task_grammars(args, tok, tasks) -> dict:
    """task -> the Grammar its prompts decode under (--grammar for every task, the json task's own schema),
    each compiled against the target's tokenizer here, so a bad or unsatisfiable grammar stops the run now."""
    from draftkit.verify.grammar import Grammar, GrammarError, compile_grammar

    if args.grammar is not None and "json" in tasks:
        raise UsageError("--grammar and --tasks json both set the grammar: the json task decodes under its own schema")
    try:
        grammars = {t: Grammar.from_spec(args.grammar) for t in tasks} if args.grammar else {}
        if "json" in tasks:
            from draftkit.eval.json_task import json_grammar

            grammars["json"] = json_grammar()
        eos = getattr(tok, "eos_token_id", None)
        for grammar in set(grammars.values()):  # against the tokenizer's vocabulary and EOS (no model read yet)
            compile_grammar(grammar, tok, len(tok), set() if eos is None else {eos})
    except (GrammarError, ImportError) as e:
        raise UsageError(f"--grammar: {e}" if args.grammar else f"--tasks json: {e}") from None
    return grammars


def prepare(argv, description: str | None = None):
    """Every check, before any model loads. Returns (args, target path, tokenizer, tasks, notes)."""
    from draftkit.eval.tasks import fit_to_context

    args = parse_args(argv, description)
    from draftkit.eval.noise import pick_threads

    try:
        threads, thread_note = pick_threads(args.threads)
    except ValueError as err:
        raise check.UsageError(str(err)) from None
    texts = check_flags(args)
    check_drafters(args, drafter_choices())
    path, context, tok = target_info(args.target)
    args.device, args.dtype = placement(args.device, args.dtype, path)
    if texts is None and "tasks" not in args.explicit and getattr(tok, "chat_template", None):
        args.task_names = list(CHAT_PRESET_TASKS)  # a chat model: what its users send, not text to continue
        if args.preset == "quick" and "prompts" not in args.explicit:
            args.prompts = CHAT_QUICK_PROMPTS  # 13 tasks (12 categories and HumanEval): one prompt each is a smoke run
            args.first_turns = True  # and no second turns (each needs the target's answer to its first)
    check.fits_context(context, args.max_new_tokens, None if texts is not None else args.prompt_len)
    args.grammars = task_grammars(args, tok, args.task_names or sorted({t.task for t in texts}))
    tasks = build_prompts(args, tok, texts)
    notes = [thread_note] if thread_note else []
    fewer = {t: len(p) for t, p in tasks.items() if len(p) < args.prompts}
    if fewer and "prompts" in args.explicit:  # said, not silently fewer than asked
        have = ", ".join(f"{t} {n}" for t, n in list(fewer.items())[:6]) + (", ..." if len(fewer) > 6 else "")
        notes.append(f"note: --prompts {args.prompts}: {len(fewer)} task(s) hold fewer and run all they have "
                     f"({have})")
    import torch

    torch.set_num_threads(threads)
    from draftkit.verify.precision import set_tf32

    set_tf32(args.tf32)
    cuts = fit_to_context(tasks, context - args.max_new_tokens) if context else []
    if cuts:
        n = sum(len(p) for p in tasks.values())
        by = f"{min(cuts)}-{max(cuts)}" if min(cuts) < max(cuts) else f"{min(cuts)}"
        notes.append(f"warning: {len(cuts)} of {n} prompts are longer than the {context - args.max_new_tokens} tokens "
                     f"that fit (context {context} - --max-new-tokens {args.max_new_tokens}): cut from the left by "
                     f"{by} tokens")
    if args.grammars and args.temperature == 0 and not args.no_peers:
        notes.append("note: transformers' assisted generation and prompt lookup cannot apply a grammar: their peer "
                     "rows are skipped; 'hf generate+grammar' is transformers' constrained generate")
    if args.temperature > 0 and not args.no_peers:
        notes.append("note: transformers' peer rows run greedy only: skipped when sampling")
    if args.temperature == 0 and args.top_p != 1.0:
        notes.append("note: --top-p applies only when sampling (--temperature > 0): ignored")
    args.out = check.out_folder(args.out)
    return args, path, tok, tasks, notes
