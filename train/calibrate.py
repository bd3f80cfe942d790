"""Fit a tree draft's tree temperature (EAGLE-2, EAGLE-3, P-EAGLE, DFlash). The greedy tree keeps the paths with
the highest sum of log softmax(logits / T) (drafters/tree_search.py), so its shape rests on how well the draft's
confidence tracks what the target keeps. Drafts trained on the target's soft labels are under-confident: on the
target's own text the shipped EAGLE-2 draft gives its top-1 token a mean probability of 0.30 where the target keeps
it 0.91 of the time (EAGLE-3: 0.28 against 0.88), and at T = 1 the tree spends nodes on depth-1 siblings instead of
depth. T is chosen from a few values by the tokens a step the default tree commits on held-out prompts, greedy, and
stored in the draft's config.json (`tree_temperature`; chains and sampled trees do not read it). train/eagle.py
and train/dflash.py fit it at the end of every run.

    python train/calibrate.py zoo/eagle                      # writes tree_temperature into zoo/eagle/config.json
    python train/calibrate.py runs/eagle3-ref/final --prompts 16 --dry-run
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

GRID = (1.0, 0.7, 0.5, 0.35, 0.25)  # tree temperatures tried, 1.0 (the draft as trained) first
MIN_GAIN = 0.01  # the draft keeps T = 1 unless another T commits this much more a step (not a fit to noise)
KINDS = ("eagle", "dflash")  # config kinds of the drafts whose greedy tree reads tree_temperature


def tree_drafter(target, draft):
    """The drafter of an EAGLE (-2, -3, P-EAGLE) or DFlash draft at the default caps (registry.py: depth 4,
    8 nodes, top-k 2), in the target's dtype: the draft being trained is never cast in place (to bf16 beside an
    fp32 target on a CPU with bf16 products, drafters/draft_dtype.py, before it is saved)."""
    from draftkit.drafters.registry import SHARED_DEPTH, SHARED_NODES, EagleSettings, tree_drafter_class

    return tree_drafter_class(draft)(target, draft, max_depth=SHARED_DEPTH, max_nodes=SHARED_NODES,
                                     top_k=EagleSettings().top_k, draft_dtype="target")


@torch.no_grad()
def calibrate(target, draft, stream: torch.Tensor, prompts: int = 12, new_tokens: int = 64, prompt_len: int = 128,
              grid=GRID) -> tuple[float, dict]:
    """The tree temperature of `grid` under which the draft's greedy tree of the default caps commits the most
    tokens a step on `prompts` held-out prompts taken evenly from `stream` (ties: the higher temperature; 1.0
    unless the best commits MIN_GAIN more). A timing-free measure: a fixed budget, every step the caps."""
    from draftkit.train.decode_eval import decode_stats, heldout_prompts

    heads = heldout_prompts(stream, prompts, prompt_len, target.device)
    if not heads:
        raise ValueError(f"the held-out text holds no prompt of {prompt_len} tokens")
    tau = {}
    for t in grid:
        draft.config.tree_temperature = t
        tau[t] = decode_stats(target, tree_drafter(target, draft), heads, new_tokens).tau
    best = max(grid, key=lambda t: (round(tau[t], 3), t))
    if 1.0 in tau and tau[best] < tau[1.0] * (1 + MIN_GAIN):
        best = 1.0
    draft.config.tree_temperature = best
    return best, {"prompts": len(heads), "tau_by_temperature": {str(t): round(v, 4) for t, v in tau.items()}}


def fit_for_report(target, draft, stream: torch.Tensor, prompts: int, new_tokens: int) -> dict:
    """The end of a training run: fit the draft's tree temperature (sets draft.config) and say so in the report;
    with no held-out prompt long enough the draft keeps 1.0 and the report says why."""
    if prompts < 1:
        return {}
    try:
        t, fit = calibrate(target, draft.float().eval(), stream, prompts, new_tokens)
    except ValueError as e:  # too little held-out text (tiny test corpora)
        return {"tree_temperature": 1.0, "tree_temperature_fit": str(e)}
    return {"tree_temperature": t, "tree_temperature_fit": fit}


def heldout_stream(tokenizer, corpus: str = "python", tokens: int = 40_000) -> torch.Tensor:
    """The first `tokens` tokens of the corpus's held-out files."""
    from draftkit.corpus import build_corpus

    ids: list[int] = []
    for text in build_corpus(corpus).heldout["text"]:
        ids += tokenizer(text).input_ids
        if len(ids) >= tokens:
            break
    return torch.tensor(ids[:tokens])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python train/calibrate.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("draft", metavar="DRAFT_DIR", help="an EAGLE (-2, -3, P-EAGLE) or DFlash draft folder in "
                                                       "draftkit's format")
    ap.add_argument("--target", default=None, help="the target (default: the shipped one)")
    ap.add_argument("--corpus", default="python", help="corpus whose held-out files give the prompts (default: "
                                                       "%(default)s)")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts (default: %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens the target writes per prompt (default: "
                                                               "%(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="print the fit, write nothing")
    args = ap.parse_args(argv)
    config = os.path.join(args.draft, "config.json")
    if not os.path.isfile(config):
        ap.error(f"{args.draft} holds no config.json: pass an EAGLE or DFlash draft folder")
    if args.prompts < 1 or args.new_tokens < 1:
        ap.error("--prompts and --new-tokens must be >= 1")
    from draftkit.corpus import corpus_problem

    if corpus_problem(args.corpus):
        ap.error(f"--corpus {args.corpus}: {corpus_problem(args.corpus)}")
    with open(config) as fh:
        raw = json.load(fh)
    if raw.get("kind") not in KINDS:  # before any model loads
        kind = raw.get("kind") or raw.get("model_type")
        ap.error(f"{args.draft} is not a draftkit EAGLE or DFlash draft (config kind {kind!r}); export formats "
                 "do not carry tree_temperature")
    import draftkit as dk
    from draftkit.files import write_text_atomically
    from draftkit.drafters.dflash_formats import load_dflash_draft
    from draftkit.drafters.formats import load_eagle_draft

    try:
        target, tokenizer = dk.load_target(args.target)
    except OSError as e:  # a folder that is not there, a hub id out of reach
        ap.error(f"--target {' '.join(str(e).split())}")
    load = load_dflash_draft if raw["kind"] == "dflash" else load_eagle_draft
    try:
        draft = load(args.draft, target).float().eval()
    except ValueError as e:  # made for another target
        ap.error(" ".join(str(e).split()))
    try:
        t, fit = calibrate(target, draft, heldout_stream(tokenizer, args.corpus), args.prompts, args.new_tokens)
    except ValueError as e:  # a held-out text too short for the prompts asked
        ap.error(f"--corpus {args.corpus}: {' '.join(str(e).split())}")
    print(f"{args.draft}: tree_temperature {t} ({json.dumps(fit)})")
    if not args.dry_run:
        raw["tree_temperature"] = t
        write_text_atomically(config, json.dumps(raw, indent=2))  # never a half-written config
    return 0


if __name__ == "__main__":
    sys.exit(main())
