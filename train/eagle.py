r"""Train an EAGLE draft (EAGLE-1/2, or EAGLE-3 features + training-time test) for a frozen target.

    python train/launch.py --config_file recipes/accelerate/single.yaml \
        train/eagle.py --config recipes/eagle/eagle2.yaml
    python train/eagle.py --config recipes/eagle/eagle2.yaml          # one CPU
    python train/eagle.py --config recipes/eagle/eagle3.yaml
    python train/eagle.py --config recipes/eagle/peagle.yaml         # P-EAGLE (parallel_depths > 0)

Each step reads a batch of rows and the frozen target's hidden states from the one data path
(train/targetdata.py: text the target regenerated, its features stored once and read every epoch, or
computed online) and trains the draft on pairs (f_t, x_{t+1}) -> f_{t+1}:
  loss = sum_i ttt_decay^i * (feature_loss_weight * SmoothL1(f^, f) +
                               token_loss_weight * token_loss(p_target, q_draft))
over the trained positions (loss_mask), where step i > 0 of the training-time test feeds the draft its own
predicted features (as at decoding time, along a chain) and step 0 the true, noised ones. token_loss is the
cross-entropy, or with acceptance_loss = lambda > 0, (1 - lambda) CE - lambda log(sum_x min(p(x), q(x))): the
sum is the chance a draw of q passes p (1 - total variation), the quantity speculative sampling runs on, which
a small draft's cross-entropy optimum need not maximise (LK losses, arXiv 2602.23881); the CE share keeps the
gradient alive where the two barely overlap.
EAGLE-1/2: ttt_steps 1, losses 1.0 / 0.1. EAGLE-3: fused low/mid/high features,
ttt_steps > 1, feature loss 0.

layout: draftkit (default; drafters/eagle.py, what the zoo ships) or reference
(drafters/eagle_reference.py: the EAGLE-1/2 / EAGLE-3 computation vLLM and SGLang
run, exportable with train/export.py). A reference EAGLE-3 reads three residual
streams entering layers 1..L-1 (e.g. [2, L//2, L-3]), feeds back its pre-norm
output and predicts tokens over a reduced draft vocabulary: the draft_vocab_size
most frequent target tokens of the training data (d2t / t2d); its CE is taken
against the target's distribution restricted to that vocabulary, on positions
whose target top-1 is in it (as SpecForge does).

The target defaults to the shipped one (zoo/target). The loop (train/loop.py) resumes a killed
run from its last checkpoint. At the end it measures held-out draft top-1 agreement with the
target and the mean accepted length tau of the EAGLE-2 tree on held-out prompts,
saves the draft folder and prints a JSON report.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

from draftkit.drafters.eagle import EagleDraftModel  # noqa: E402
from draftkit.drafters.eagle_reference import deepen, make_draft  # noqa: E402
from draftkit.drafters.reference_config import frequent_tokens  # noqa: E402
from draftkit.drafters.peagle import make_peagle_draft  # noqa: E402
from draftkit.drafters.registry import tree_drafter_class  # noqa: E402
from draftkit.train import decode_eval  # noqa: E402
from draftkit.train.calibrate import fit_for_report  # noqa: E402
from draftkit.train.config import (AUTO, TrainError, auto_layers, auto_or_list, field, mask_token,  # noqa: E402
                                   parse_config, resolve_model, shared)
from draftkit.train.loop import Loop, cli  # noqa: E402
from draftkit.train.peagle_loss import PEagleLoss  # noqa: E402
from draftkit.train.targetdata import TargetDataConfig, target_data  # noqa: E402


@dataclass
class EagleTrainConfig(TargetDataConfig):
    target: str = field("default", "target model (a folder, a hub id, a GGUF file, a named real target such as "
                                   "smollm2-135m, or default: the shipped target); its tokenizer is used too")
    feature_layers: list[int] = field([], "hidden-state indices the draft reads (0 = embeddings, -1 = last): [] = "
                                          "the last only (EAGLE-1/2); three, e.g. [1, 3, -1], = EAGLE-3 "
                                          "low/mid/high fusion; auto = EAGLE-3's three from the target's config "
                                          "((2, L//2, L-3) in the reference layout, (2, L//2, -1) in draftkit's)",
                                      auto=True)
    ttt_steps: int = field(1, "training-time test: unrolled draft steps on its own features (1 = EAGLE-1/2)")
    ttt_decay: float = field(0.8, "loss weight of unrolled step i is ttt_decay ** i")
    init_from: str = field("", "continue from an existing EAGLE draft (a folder, or default: the shipped one of this "
                               "layout and feature layers), keeping its layout, features and draft vocabulary; with "
                               "parallel_depths an EAGLE-3 draft starts P-EAGLE (its weights, a fresh mask_hidden)")
    init_from_target: bool = field(False, "start the draft's decoder layers as copies of the target's last layer")
    draft_layers: int = field(1, "reference EAGLE-3 / P-EAGLE: decoder layers of the draft (the first fuses token and "
                                 "features, the others are plain Llama layers; vLLM serves any number, SGLang one); "
                                 "with init_from a shallower draft grows to this many, its outputs unchanged at first "
                                 "(1: the draft's own)")
    layout: str = field("draftkit", "draft architecture: draftkit (its own) or reference (the zoo's: what vLLM / "
                                    "SGLang compute, exportable with train/export.py)")
    draft_vocab_size: int = field(0, "reference layout: the draft vocabulary = this many most frequent target tokens "
                                     "of the training data (0: EAGLE-3 a quarter of the target's, EAGLE-1/2 all of "
                                     "it; -1: all of it)")
    feature_noise: float = field(0.2, "width of the uniform noise U(-w/2, w/2) added to the input target features")
    feature_loss_weight: float = field(1.0, "SmoothL1 loss on the predicted features (EAGLE-3: 0)")
    token_loss_weight: float = field(0.1, "cross-entropy of the draft against the target's distribution")
    acceptance_loss: float = field(0.0, "share lambda in [0, 1] of the token loss taken by -log(sum min(p, q)), the "
                                        "log of the chance that a draw of the draft q passes the target p at "
                                        "temperature 1 (LK losses, arXiv 2602.23881): (1 - lambda) CE + lambda "
                                        "(-log acceptance); 0: cross-entropy only")
    parallel_depths: int = field(0, "P-EAGLE: > 0 trains the reference EAGLE-3 draft with parallel drafting over this "
                                    "many depths in one forward (train/peagle_loss.py; needs layout reference, three "
                                    "feature_layers and ttt_steps 1); 0: EAGLE's own loss")
    mask_token_id: int = field(-1, "P-EAGLE placeholder token id (-1: the tokenizer's pad token, else its EOS)")
    cod_ratio: float = field(0.7, "P-EAGLE COD sampling: depth d keeps about cod_ratio^(d-1) of the anchors")
    cod_ratio_min: float = field(0.2, "P-EAGLE COD sampling: the least share of anchors any depth keeps")
    eval_tau_prompts: int = field(4, "held-out prompts for the final tau measurement (0: skip)")
    eval_new_tokens: int = field(64, "tokens generated per prompt for tau")
    output_dir: str = shared("output_dir", "runs/eagle2")
    lr: float = field(3e-4, "peak learning rate (EAGLE: 3e-5 for 7B targets; small drafts want more)")
    warmup_steps: int = shared("warmup_steps", 100)
    max_steps: int = shared("max_steps", 1200)
    grad_clip: float = shared("grad_clip", 0.5)

    def __post_init__(self):
        super().__post_init__()
        self.feature_layers = auto_or_list(self.feature_layers)
        three = self.feature_layers == AUTO or len(self.feature_layers) == 3
        if self.ttt_steps < 1:
            raise TrainError(f"ttt_steps must be >= 1, got {self.ttt_steps}")
        if self.layout not in ("draftkit", "reference"):
            raise TrainError(f"layout must be draftkit or reference, got {self.layout!r}")
        if self.layout == "draftkit" and self.draft_vocab_size > 0:
            raise TrainError("draft_vocab_size needs layout: reference (draftkit's layout uses the full vocabulary)")
        if self.parallel_depths and (self.layout != "reference" or not three or self.ttt_steps != 1):
            raise TrainError("parallel_depths (P-EAGLE) needs layout: reference, three feature_layers and ttt_steps: 1 "
                             f"(got {self.layout}, {self.feature_layers}, {self.ttt_steps})")
        if self.draft_layers < 1 or (self.draft_layers > 1 and (self.layout != "reference" or not three)):
            raise TrainError(f"draft_layers must be 1, or more with layout: reference and three feature_layers "
                             f"(EAGLE-3, P-EAGLE); got {self.draft_layers}")
        if self.parallel_depths < 0:
            raise TrainError(f"parallel_depths must be >= 0, got {self.parallel_depths}")
        if not 0.0 <= self.acceptance_loss <= 1.0:
            raise TrainError(f"acceptance_loss must be a share in [0, 1], got {self.acceptance_loss}")
        if self.acceptance_loss and self.parallel_depths:
            raise TrainError("acceptance_loss applies to EAGLE's own loss, not P-EAGLE's (parallel_depths > 0)")


# --- the loss ---------------------------------------------------------------------------------------

def _ttt_mask(n: int, step: int, device, dtype) -> torch.Tensor:
    """(1, 1, n, (step + 1) n) additive mask for unrolled step `step`: query t sees the true pairs <= t
    and, at every earlier unrolled step, its own chain ancestor (the entry at t)."""
    allowed = torch.cat([torch.ones(n, n, dtype=torch.bool).tril()] + [torch.eye(n, dtype=torch.bool)] * step, 1)
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None].to(device)


class EagleLoss(nn.Module):
    """The draft plus its (unregistered, frozen) reference to the target's embedding and LM head, so one
    forward covers every unrolled step (one DDP forward per optimizer step) and checkpoints hold only
    the draft."""

    def __init__(self, draft: EagleDraftModel, target, cfg):
        super().__init__()
        self.draft = draft
        self._frozen = (target.get_input_embeddings(), target.get_output_embeddings())
        self.ttt_steps, self.decay = cfg.ttt_steps, cfg.ttt_decay
        self.fw, self.tw, self.noise = cfg.feature_loss_weight, cfg.token_loss_weight, cfg.feature_noise
        self.accept_share = cfg.acceptance_loss

    def targets(self, last, mask, top, vocab_ids):
        """(p (B, n, V') over the draft vocabulary, p's top-1 (B, n), keep (B, n) float) at positions 1..T-1.
        p is computed at the trained positions only (an untrained one's p is never read), over the draft
        vocabulary only when the top-1 is known (top: stored with the features); else over the whole vocabulary
        for its argmax (the largest matmul of a step against a real model's vocabulary)."""
        head = self._frozen[1]
        b, n = last.shape[0], last.shape[1] - 1
        keep = torch.ones(b, n, device=last.device) if mask is None else mask[:, 1:].float()
        sel = keep.bool()
        h = last[:, 1:][sel].to(head.weight.dtype)  # (k, H)
        if top is not None and vocab_ids is not None:
            tgt_top = top[:, 1:]
            logits = F.linear(h, head.weight[vocab_ids], head.bias[vocab_ids] if head.bias is not None else None)
        else:
            logits = head(h)
            tgt_top = torch.zeros(b, n, dtype=torch.long, device=last.device)
            tgt_top[sel] = logits.argmax(-1)
            if vocab_ids is not None:
                logits = logits[:, vocab_ids]
        if vocab_ids is not None:  # p restricted to the draft vocabulary, where its top-1 lies in it
            keep = keep * self.draft.t2d[tgt_top].float()
        tgt_p = logits.new_zeros(b, n, logits.shape[-1], dtype=torch.float32)  # fp32 under bf16 autocast too
        tgt_p[sel] = logits.float().softmax(-1)
        return tgt_p, tgt_top, keep

    def forward(self, ids, feats, last, mask=None, noise: bool = True, top=None) -> dict:
        """ids (B, T); feats (B, T, F) the draft's input features; last (B, T, H) the target's final hidden state;
        mask (B, T) bool: position s's distribution is trained on (None: all); top (B, T) long: p's top-1 at every
        position, when stored (None: computed here)."""
        embed, head = self._frozen
        b, t = ids.shape
        n = t - 1
        vocab_ids = self.draft.vocab_ids() if hasattr(self.draft, "vocab_ids") else None  # reduced draft vocabulary
        with torch.no_grad():
            emb = embed(ids).float()
            tgt_p, tgt_top, keep = self.targets(last, mask, top, vocab_ids)
        x = feats[:, :-1]
        if noise and self.noise > 0:
            x = x + (torch.rand_like(x) - 0.5) * self.noise
        cache = DynamicCache(config=self.draft.cache_config) if self.ttt_steps > 1 else None
        total, out = 0.0, {}
        for i in range(self.ttt_steps):
            valid = n - i  # pairs whose step-i target exists
            if valid < 1:
                break
            tok = emb[:, 1 + i:]
            if i:
                tok = torch.cat([tok, emb[:, :i].new_zeros(b, i, emb.shape[-1])], 1)  # padding, never scored
            kwargs = {}
            if i:
                kwargs = dict(attention_mask=_ttt_mask(n, i, ids.device, x.dtype),
                              position_ids=(torch.arange(n, device=ids.device) + i)[None])
            pred = self.draft(x, tok, cache=cache, **kwargs)  # (B, n, H): predicts f_{t+1+i}
            hit = pred[:, :valid]
            w_i = keep[:, i:]  # (B, valid): positions 1 + i .. T - 1
            on = w_i > 0  # the trained positions: the LM head (the step's largest matmul) runs on these only
            h_on = hit[on]  # (k, H)
            if hasattr(self.draft, "draft_logits"):  # reference layouts: over the draft vocabulary
                logp = self.draft.draft_logits(h_on, head).float().log_softmax(-1)  # (k, V')
            else:
                logp = head(h_on.to(head.weight.dtype)).float().log_softmax(-1)
            p_on = tgt_p[:, i:][on]  # (k, V')
            per_row = -(p_on * logp).sum(-1)  # (k,) cross-entropy
            with torch.set_grad_enabled(bool(self.accept_share) and torch.is_grad_enabled()):
                overlap = torch.minimum(p_on, logp.exp()).sum(-1)  # (k,) the chance a draw of q passes p at T = 1
            if self.accept_share:
                per_row = (1 - self.accept_share) * per_row - self.accept_share * overlap.clamp_min(1e-6).log()
            ce = (per_row * w_i[on]).sum() / w_i.sum().clamp_min(1.0)
            feat = F.smooth_l1_loss(hit.float(), last[:, 1 + i:].float(), reduction="none").mean(-1)
            feat = (feat * w_i).sum() / w_i.sum().clamp_min(1.0)
            w = self.decay ** i
            total = total + w * (self.tw * ce + (self.fw * feat if self.fw else 0.0))
            with torch.no_grad():
                top = logp.argmax(-1) if vocab_ids is None else vocab_ids[logp.argmax(-1)]
                out[f"acc_{i}"] = ((top == tgt_top[:, i:][on]).float() * w_i[on]).sum() / w_i.sum().clamp_min(1.0)
                out[f"overlap_{i}"] = (overlap.detach() * w_i[on]).sum() / w_i.sum().clamp_min(1.0)
            out[f"token_loss_{i}"], out[f"feature_loss_{i}"] = ce.detach(), feat.detach()
            x = pred  # the next unrolled step reads the draft's own features
        out["loss"] = total
        return out


def initial_draft(cfg, target):
    """(draft, folder): the draft of cfg.init_from (default: the shipped EAGLE-2 or EAGLE-3), checked against this
    run's settings, and the folder it came from."""
    from draftkit.drafters.formats import load_eagle_draft

    kind = "eagle3" if len(cfg.feature_layers) > 1 else "eagle"
    folder = resolve_model(cfg.init_from, kind, "--init_from", target)
    try:
        draft = load_eagle_draft(folder, target).float().train()
    except (OSError, ValueError) as err:
        raise TrainError(f"--init_from {cfg.init_from}: {err}") from None
    cfg.layout = draft.config.layout  # it keeps its layout: what is printed, reported and saved says so
    want = EagleDraftModel.from_target(target, cfg.feature_layers).config.feature_layers if cfg.layout == "draftkit" \
        else make_draft(target, cfg.feature_layers, cfg.layout).config.feature_layers
    if list(draft.config.feature_layers) != list(want):
        raise TrainError(f"--init_from {cfg.init_from} reads hidden states {draft.config.feature_layers}, this run's "
                         f"feature_layers are {want}")
    if cfg.draft_layers == 1:  # the draft keeps the layers it has
        return draft, folder
    try:
        return deepen(draft, cfg.draft_layers).train(), folder
    except ValueError as err:
        raise TrainError(f"--init_from {cfg.init_from}: {err}") from None


def draft_inputs(batch, layers: list[int], num_layers: int) -> torch.Tensor:
    """(B, T, F) the draft's input features: the target's hidden states at `layers`, concatenated."""
    picked = [batch.hidden[i + num_layers + 1 if i < 0 else i] for i in layers]
    return picked[0] if len(picked) == 1 else torch.cat(picked, -1)


def objective_on(loss_fn, batch, num_layers: int, noise: bool = True) -> dict:
    """The loss terms of one batch: EAGLE's (its input features concatenated) or P-EAGLE's (the layer dict)."""
    inner = getattr(loss_fn, "module", loss_fn)  # under DDP the prepared module wraps the objective
    if isinstance(inner, PEagleLoss):
        return loss_fn(batch.ids, batch.loss_mask, batch.hidden, batch.last)
    layers = inner.draft.config.feature_layers
    return loss_fn(batch.ids, draft_inputs(batch, layers, num_layers), batch.last, batch.loss_mask, noise=noise,
                   top=batch.top)


@torch.no_grad()
def heldout_accuracy(loss_fn: EagleLoss, data, blocks: int) -> dict:
    """Draft top-1 agreement with the target (per unrolled step) over held-out rows."""
    was = loss_fn.training
    loss_fn.eval()
    sums: dict[str, float] = {}
    count = 0
    for b in data.heldout(blocks):
        res = objective_on(loss_fn, b, data.target.config.num_hidden_layers, noise=False)
        for k, v in res.items():
            sums[k] = sums.get(k, 0.0) + float(v) * b.ids.shape[0]
        count += b.ids.shape[0]
    loss_fn.train(was)
    return {k: v / max(1, count) for k, v in sums.items()}


def measure_tau(target, draft, stream: torch.Tensor, prompts: int, new_tokens: int, prompt_len: int = 128) -> dict:
    """Mean accepted length of the EAGLE-2 tree (P-EAGLE: its tree; default flags) on held-out prompts, greedy; in
    the target's dtype (the draft being trained is not cast in place)."""
    drafter = tree_drafter_class(draft)(target, draft.eval(), draft_dtype="target")
    return decode_eval.measure_tau(target, drafter, stream, prompts, new_tokens, prompt_len)


# --- main -------------------------------------------------------------------------------------------

def main(argv=None):
    cfg = parse_config(EagleTrainConfig, argv, description=__doc__)
    target_path = resolve_model(cfg.target, "target")
    with Loop(cfg, "draftkit-eagle") as loop:
        acc = loop.acc
        tokenizer = AutoTokenizer.from_pretrained(target_path)
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).to(acc.device).eval()
        target.requires_grad_(False)
        vocab = target.get_output_embeddings().weight.shape[0]
        if vocab < len(tokenizer):
            raise TrainError(f"tokenizer of {cfg.target} has {len(tokenizer)} tokens "
                             f"but the model only {vocab} outputs")
        if cfg.feature_layers == AUTO:  # the recipe fits any target: its layers come from this one's config
            cfg.feature_layers = auto_layers(target, final=cfg.layout != "reference")
        feature_layers = list(cfg.feature_layers) or [-1]
        data = target_data(cfg, target, tokenizer, acc, feature_layers, seed=cfg.seed)
        loop.tokens_per_row = data.tokens_per_epoch / data.rows.shape[0]
        heldout_text = data.heldout_stream if data.heldout_stream is not None else data.heldout_rows[0].flatten()
        draft_ids = None
        if cfg.layout == "reference":
            n = cfg.draft_vocab_size
            if n == 0:
                n = max(1, vocab // 4) if len(cfg.feature_layers) > 1 else vocab
            if 0 < n < vocab:  # the most frequent tokens of what the draft trains on
                # counted over the tokens the draft must predict (the target's answers), not prompts or padding
                draft_ids = frequent_tokens(data.rows[:, 1:][data.mask[:, :-1]], vocab, n)
        torch.manual_seed(cfg.seed)  # after the data: the draft's initial weights do not depend on how it was built
        if cfg.init_from:
            draft, start = initial_draft(cfg, target)
            loop.continue_from(start)
            if cfg.parallel_depths and not hasattr(draft, "mask_hidden"):  # P-EAGLE warm-started from EAGLE-3
                from draftkit.drafters.peagle import peagle_from_eagle3
                draft = peagle_from_eagle3(draft, mask_token(tokenizer, cfg.mask_token_id))
        elif cfg.parallel_depths:
            mask = mask_token(tokenizer, cfg.mask_token_id)
            draft = make_peagle_draft(target, cfg.feature_layers, mask, draft_ids, cfg.init_from_target,
                                      cfg.draft_layers)
        else:
            draft = make_draft(target, cfg.feature_layers, cfg.layout, draft_ids, cfg.init_from_target,
                               cfg.draft_layers)
        draft.config.target_name = target_path
        n_params = sum(p.numel() for p in draft.parameters())
        acc.print(f"EAGLE draft ({cfg.layout} layout, {draft.cache_config.num_hidden_layers} decoder layers): "
                  f"{n_params:,} parameters, features from hidden states "
                  f"{draft.config.feature_layers}, draft vocabulary {draft.config.draft_vocab_size or 'full'}, "
                  f"ttt_steps {cfg.ttt_steps}")
        num_layers = target.config.num_hidden_layers
        objective = PEagleLoss(draft, target, cfg.parallel_depths, cfg.cod_ratio, cfg.cod_ratio_min) \
            if cfg.parallel_depths else EagleLoss(draft, target, cfg)
        (loss_fn,) = loop.prepare(objective)

        def step_loss(i):
            res = objective_on(loss_fn, data.batch(i), num_layers)
            return res.pop("loss"), res

        def evaluate():
            model = loop.unwrap(loss_fn)
            res = heldout_accuracy(model, data, cfg.eval_blocks)
            res.update(measure_tau(target, model.draft, heldout_text, cfg.eval_tau_prompts, cfg.eval_new_tokens))
            model.draft.float().train()
            return res

        result = loop.run(step_loss, evaluate, desc="eagle", show=("acc_1" if cfg.parallel_depths else "acc_0",))
        history = result.history
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": history}
        final, model = result.final, loop.unwrap(loss_fn)
        report = {}
        if acc.is_main_process:
            out = loop.final_dir
            if cfg.layout == "reference":  # decoding attends over the relative distances it trained on
                model.draft.config.attention_window = cfg.seq_len
            tree = fit_for_report(target, model.draft, heldout_text, cfg.eval_tau_prompts * 3, cfg.eval_new_tokens)
            model.draft.save_pretrained(out)
            decode = {k: final[k] for k in ("tau", "acceptance_by_depth", "mean_tree_size", "own_text_top1")
                      if k in final}
            report = {
                "heldout_top1": final.get("acc_1" if cfg.parallel_depths else "acc_0"),
                "heldout_top1_by_depth": [final[f"acc_{d}"] for d in range(1, cfg.parallel_depths + 1)
                                          if f"acc_{d}" in final] or None,
                "heldout_top1_by_step": [final[f"acc_{i}"] for i in range(cfg.ttt_steps) if f"acc_{i}" in final],
                # sum_x min(p, q) at the first draft step: the chance a draw passes at temperature 1
                "heldout_overlap": final.get("overlap_0"), "acceptance_loss": cfg.acceptance_loss,
                "heldout_token_loss": final.get("token_loss_0"), "heldout_feature_loss": final.get("feature_loss_0"),
                **decode, **tree, "attention_window": model.draft.config.attention_window,
                "params": n_params, "steps": cfg.max_steps, "resumed_from": result.start_step,
                "first_train": history[0] if history else None, "last_train": history[-1] if history else None,
                "feature_layers": model.draft.config.feature_layers, "ttt_steps": cfg.ttt_steps,
                "layout": cfg.layout, "draft_vocab_size": model.draft.config.draft_vocab_size or None,
                "target": target_path, "corpus": data.corpus.source, "corpus_fingerprint": data.corpus.fingerprint,
                "regenerated": cfg.regenerate, "data_mode": cfg.data_mode,
                "trained_tokens_per_epoch": data.tokens_per_epoch,
                **loop.token_counts(cfg.max_steps), "scaling": loop.heldout_history(), "output": out,
            }
            loop.write_report(report)
    return {**report, "history": history}


if __name__ == "__main__":
    cli(main)
