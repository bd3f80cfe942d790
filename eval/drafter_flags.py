"""compare.py's drafter flags, generated from the settings dataclasses of drafters/registry.py.

Two knobs are shared by every method: --max-depth and --max-nodes (the most a method may
draft per step; under --budget auto the controller may give less). Every other setting is
--<method>-<setting>, e.g. --eagle-top-k, --lookahead-window, --suffix-min-prob. A flag
left unset keeps the method's own default (shown in --help).
"""
from __future__ import annotations

import dataclasses
import typing

from draftkit.drafters.registry import REGISTRY, SHARED_DEPTH, SHARED_NODES
from draftkit.eval.cli_checks import UsageError

SHARED = ("max_depth", "max_nodes")


def on_off(text: str) -> bool:
    """A yes/no flag's value: on / off (true / false, yes / no, 1 / 0 too)."""
    value = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False,
             "0": False}.get(text.lower())
    if value is None:
        raise ValueError(text)
    return value


on_off.__name__ = "on / off"  # argparse names the type in its one-line error


def _kind(cls, name: str):
    """The Python type a setting's flag parses to (int, float, str, or on / off for a bool)."""
    hint = typing.get_type_hints(cls)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return on_off if args[0] is bool else args[0] if args[0] in (int, float, str) else str


def _dest(method: str, field: str) -> str:
    return f"{method}_{field}".replace("-", "_")


def add_drafter_flags(ap) -> None:
    group = ap.add_argument_group("drafting (settings of drafters/registry.py; unset: each method's default)")
    group.add_argument("--budget", choices=("auto", "fixed", "both"), default="auto",
                       help="auto: the cost-aware controller picks each step's depth and nodes (down to a plain "
                            "step) within the caps below; fixed: every step drafts the caps; both: each drafter "
                            "twice, interleaved in the same run (rows '<method>' and '<method> fixed') "
                            "(default: %(default)s)")
    group.add_argument("--max-depth", type=int, default=None,
                       help=f"most draft levels per step, for every method (default: each method's own, {SHARED_DEPTH} "
                            "for most)")
    group.add_argument("--max-nodes", type=int, default=None,
                       help=f"most draft nodes per step, for every method (default: each method's own, {SHARED_NODES} "
                            "for most; a chain uses --max-depth)")
    for method, entry in REGISTRY.items():
        for f in dataclasses.fields(entry.settings):
            if f.name in SHARED:
                continue
            kind = _kind(entry.settings, f.name)
            group.add_argument(f"--{method}-{f.name}".replace("_", "-"), dest=_dest(method, f.name), type=kind,
                               default=None, help=f"{method}: {with_default(f.metadata.get('help', f.name), f.default)}")


def with_default(text: str, default) -> str:
    """A setting's help with its default, unless the help already says it ("(default: ...)")."""
    return text if "(default:" in text else f"{text} (default: {default})"


def drafter_settings(args, method: str) -> dict:
    """The settings compare.py's flags give `method` (only those set explicitly; --compile sets compile_draft
    where a method has it and its own flag is unset)."""
    out = {k: getattr(args, k) for k in SHARED if getattr(args, k, None) is not None}
    for f in dataclasses.fields(REGISTRY[method].settings):
        value = getattr(args, _dest(method, f.name), None)
        if f.name == "compile_draft" and value is None and getattr(args, "compile", False):
            value = True
        if f.name not in SHARED and value is not None:
            out[f.name] = value
    return out


def check_drafter_flags(args) -> None:
    """Counts must be positive (window and offset-like settings may be 0); each error names its flag."""
    for name in SHARED:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    for method, entry in REGISTRY.items():
        try:
            entry.settings(**{k: v for k, v in drafter_settings(args, method).items()})
        except (TypeError, ValueError) as exc:
            raise UsageError(f"{method} settings: {exc}") from None
        for f in dataclasses.fields(entry.settings):
            value = getattr(args, _dest(method, f.name), None)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise UsageError(f"--{method}-{f.name.replace('_', '-')} must be >= 0, got {value}")
            if f.name == "top_k" and value is not None and value < 1:
                raise UsageError(f"--{method}-top-k must be >= 1, got {value}")
