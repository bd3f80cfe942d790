"""Typed recipe configs: one dataclass per recipe, whose fields are both the YAML keys and the flags.

    python train/pretrain.py --config recipes/zoo/target.yaml --max_steps 10    # flags override the YAML
    python train/pretrain.py --help                                               # every flag, its help, its default

Parsing is transformers' HfArgumentParser: the YAML's values become the parser's defaults, so a flag on
the command line wins and `--config X --help` shows what X sets. A list field takes a YAML list
(`--feature_layers "[1, 3, -1]"`, `"[]"` for none) or its items (`--feature_layers 1 3 -1`); the layer lists
also take `auto`, three layers chosen from the target's config when it loads (so that one recipe fits any target).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from pathlib import Path

import yaml
from transformers import HfArgumentParser


class TrainError(Exception):
    """A problem with a run's settings or its output folder: reported as one line, without a traceback."""


AUTO = "auto"  # a layer list chosen from the target's config once it loads (drafters/reference_config.three_layers)


def field(default, help: str, auto: bool = False):
    """A config field with help text for --help; `auto`: a list field that also takes the word auto."""
    meta = {"help": help, **({"auto": True} if auto else {})}  # HfArgumentParser hands other fields' keys to argparse
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def auto_or_list(value):
    """AUTO for "auto" (a YAML value) or ["auto"] (the flag), else the list as it is."""
    return AUTO if value == AUTO or value == [AUTO] else value


def auto_layers(target, final: bool = False) -> list[int]:
    """The three hidden states `auto` stands for on this target (drafters/reference_config.three_layers); `final`:
    the last one is the final norm's output (-1), as draftkit's EAGLE-3 layout reads it. A one-line TrainError for
    a target too shallow to have three."""
    from draftkit.drafters.reference_config import three_layers

    cfg = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
    try:
        low, mid, high = three_layers(cfg.num_hidden_layers)
    except ValueError as err:
        raise TrainError(f"layers auto: {err}") from None
    return [low, mid, -1 if final else high]


