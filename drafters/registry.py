"""Drafter names -> (settings dataclass, builder), so that neither `draftkit.make_drafter`
nor eval/compare.py branches on a method's name, and CLI flags come from the dataclasses.

Every method shares the two budget knobs, `max_depth` and `max_nodes` (the most it may
draft per step; a budget policy may give less), and adds its own. Defaults give every
tree method the same node budget, so that side-by-side rows are like for like.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Callable

SHARED_DEPTH, SHARED_NODES = 4, 8  # the default budget of every method (a chain uses max_depth nodes)


def _knob(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass
class BudgetSettings:
    max_depth: int = _knob(SHARED_DEPTH, "most draft levels per step")
    max_nodes: int = _knob(SHARED_NODES, "most draft nodes per step (the tree size)")

    def __post_init__(self):  # every method alike (Budget(0, 0) is a plain step, asked for by the controller)
        if self.max_depth < 1 or self.max_nodes < 1:
            raise ValueError(f"max_depth and max_nodes must be >= 1, got {self.max_depth} and {self.max_nodes}")


@dataclass
class ModelDraftSettings(BudgetSettings):
    """The methods that run a draft model of their own."""
    draft_dtype: str = _knob("auto", "the draft model's dtype: auto (the target's, but bfloat16 beside a float32 "
                                     "target on a CPU with native bf16 matrix products when a draft forward reads 16 "
                                     "MB of weights or more), target, bfloat16, float16 or float32; drafts only "
                                     "propose, so the output is the same either way")

    def __post_init__(self):
        from draftkit.drafters.draft_dtype import check_draft_dtype

        super().__post_init__()
        check_draft_dtype(self.draft_dtype)


def _compile_knob():
    return _knob(False, "run the draft's own forwards (Medusa: its heads) compiled with static shapes (rows "
                        "padded to a bucket, fixed-size buffers; CUDA graphs on a GPU); each shape compiles once, "
                        "when a sequence or a batch's lanes start (past a buffer's size: on first use), said in one "
                        "line; compare.py --compile turns it on")


@dataclass
class CompilableDraftSettings(ModelDraftSettings):
    """The methods whose draft forwards can run on static shapes, compiled: the shared draft path (verify/tree.py
    run_model) for EAGLE, P-EAGLE and the standalone draft, DFlash's static block (drafters/dflash_static.py)."""
    compile_draft: bool = _compile_knob()


@dataclass
class StandaloneSettings(CompilableDraftSettings):
    top_k: int = _knob(1, "children expanded per node; 1 drafts a chain of max_depth tokens")
    temperature: float | None = _knob(None, "q temperature of sampled chains (default: the sampling temperature)")


@dataclass
class EagleSettings(CompilableDraftSettings):
    top_k: int = _knob(2, "EAGLE-2 children expanded per frontier node; 1 drafts a chain")
    temperature: float | None = _knob(None, "q temperature of sampled chains (default: the sampling temperature)")


@dataclass
class EagleChainSettings(EagleSettings):
    top_k: int = _knob(1, "1: a chain of max_depth tokens")


@dataclass
class ParallelSettings(CompilableDraftSettings):
    top_k: int = _knob(2, "children per node, cut from the per-depth distributions of the one draft forward; "
                          "1 drafts a chain")
    temperature: float | None = _knob(None, "q temperature of sampled drafts (default: the sampling temperature)")


@dataclass
class MedusaSettings(BudgetSettings):
    compile_draft: bool = _compile_knob()  # the heads (drafters/medusa_static.py)


@dataclass
class LookaheadSettings(BudgetSettings):
    ngram: int = _knob(3, "N: n-gram length of the lookahead branch (N - 1 levels)")
    window: int = _knob(2, "W: lookahead window; 0 is pure prompt lookup")
    guesses: int = _knob(4, "G: cached continuations verified per step")


AUTO_MEMBERS = ("suffix", "eagle")  # the hybrid's members unless named: those of them that fit the target


