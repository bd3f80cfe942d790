"""Train a DFlash block drafter (drafters/dflash.py) for a frozen target.

    accelerate launch --config_file recipes/accelerate/single.yaml train/dflash.py --config recipes/dflash/dflash.yaml
    python train/dflash.py --config recipes/dflash/dflash.yaml          # one CPU

Each step runs the frozen target under no_grad over a batch of token blocks for the hidden states the draft
fuses and its last hidden state, then trains the draft with train/dflash_loss.py: blocks of block_size
positions cut at random anchors ([anchor token, mask, ...]), every mask position predicted in one forward
from the context before the anchor, soft cross-entropy against the target's distributions, slot j weighted
exp(-(j - 1) / gamma). The draft reads the target's embedding and LM head; only its layers, fc and norms train.

At the end it fits the tree temperature (train/calibrate.py), measures held-out per-slot top-1 agreement, the
greedy accepted length per block it implies and the mean accepted length tau of the drafter on held-out prompts,
saves the draft folder (export it with
train/export.py --format vllm or speculators) and prints a JSON report.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft  # noqa: E402
from draftkit.train.config import (AUTO, TrainError, auto_layers, auto_or_list, field, mask_token,  # noqa: E402
                                   parse_config, resolve_model, shared)
from draftkit.train.calibrate import fit_for_report  # noqa: E402
from draftkit.train.decode_eval import measure_tau  # noqa: E402
from draftkit.train.dflash_loss import DFlashLoss  # noqa: E402
from draftkit.train.loop import Loop, cli  # noqa: E402
from draftkit.train.targetdata import TargetDataConfig, target_data  # noqa: E402


@dataclass
class DFlashTrainConfig(TargetDataConfig):
    target: str = field("default", "target model (a folder, a hub id, a GGUF file, a named real target such as "
                                   "smollm2-135m, or default: the shipped target); its tokenizer is used too")
    block_size: int = field(9, "B: the root and B - 1 masked positions drafted in one forward (B - 1 draft tokens "
                               "per step at most)")
    draft_layers: int = field(3, "decoder layers of the draft")
    target_layers: list[int] = field([], "hidden-state indices fused into the context (0 = embeddings, k = the "
                                         "stream entering layer k); [] = z-lab's choice, one per draft layer "
                                         "spread over layers 1 .. L - 3; auto = (2, L//2, L-3) from the target's "
                                         "config, the EAGLE-3 engines' choice", auto=True)
    mask_token_id: int = field(-1, "the mask token's id (its target embedding is the masked positions' input; -1: "
                                   "the tokenizer's pad token, else its EOS)")
    anchors: int = field(16, "blocks cut from each training sequence per step (random anchors)")
    gamma: float = field(4.0, "loss weight of slot j is exp(-(j - 1) / gamma)")
    init_from: str = field("", "continue from an existing DFlash draft (a folder, or default: the shipped one) instead "
                               "of a new one; its block size, layers and context layers are this run's")
    eval_tau_prompts: int = field(4, "held-out prompts for the final tau measurement (0: skip)")
    eval_new_tokens: int = field(64, "tokens generated per prompt for tau")
    output_dir: str = shared("output_dir", "runs/dflash")
    lr: float = field(6e-4, "peak learning rate")
    warmup_steps: int = shared("warmup_steps", 50)
    max_steps: int = shared("max_steps", 500)
    grad_clip: float = shared("grad_clip", 1.0)

    def __post_init__(self):
        super().__post_init__()
        self.target_layers = auto_or_list(self.target_layers)
        if self.block_size < 2 or self.draft_layers < 1 or self.anchors < 1:
            raise TrainError(f"block_size must be >= 2, draft_layers and anchors >= 1; got {self.block_size}, "
                             f"{self.draft_layers}, {self.anchors}")
        if self.seq_len <= self.block_size:
            raise TrainError(f"seq_len ({self.seq_len}) must exceed block_size ({self.block_size})")


def initial_draft(cfg, target):
    """(draft, folder): the draft of cfg.init_from (default: the shipped DFlash), checked against this run's
    settings, and the folder it came from."""
    from draftkit.drafters.dflash_formats import load_dflash_draft

    folder = resolve_model(cfg.init_from, "dflash", "--init_from", target)
    try:
        draft = load_dflash_draft(folder, target).float().train()
    except (OSError, ValueError) as err:
        raise TrainError(f"--init_from {cfg.init_from}: {err}") from None
    c = draft.config
    layers = cfg.target_layers or list(c.target_layers)
    if (c.block_size, c.draft_layers, list(c.target_layers)) != (cfg.block_size, cfg.draft_layers, layers):
        raise TrainError(f"--init_from {cfg.init_from} has block {c.block_size}, {c.draft_layers} layer(s), context "
                         f"layers {list(c.target_layers)}; this run's are {cfg.block_size}, {cfg.draft_layers}, "
                         f"{layers}")
    return draft, folder


@torch.no_grad()
def heldout(loss_fn: DFlashLoss, data, blocks: int) -> dict:
    """Held-out loss, per-slot agreement and accepted length over held-out rows (fixed anchors)."""
    was = loss_fn.training
    loss_fn.eval()
    sums, count = {}, 0
    gen = torch.Generator().manual_seed(0)
    for b in data.heldout(blocks):
        res = loss_fn(b.ids, b.loss_mask, b.hidden, b.last, gen=gen)
        for k, v in res.items():
            sums[k] = sums.get(k, 0.0) + float(v) * b.ids.shape[0]
        count += b.ids.shape[0]
    loss_fn.train(was)
    return {k: v / max(1, count) for k, v in sums.items()}


def main(argv=None):
    cfg = parse_config(DFlashTrainConfig, argv, description=__doc__)
    target_path = resolve_model(cfg.target, "target")
    with Loop(cfg, "draftkit-dflash") as loop:
        acc = loop.acc
        tokenizer = AutoTokenizer.from_pretrained(target_path)
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).to(acc.device).eval()
        target.requires_grad_(False)
        mask = mask_token(tokenizer, cfg.mask_token_id)
        if cfg.target_layers == AUTO:  # the recipe fits any target: its layers come from this one's config
            cfg.target_layers = auto_layers(target)
        torch.manual_seed(cfg.seed)
        try:
            if cfg.init_from:
                draft, start = initial_draft(cfg, target)
                loop.continue_from(start)
            else:
                draft = make_dflash_draft(target, cfg.block_size, mask, cfg.draft_layers, cfg.target_layers or None)
        except ValueError as e:
            raise TrainError(str(e)) from None
        draft.config.target_name = target_path
        n_params = sum(p.numel() for p in draft.parameters())
        acc.print(f"DFlash draft: {n_params:,} parameters, {cfg.draft_layers} layer(s), block {cfg.block_size}, "
                  f"context from hidden states {draft.config.target_layers}, mask token {mask}")
        data = target_data(cfg, target, tokenizer, acc, draft.config.target_layers, seed=cfg.seed)
        loop.tokens_per_row = data.tokens_per_epoch / data.rows.shape[0]
        heldout_text = data.heldout_stream if data.heldout_stream is not None else data.heldout_rows[0].flatten()
        (loss_fn,) = loop.prepare(DFlashLoss(draft, target, cfg.anchors, cfg.gamma))

        def step_loss(i):
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + i)  # anchors depend only on the step
            b = data.batch(i, beyond=cfg.block_size)  # blocks that start near the last trained token
            res = loss_fn(b.ids, b.loss_mask, b.hidden, b.last, gen=gen)
            return res.pop("loss"), res

        def evaluate():
            return heldout(loop.unwrap(loss_fn), data, cfg.eval_blocks)

        result = loop.run(step_loss, evaluate, desc="dflash", show=("acc_1", "accepted_length"))
        history = result.history
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": history}
        final, model = result.final, loop.unwrap(loss_fn)
        report = {}
        if acc.is_main_process:
            out = loop.final_dir
            model.draft.config.attention_window = cfg.seq_len  # decoding sees the distances it trained on
            tree = fit_for_report(target, model.draft, heldout_text, cfg.eval_tau_prompts * 3, cfg.eval_new_tokens)
            model.draft.save_pretrained(out)
            drafter = DFlashDrafter(target, model.draft.eval(), max_depth=min(4, cfg.block_size - 1),
                                    draft_dtype="target")  # the trained draft is not cast in place
            decode = measure_tau(target, drafter, heldout_text, cfg.eval_tau_prompts, cfg.eval_new_tokens)
            model.draft.float().train()
            if decode:
                loop.log({"heldout/tau": decode["tau"]}, step=cfg.max_steps)
            report = {
                "heldout_loss": final.get("loss"), "heldout_top1": final.get("acc_1"),
                "heldout_top1_by_slot": [final[f"acc_{j}"] for j in range(1, cfg.block_size) if f"acc_{j}" in final],
                "heldout_accepted_length": final.get("accepted_length"), **decode, **tree,
                "attention_window": model.draft.config.attention_window,
                "params": n_params, "steps": cfg.max_steps, "resumed_from": result.start_step,
                "first_train": history[0] if history else None, "last_train": history[-1] if history else None,
                "block_size": cfg.block_size, "draft_layers": cfg.draft_layers,
                "target_layers": model.draft.config.target_layers, "mask_token_id": mask,
                "target": target_path, "corpus": data.corpus.source, "corpus_fingerprint": data.corpus.fingerprint,
                "regenerated": cfg.regenerate, "data_mode": cfg.data_mode,
                **loop.token_counts(cfg.max_steps),
                "scaling": loop.heldout_history(),
                "output": out,
            }
            loop.write_report(report)
    return {**report, "history": history}


if __name__ == "__main__":
    cli(main)