@dataclasses.dataclass
class TrainConfig:
    """The fields every recipe shares: its data, the loop's optimisation, checkpoints and tracking."""

    corpus: str = field("stdlib", "stdlib (the Python standard library), python (stdlib + draftkit's dependencies), "
                                  "a folder of .py files, a .txt/.json/.jsonl file, or a hub dataset name")
    text_column: str = field("text", "text column of a json or hub dataset")
    cache_dir: str = field("{output_dir}/cache", "where packed token streams (and cached features) are kept; "
                                                 "{output_dir} is replaced; empty: none")
    seq_len: int = field(256, "training block length in tokens")
    batch_size: int = field(8, "blocks per micro-batch (an optimizer step sees batch_size x "
                               "gradient_accumulation_steps x processes blocks)")
    output_dir: str = field("runs/train", "everything the run writes: checkpoints, W&B run, caches, final/")
    export_dir: str = field("", "where the final model is saved (empty: output_dir/final)")
    max_steps: int = field(1000, "optimizer steps in total (raise it on a finished run to train on from its end)")
    lr: float = field(1e-3, "peak learning rate (AdamW)")
    betas: list[float] = field([0.9, 0.95], "AdamW betas")
    weight_decay: float = field(0.0, "AdamW weight decay")
    lr_scheduler_type: str = field("cosine_with_min_lr", "a transformers scheduler (get_scheduler): linear, cosine, "
                                                         "cosine_with_min_lr, constant_with_warmup, ...")
    min_lr_ratio: float = field(0.1, "cosine_with_min_lr: the final LR as a fraction of the peak")
    warmup_steps: int = field(0, "linear warmup steps")
    warmup_ratio: float = field(0.0, "linear warmup as a fraction of max_steps (used when warmup_steps is 0)")
    grad_clip: float = field(1.0, "gradient norm clip (0: none)")
    gradient_accumulation_steps: int = field(1, "micro-batches per optimizer step")
    mixed_precision: str = field("auto", "no, fp16 or bf16; auto: the accelerate config's fp16/bf16 if it sets "
                                         "one, else bf16 where bf16 products run natively (a GPU that has them, a CPU "
                                         "with AMX or AVX512-BF16), else fp32")
    eval_every: int = field(200, "held-out evaluation every N steps (and always at the end)")
    eval_blocks: int = field(32, "held-out blocks per evaluation")
    checkpoint_every: int = field(100, "checkpoint every N steps, and always at the last step "
                                       "(the most work an interruption loses)")
    checkpoint_total_limit: int = field(2, "checkpoints kept (older ones are deleted)")
    seed: int = field(0, "seed for init, noise and data order")
    wandb: bool = field(True, "log to Weights & Biases through accelerate (offline unless WANDB_MODE is set)")
    wandb_project: str = field("", "W&B project (empty: draftkit-<recipe>)")
    stop_at_step: int = field(0, "stop after this step as if killed (0: run to max_steps); for resume tests")

    def __post_init__(self):
        self.cache_dir = self.cache_dir.replace("{output_dir}", self.output_dir)
        bad = [f"{k} must be >= 1, got {getattr(self, k)}" for k in
               ("max_steps", "gradient_accumulation_steps", "checkpoint_every", "batch_size", "eval_every",
                "eval_blocks", "checkpoint_total_limit") if getattr(self, k) < 1]
        bad += [f"{k} must be >= 0, got {getattr(self, k)}" for k in ("warmup_steps", "grad_clip", "weight_decay")
                if getattr(self, k) < 0]
        bad += [problem for problem in (self._optimiser_problem(), self._output_problem()) if problem]
        bad += self.corpus_problems()  # before any model loads or any folder is made
        if bad:
            raise TrainError("; ".join(bad))

    def corpus_sources(self) -> list[str]:
        """The sources `corpus` names (one here; a drafter recipe's may name several)."""
        return [self.corpus]

    def corpus_problems(self) -> list[str]:
        """What is wrong with `corpus` (one line per bad source), checked before anything loads."""
        from draftkit.corpus import corpus_problem

        try:
            sources = self.corpus_sources()
        except TrainError as e:
            return [str(e)]
        return [f"--corpus {source}: {problem}" for source in sources if (problem := corpus_problem(source))]

    def _optimiser_problem(self) -> str | None:
        """What is wrong with the learning-rate settings, checked before anything loads."""
        from transformers import SchedulerType

        if not self.lr > 0:
            return f"lr must be > 0, got {self.lr}"
        if self.seq_len < 2:
            return f"seq_len must be >= 2 (a token and the next one to predict), got {self.seq_len}"
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.min_lr_ratio <= 1:
            return f"warmup_ratio must lie in [0, 1) and min_lr_ratio in [0, 1], got {self.warmup_ratio} and " \
                   f"{self.min_lr_ratio}"
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            return f"betas must be two numbers in [0, 1), got {self.betas}"
        schedulers = [t.value for t in SchedulerType]
        if self.lr_scheduler_type not in schedulers:
            return f"lr_scheduler_type {self.lr_scheduler_type!r} is not one of {', '.join(schedulers)}"
        if self.mixed_precision not in MIXED_PRECISION:
            return f"mixed_precision {self.mixed_precision!r} is not one of {', '.join(MIXED_PRECISION)}"
        return None

    def _output_problem(self) -> str | None:
        for flag in ("output_dir", "export_dir"):
            path = getattr(self, flag)
            if path and os.path.exists(path) and not os.path.isdir(path):
                return f"--{flag} {path} is a file, not a folder"
        out = self.export_dir
        if out and os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, "train_report.json")):
            # a folder a training run wrote holds its report (a rerun may write it again); anything else is not ours
            return f"--export_dir {out} holds files no training run wrote; choose an empty or new folder"
        return None


MIXED_PRECISION = ("auto", "no", "fp16", "bf16")

_HELP = {f.name: f.metadata["help"] for f in dataclasses.fields(TrainConfig)}


def shared(name: str, default):
    """A TrainConfig field with this recipe's default (and the shared help text)."""
    return field(default, _HELP[name])


class _ListAction(argparse.Action):
    """Collects a list flag's values; a value that is a YAML list ("[1, 3, -1]", "[]") is spliced in."""

    def __call__(self, parser, namespace, values, option_string=None):
        out = []
        for v in values:
            out.extend(v if isinstance(v, list) else [v])
        setattr(namespace, self.dest, out)