@dataclass
class HybridSettings(BudgetSettings):
    max_depth: int = _knob(12, "most levels of the merged tree per step (each member keeps its own cap too)")
    max_nodes: int = _knob(24, "most nodes of the merged tree per step (each member keeps its own cap too)")
    members: str = _knob("auto", "comma list of the drafters whose trees it merges, two or more, each used as named "
                                 "(a draft that does not fit the target is an error); auto: suffix and EAGLE as they "
                                 "fit the target (EAGLE-3 when its draft is given or, on a real target, shipped; "
                                 "without a fitting draft, lookahead)")
    min_chance: float = _knob(0.01, "nodes whose calibrated chance of being reached is below this (greedy: or "
                                    "below the step's own floor, when the controller gives one) are not verified, "
                                    "in [0, 1)")
    probe_every: int = _knob(8, "steps a member that does not pay waits before it is asked again "
                                "(doubling up to 16)")
    compile_draft: bool = _knob(False, "its members' draft forwards compiled (those that run a draft model of their "
                                       "own; see the standalone setting)")

    def __post_init__(self):
        super().__post_init__()
        names = member_names(self.members)
        bad = [n for n in names if n not in REGISTRY or REGISTRY[n].settings is HybridSettings]
        if bad:
            members = ", ".join(n for n, e in REGISTRY.items() if e.settings is not HybridSettings)
            raise ValueError(f"hybrid members {', '.join(bad)} are not drafters it can merge; choose from {members}")
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"hybrid members must be two or more different drafters, got {self.members!r}")
        if not 0.0 <= self.min_chance < 1.0:  # also rejects nan
            raise ValueError(f"min_chance must be in [0, 1), got {self.min_chance}")
        if self.probe_every < 1:
            raise ValueError(f"probe_every must be >= 1, got {self.probe_every}")


def member_names(text: str) -> list[str]:
    if str(text).strip() == "auto":
        return list(AUTO_MEMBERS)
    return [n.strip() for n in str(text).split(",") if n.strip()]


@dataclass
class Entry:
    settings: type
    build: Callable  # (target, path, tokenizer, settings) -> Drafter
    default_model: str | None  # the zoo folder used when no path is given
    about: str
    train_hint: str = ""  # how to make the model when the zoo does not ship it (compare.py's `all` then skips it)
    composite: bool = False  # made of other drafters: its path is a {zoo folder: path} mapping for them


def shipped_name(target, kind: str, hint: str = "") -> str:
    """The zoo entry a drafter of `kind` loads when no path is given: `<real target>/<kind>` for a named real target
    (smollm2-135m: drafts trained for it), else the shipped family's `kind`. A real target without such a draft is
    a one-line error saying how to make one."""
    from draftkit.gguf import real_name
    from draftkit.zoo import ZooError, available

    family = real_name(target)
    if family is None:
        return kind
    name = f"{family}/{kind}"
    if name not in available():
        raise ZooError(f"no {kind} draft is shipped for {family}: {hint or 'train one with the recipes under recipes/'}"
                       f", then pass its folder (make_drafter(..., path=DIR) or compare.py --{kind} DIR)")
    return name


def _standalone(target, path, tokenizer, s: StandaloneSettings):
    from transformers import AutoTokenizer

    from draftkit.models import load_model, resolve
    from draftkit.drafters.draft_dtype import draft_dtype, reads_of
    from draftkit.drafters.standalone import StandaloneDrafter, check_same_vocabulary

    draft_path = resolve(path, "draft" if path else shipped_name(target, "draft"))
    flags = dataclasses.asdict(s)
    draft = load_model(draft_path, dtype=target.dtype).to(target.device)
    draft = draft.to(draft_dtype(target, flags.pop("draft_dtype"), reads_of(draft, target, False)))
    draft_tok = AutoTokenizer.from_pretrained(draft_path) if tokenizer is not None else None
    check_same_vocabulary(target, draft, tokenizer, draft_tok, target_name="target",
                          draft_name=path or "the default draft")
    return StandaloneDrafter(draft, **flags)


def _eagle_from(default: str):
    def build_eagle(target, path, tokenizer, s: EagleSettings):
        from draftkit.models import resolve
        from draftkit.drafters.eagle import EagleDrafter

        return EagleDrafter.from_pretrained(resolve(path, default if path else shipped_name(target, default)), target,
                                            **dataclasses.asdict(s))
    return build_eagle


def tree_drafter_class(draft) -> type:
    """The drafter that drafts trees from a loaded EAGLE-family or DFlash draft: DFlashDrafter, PEagleDrafter
    (an EAGLE-3 draft with mask_hidden) or EagleDrafter."""
    from draftkit.drafters.dflash import DFlashDraft, DFlashDrafter
    from draftkit.drafters.eagle import EagleDrafter
    from draftkit.drafters.peagle import PEagleDraft, PEagleDrafter

    return DFlashDrafter if isinstance(draft, DFlashDraft) else PEagleDrafter if isinstance(draft, PEagleDraft) \
        else EagleDrafter