class RecipeParser(HfArgumentParser):
    """HfArgumentParser with list flags that also take a YAML list, whose errors are one line (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists every flag)\n")

    @staticmethod
    def _parse_dataclass_field(parser, field):
        origin = getattr(field.type, "__origin__", None)
        if origin is not list:
            HfArgumentParser._parse_dataclass_field(parser, field)
            for action in parser._actions:  # a true-by-default switch's --no_ flag: its own help, not the switch's
                if f"--no_{field.name}" in action.option_strings:
                    action.help = f"turn --{field.name} off"
            return
        item = field.type.__args__[0]

        def convert(text: str):
            if text == AUTO and field.metadata.get("auto"):
                return text
            value = yaml.safe_load(text) if text.startswith("[") else text
            return [item(x) for x in value] if isinstance(value, list) else item(value)

        names = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"] if "_" in field.name else [])
        parser.add_argument(*names, nargs="+", type=convert, action=_ListAction,
                            default=field.default_factory(), help=field.metadata.get("help"))


def load_recipe(path: str, cls, ignore_unknown: bool = False) -> dict:
    """The YAML's keys, checked against the recipe's fields (a typo is an error naming the nearest key, not a
    silent default); ignore_unknown keeps only the fields of `cls` (a tool that reads part of another recipe)."""
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a recipe is a YAML mapping of keys to values, got a {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if ignore_unknown:  # another recipe's keys are fine; a typo (no recipe's key) is not
        data = {k: v for k, v in data.items() if k in names}
        unknown = [k for k in unknown if k not in recipe_keys()]
        names = sorted(set(names) | recipe_keys())
    import typing

    types_of, autos = typing.get_type_hints(cls), {f.name for f in dataclasses.fields(cls) if f.metadata.get("auto")}
    wrong = [problem for key, value in data.items() if key in names
             for problem in [type_problem(key, value, types_of.get(key), auto=key in autos)] if problem]
    if wrong:
        raise ValueError(f"{path}: {'; '.join(wrong)}")
    if unknown:
        def hint(key):
            near = difflib.get_close_matches(str(key), names, n=1)
            return f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else "")

        raise ValueError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(hint, unknown))} "
                         f"for {cls.__name__}")
    return data


def type_problem(key: str, value, tp, auto: bool = False) -> str | None:
    """What is wrong with a YAML value for a field of type `tp` (None: fine, or a type this does not check)."""
    import types
    import typing

    def fits(v, t) -> bool:
        if t is type(None):
            return v is None
        if t is bool:
            return isinstance(v, bool)
        if t is int:
            return isinstance(v, int) and not isinstance(v, bool)
        if t is float:
            return isinstance(v, (int, float)) and not isinstance(v, bool)
        if t is str:
            return isinstance(v, str)
        if typing.get_origin(t) is list:
            return isinstance(v, list) and all(fits(x, typing.get_args(t)[0]) for x in v)
        if typing.get_origin(t) in (typing.Union, types.UnionType):  # Optional[X], X | None
            return any(fits(v, a) for a in typing.get_args(t))
        return True
    if tp is None or fits(value, tp) or (auto and value == AUTO):
        return None
    one = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    many = {bool: "true / false values", int: "integers", float: "numbers", str: "strings"}
    want = one.get(tp) or (f"a list of {many.get(typing.get_args(tp)[0], 'items')}" if typing.get_origin(tp) is list
                           else str(tp).replace("typing.", ""))
    return f"{key} must be {want}{' or auto' if auto else ''}, got {value!r}"


RECIPE_SCRIPTS = ("pretrain", "draft", "medusa", "eagle", "dflash")


def recipe_keys() -> set[str]:
    """Every key some recipe (train/<script>.py) takes: what a tool reading part of any recipe may meet."""
    import importlib

    keys = set()
    for script in RECIPE_SCRIPTS:
        module = importlib.import_module(f"draftkit.train.{script}")
        for v in vars(module).values():
            if isinstance(v, type) and dataclasses.is_dataclass(v) and issubclass(v, TrainConfig):
                keys |= {f.name for f in dataclasses.fields(v)}
    return keys


def parse_config(cls, argv=None, description: str = "", prog: str | None = None):
    """Build `cls` from --config YAML, then command-line overrides (argv: default sys.argv[1:]). `prog`: the
    script's name in messages (default: the running one's). A class with `reads_other_recipes` takes any recipe's
    YAML and reads only its own keys from it (typos are still errors)."""
    ignore_unknown = getattr(cls, "reads_other_recipes", False)
    # no abbreviations: `--max_step 5` taken as --max_steps hides a typo; it is named below like any unknown flag
    parser = RecipeParser(cls, prog=prog, description=description, formatter_class=_Formatter, allow_abbrev=False)
    parser.add_argument("--config", help="YAML recipe under recipes/ (its keys are the flags below; flags win)")
    for action in parser._actions:  # a class's `unused_flags`: accepted (a shared recipe sets them), not listed
        if action.dest in getattr(cls, "unused_flags", ()):
            action.help = argparse.SUPPRESS
    pre, _ = _config_flag.parse_known_args(argv)
    if pre.config:
        from draftkit.resources import recipe_path

        try:
            parser.set_defaults(**load_recipe(recipe_path(pre.config), cls, ignore_unknown))
        except FileNotFoundError:
            parser.error(f"--config {pre.config}: no such file")
        except (OSError, ValueError, yaml.YAMLError) as err:
            parser.error(" ".join(str(err).split()))
    _, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.error(unknown_flags(unknown, [a for action in parser._actions for a in action.option_strings]))
    try:
        cfg, _ = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    except TrainError as err:
        parser.error(str(err))
    return cfg


def unknown_flags(unknown: list[str], known: list[str]) -> str:
    """One line naming the arguments no flag takes, with the nearest known flag for each."""
    def hint(arg):
        near = difflib.get_close_matches(arg.split("=")[0], known, n=1) if arg.startswith("-") else []
        return f"{arg!r}" + (f" (did you mean {near[0]}?)" if near else "")

    flags = [a for a in unknown if a.startswith("-")] or unknown
    return f"unrecognized argument{'s' if len(flags) > 1 else ''}: {', '.join(map(hint, flags))}"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


_config_flag = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
_config_flag.add_argument("--config")


def resolve_model(name: str, kind: str, flag: str = "--target", target=None) -> str:
    """A model folder or hub id; "default" (or empty) is the shipped zoo's `kind` (target, draft, medusa, ...): for
    a draft of a named real target (`target` given: SmolLM2), the one shipped for it (`<target>/<kind>`)."""
    from draftkit.models import hub_problem, looks_like_path, resolve
    from draftkit.zoo import ZooError

    if name in ("", "default", None):
        try:
            if target is not None:
                from draftkit.drafters.registry import shipped_name
                kind = shipped_name(target, kind)
            path = Path(resolve(None, kind)).resolve()
        except ZooError as err:
            raise TrainError(f"{flag} default: {err}") from None
        return os.path.relpath(path) if path.is_relative_to(Path.cwd().resolve()) else str(path)
    from draftkit.gguf import REAL_TARGETS, RealTargetMissing, is_gguf, resolve_real

    if name in REAL_TARGETS or is_gguf(name):  # a named real target or a GGUF file: its converted folder
        try:
            return resolve_real(name)
        except (RealTargetMissing, FileNotFoundError) as err:
            raise TrainError(f"{flag} {err}") from None
    looks_local = looks_like_path(name)
    if looks_local and not os.path.exists(os.path.expanduser(name)):
        raise TrainError(f"{flag} {name}: no such folder (train it first, or leave {flag} unset for the "
                         f"shipped {kind})")
    problem = None if looks_local else hub_problem(name)
    if problem:  # before anything is created: no empty output folder is left behind
        raise TrainError(f"{flag} {name}: {problem}")
    return name


def mask_token(tokenizer, given: int) -> int:
    """The placeholder token of a one-forward drafter (P-EAGLE, DFlash): `given`, or (-1) the tokenizer's pad
    token, else its EOS."""
    if given >= 0:
        return given
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