def _shipped_or_given(target, path, default: str, hint: str) -> str:
    """The given folder, or the zoo's; a one-line error saying how to train it when the zoo has none."""
    from draftkit.models import resolve
    from draftkit.zoo import ZooError, available

    if path in (None, "", "default"):
        default = shipped_name(target, default, hint)
    if path in (None, "", "default") and default not in available():
        raise ZooError(f"no {default} draft is shipped yet: {hint}, then pass its folder (make_drafter(..., "
                       f"path=DIR) or compare.py --{default} DIR)")
    return resolve(path, default)


def _peagle(target, path, tokenizer, s: ParallelSettings):
    from draftkit.drafters.peagle import PEagleDrafter

    return PEagleDrafter.from_pretrained(_shipped_or_given(target, path, "peagle", REGISTRY["peagle"].train_hint), target,
                                         **dataclasses.asdict(s))


def _dflash(target, path, tokenizer, s: ParallelSettings):
    from draftkit.drafters.dflash import DFlashDrafter

    return DFlashDrafter.from_pretrained(_shipped_or_given(target, path, "dflash", REGISTRY["dflash"].train_hint), target,
                                         **dataclasses.asdict(s))


def _medusa(target, path, tokenizer, s: MedusaSettings):
    from draftkit.models import resolve
    from draftkit.drafters.medusa import MedusaDrafter

    drafter = MedusaDrafter.from_pretrained(resolve(path, "medusa" if path else shipped_name(target, "medusa")), target,
                                            tree_size=s.max_nodes, compile_draft=s.compile_draft)
    drafter.budget_cap.max_depth = min(drafter.budget_cap.max_depth, s.max_depth)
    return drafter


def _lookahead(target, path, tokenizer, s: LookaheadSettings):
    from draftkit.drafters.lookahead import LookaheadDrafter

    return LookaheadDrafter(**dataclasses.asdict(s))


def available_members(target, names: list[str], paths: dict) -> list[str]:
    """The default (`auto`) hybrid's members: an EAGLE-2 member whose draft is not given becomes its EAGLE-3 sibling
    when an EAGLE-3 draft is given, or shipped for a named real target (the pairing measured on it,
    docs/real-models.md); on a real target any other member whose draft is not shipped (and not given) is left out;
    lookahead makes up two."""
    from draftkit import zoo
    from draftkit.gguf import real_name

    names = ["eagle3" if n in ("eagle", "eagle-chain") and paths.get("eagle3") and not paths.get("eagle") else n
             for n in names]
    family = real_name(target)
    if family is None:
        return two_or_more(names)
    shipped = zoo.shipped_for(family)
    out = []
    for n in names:
        model = REGISTRY[n].default_model
        if n in ("eagle", "eagle-chain") and "eagle3" in shipped and not paths.get(model):
            out.append("eagle3")
        elif model is None or model in shipped or paths.get(model):
            out.append(n)
    return two_or_more(out)


def two_or_more(names: list[str]) -> list[str]:
    """A hybrid's member names without repeats; suffix and lookahead (no model to load) make up two."""
    out = list(dict.fromkeys(names))
    return out if len(out) > 1 else list(dict.fromkeys(out + ["suffix", "lookahead"]))[:2]


def compiled_flag(name: str, s) -> dict:
    """{"compile_draft": True} when `s` asks for compiled draft forwards and method `name` has them."""
    fields = {f.name for f in dataclasses.fields(REGISTRY[name].settings)}
    return {"compile_draft": True} if s.compile_draft and "compile_draft" in fields else {}


def _hybrid(target, paths, tokenizer, s: HybridSettings):
    """The hybrid of the members that fit the target: a member whose draft was not given and whose shipped draft
    was made for another target (your own model beside the shipped family's drafts) is left out, in one line."""
    from draftkit.drafters.hybrid import HybridDrafter
    from draftkit.verify.contract import DraftMismatch
    from draftkit.zoo import ZooError

    paths = paths or {}
    members = {}
    asked = s.members.strip() != "auto"  # members named by the user: each one as asked, or a one-line error
    for n in member_names(s.members) if asked else available_members(target, member_names(s.members), paths):
        given = paths.get(REGISTRY[n].default_model)
        try:
            members[n] = build(n, target, given, tokenizer, **compiled_flag(n, s))
        except (DraftMismatch, ZooError) as err:
            if given or asked:
                raise type(err)(f"hybrid member {n}: {err}") from None
            logging.getLogger("draftkit").warning("draftkit: the hybrid leaves out %s: %s", n, err)
    for n in two_or_more(list(members)):  # suffix and lookahead (nothing to load) make up two
        if n not in members:
            members[n] = build(n, target, None, tokenizer, **compiled_flag(n, s))
    return HybridDrafter(list(members.items()), s.max_depth, s.max_nodes, s.min_chance, s.probe_every)


REGISTRY: dict[str, Entry] = {
    "standalone": Entry(StandaloneSettings, _standalone, "draft", "a small causal LM: a chain (or top-k tree)"),
    "medusa": Entry(MedusaSettings, _medusa, "medusa", "Medusa heads: a sparse tree of head top-k choices"),
    "eagle": Entry(EagleSettings, _eagle_from("eagle"), "eagle", "EAGLE feature-level draft: EAGLE-2 dynamic tree"),
    "eagle-chain": Entry(EagleChainSettings, _eagle_from("eagle"), "eagle", "EAGLE drafting a chain"),
    "eagle3": Entry(EagleSettings, _eagle_from("eagle3"), "eagle3",
                    "EAGLE-3 draft (fused low / middle / high target features): EAGLE-2 dynamic tree"),
    "lookahead": Entry(LookaheadSettings, _lookahead, None, "n-gram cache + Jacobi lookahead branch, no training"),
    "peagle": Entry(ParallelSettings, _peagle, "peagle",
                    "P-EAGLE: EAGLE-3 with parallel drafting, every depth in one draft forward",
                    "train it with `python train/eagle.py --config recipes/eagle/peagle.yaml`"),
    "dflash": Entry(ParallelSettings, _dflash, "dflash",
                    "DFlash block drafter: a block of masked positions in one non-causal draft forward",
                    "train it with `python train/dflash.py --config recipes/dflash/dflash.yaml`"),
}


def register(name: str, entry: Entry) -> None:
    REGISTRY[name] = entry


def _suffix_entry() -> None:
    """The suffix drafter registers itself when its module is present."""
    try:
        from draftkit.drafters.suffix import SuffixConfig, SuffixDrafter
    except ImportError:
        return
    REGISTRY["suffix"] = Entry(SuffixConfig, lambda t, p, tok, s: SuffixDrafter(**dataclasses.asdict(s)), None,
                               "suffix index over prompt, output and past requests, no training")


_suffix_entry()
REGISTRY["hybrid"] = Entry(HybridSettings, _hybrid, None, "several drafters' trees merged into one, cut by "
                           "calibrated chance per member (drafters/hybrid.py)", composite=True)


def uses(name: str, **flags) -> list[str]:
    """The drafters that method `name` runs: itself, or a composite's members."""
    if REGISTRY[name].composite:
        return member_names(settings_for(name, **flags).members)
    return [name]


def settings_for(name: str, **flags):
    """The settings of method `name` with `flags` applied; unknown names and flags are one-line errors."""
    if name not in REGISTRY:
        raise ValueError(f"unknown drafter {name!r}; choose one of {', '.join(REGISTRY)}")
    if "seed" in flags:  # one seed per run, not per drafter: the loop hands it to the drafter and the verifier
        raise ValueError("a drafter takes no seed: pass seed= to generate (or generate_batch / best_of_n), which "
                         "seeds the drafter's draws and the verifier's together")
    cls = REGISTRY[name].settings
    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(flags) - known)
    if bad:
        raise ValueError(f"drafter {name!r} has no setting {', '.join(bad)}; it has {', '.join(sorted(known))}")
    return cls(**flags)


def build(name: str, target, path=None, tokenizer=None, **flags):
    """A drafter by name. `path`: its model / heads (None: the shipped default); for a composite
    drafter (hybrid), a {zoo folder: path} mapping for its members, e.g. {"eagle": "my/eagle"}."""
    settings = settings_for(name, **flags)
    entry = REGISTRY[name]
    if path and entry.default_model is None and not entry.composite:
        raise ValueError(f"{name} drafts without a model of its own: it takes no path (got {path!r})")
    return entry.build(target, path, tokenizer, settings)
