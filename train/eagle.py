"""Train an EAGLE draft (EAGLE-1/2, or EAGLE-3 features + training-time test) for a frozen target.

    accelerate launch --config_file recipes/accelerate/single.yaml train/eagle.py --config recipes/eagle/eagle2.yaml
    python train/eagle.py --config recipes/eagle/eagle2.yaml          # one CPU
    python train/eagle.py --config recipes/eagle/eagle3.yaml
    python train/eagle.py --config recipes/eagle/peagle.yaml         # P-EAGLE (parallel_depths > 0)

Each step runs the frozen target under no_grad over a batch of token blocks
(or loads its features from the on-disk cache, cache_features) and trains the
draft on pairs (f_t, x_{t+1}) -> f_{t+1}:
  loss = sum_i ttt_decay^i * (feature_loss_weight * SmoothL1(f^, f) +
                               token_loss_weight * CE(p_target, q_draft))
where step i > 0 of the training-time test feeds the draft its own predicted
features (as at decoding time, along a chain) and step 0 the true, noised ones.
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

import hashlib
import json
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache  # noqa: E402

from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter  # noqa: E402
from draftkit.drafters.eagle_reference import frequent_tokens, make_draft  # noqa: E402
from draftkit.drafters.peagle import PEagleDraft, PEagleDrafter, make_peagle_draft  # noqa: E402
from draftkit.train import decode_eval  # noqa: E402
from draftkit.train.config import TrainConfig, TrainError, field, parse_config, resolve_model, shared  # noqa: E402
from draftkit.train.data import BlockSampler, heldout_batches, load_streams  # noqa: E402
from draftkit.train.loop import Loop, cli  # noqa: E402
from draftkit.train.peagle_loss import PEagleLoss  # noqa: E402


@dataclass
class EagleTrainConfig(TrainConfig):
    target: str = field("default", "target model (a folder, a hub id, or default: the shipped target); its "
                                   "tokenizer is used too")
    feature_layers: list[int] = field([], "hidden-state indices the draft reads (0 = embeddings, -1 = last): [] = "
                                          "the last only (EAGLE-1/2); three, e.g. [1, 3, -1], = EAGLE-3 "
                                          "low/mid/high fusion")
    ttt_steps: int = field(1, "training-time test: unrolled draft steps on its own features (1 = EAGLE-1/2)")
    ttt_decay: float = field(0.8, "loss weight of unrolled step i is ttt_decay ** i")
    init_from_target: bool = field(False, "start the draft's decoder layer as a copy of the target's last layer")
    layout: str = field("draftkit", "draft architecture: draftkit (its own) or reference (the zoo's: what vLLM / "
                                    "SGLang compute, exportable with train/export.py)")
    draft_vocab_size: int = field(0, "reference layout: the draft vocabulary = this many most frequent target tokens "
                                     "of the training data (0: EAGLE-3 a quarter of the target's, EAGLE-1/2 all of "
                                     "it; -1: all of it)")
    feature_noise: float = field(0.2, "width of the uniform noise U(-w/2, w/2) added to the input target features")
    feature_loss_weight: float = field(1.0, "SmoothL1 loss on the predicted features (EAGLE-3: 0)")
    token_loss_weight: float = field(0.1, "cross-entropy of the draft against the target's distribution")
    cache_features: bool = field(False, "store the target's features per batch on disk and reuse them "
                                        "(default: computed on the fly under no_grad)")
    feature_cache_batches: int = field(0, "distinct batches in the feature cache, cycled like epochs "
                                          "(0: every micro-batch of the run)")
    regenerate: bool = field(False, "train on text the target itself generated from corpus prompts (self-distillation)")
    regen_blocks: int = field(256, "blocks of regenerated text (prompt + continuation, seq_len tokens each)")
    regen_prompt_len: int = field(64, "corpus tokens that start each regenerated block")
    regen_temperature: float = field(1.0, "sampling temperature of the regeneration (0: greedy)")
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
        if self.ttt_steps < 1:
            raise TrainError(f"ttt_steps must be >= 1, got {self.ttt_steps}")
        if self.layout not in ("draftkit", "reference"):
            raise TrainError(f"layout must be draftkit or reference, got {self.layout!r}")
        if self.layout == "draftkit" and self.draft_vocab_size > 0:
            raise TrainError("draft_vocab_size needs layout: reference (draftkit's layout uses the full vocabulary)")
        if self.parallel_depths and (self.layout != "reference" or len(self.feature_layers) != 3
                                     or self.ttt_steps != 1):
            raise TrainError("parallel_depths (P-EAGLE) needs layout: reference, three feature_layers and ttt_steps: 1 "
                             f"(got {self.layout}, {self.feature_layers}, {self.ttt_steps})")
        if self.parallel_depths < 0:
            raise TrainError(f"parallel_depths must be >= 0, got {self.parallel_depths}")


# --- data -------------------------------------------------------------------------------------------

def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def target_fingerprint(target) -> str:
    """A hash of the target's weights and config (keys the regeneration and feature caches)."""
    h = hashlib.sha256(json.dumps(target.config.to_dict(), sort_keys=True, default=str).encode())
    for name, p in sorted(target.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


class RowSampler:
    """Batches of rows of a (N, T) pool, resumable by step (as BlockSampler)."""

    def __init__(self, pool: torch.Tensor, batch_size: int, seed: int = 0):
        self.pool, self.batch_size, self.seed = pool, batch_size, seed

    def batch(self, step: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return self.pool[torch.randint(0, self.pool.shape[0], (self.batch_size,), generator=gen)].long()


@torch.no_grad()
def regenerate_pool(cfg, target, stream: torch.Tensor, eos_id: int, key: str, acc) -> torch.Tensor:
    """(regen_blocks, seq_len): corpus prompts continued by the target (cached on disk)."""
    path = os.path.join(cfg.cache_dir, f"eagle-regen-{key}.pt")
    if os.path.exists(path):
        return torch.load(path)
    prompts = BlockSampler(stream, cfg.regen_prompt_len, cfg.regen_blocks, cfg.seed + 7919).batch(0)
    new = cfg.seq_len - cfg.regen_prompt_len
    if new < 1:
        raise ValueError(f"regen_prompt_len ({cfg.regen_prompt_len}) must be shorter than seq_len ({cfg.seq_len})")
    sample = dict(do_sample=True, temperature=cfg.regen_temperature, top_k=0, top_p=1.0) \
        if cfg.regen_temperature > 0 else dict(do_sample=False)
    rows = []
    for i in tqdm(range(0, prompts.shape[0], 16), desc="regenerate", disable=not acc.is_local_main_process):
        ids = prompts[i:i + 16].to(target.device)
        out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                              min_new_tokens=new, pad_token_id=eos_id, **sample)
        rows.append(out[:, :cfg.seq_len].cpu())
    pool = torch.cat(rows).to(torch.int32)
    os.makedirs(cfg.cache_dir, exist_ok=True)
    torch.save(pool, path + ".tmp")
    os.replace(path + ".tmp", path)
    return pool


class FeatureSource:
    """Per-step (ids, draft input features, last hidden state) of the frozen target: computed under
    no_grad, or with cache_features loaded from / stored to disk (fp16), batches cycled."""

    def __init__(self, cfg, target, draft_config, sampler, key: str | None):
        self.target, self.layers, self.sampler = target, draft_config.feature_layers, sampler
        self.cycle = cfg.feature_cache_batches or cfg.max_steps * cfg.gradient_accumulation_steps
        self.dir = os.path.join(cfg.cache_dir, f"eagle-feats-{key}") if key else None
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)

    @torch.no_grad()
    def compute(self, ids: torch.Tensor):
        out = self.target(input_ids=ids.to(self.target.device), output_hidden_states=True)
        hs = out.hidden_states
        feats = hs[self.layers[0]] if len(self.layers) == 1 else torch.cat([hs[i] for i in self.layers], -1)
        return ids, feats.float(), hs[-1].float()

    def get(self, step: int):
        if not self.dir:
            return self.compute(self.sampler.batch(step))
        index = step % self.cycle
        path = os.path.join(self.dir, f"{index}.pt")
        if os.path.exists(path):
            d = torch.load(path)
            return d["ids"].long(), d["feats"].float(), d["last"].float()
        ids, feats, last = self.compute(self.sampler.batch(index))
        torch.save({"ids": ids.to(torch.int32).cpu(), "feats": feats.half().cpu(), "last": last.half().cpu()},
                   path + ".tmp")
        os.replace(path + ".tmp", path)
        return ids, feats, last


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

    def forward(self, ids, feats, last, noise: bool = True) -> dict:
        embed, head = self._frozen
        b, t = ids.shape
        n = t - 1
        vocab_ids = self.draft.vocab_ids() if hasattr(self.draft, "vocab_ids") else None  # reduced draft vocabulary
        with torch.no_grad():
            emb = embed(ids).float()
            tgt_logits = head(last[:, 1:].to(head.weight.dtype)).float()  # p at positions 1..T-1
            tgt_top = tgt_logits.argmax(-1)
            if vocab_ids is not None:  # p restricted to the draft vocabulary, where its top-1 lies in it
                keep = self.draft.t2d[tgt_top].float()
                tgt_logits = tgt_logits[..., vocab_ids]
            tgt_p = tgt_logits.softmax(-1)
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
            if hasattr(self.draft, "draft_logits"):  # reference layouts: over the draft vocabulary
                logp = self.draft.draft_logits(hit, head).float().log_softmax(-1)
            else:
                logp = head(hit.to(head.weight.dtype)).float().log_softmax(-1)
            ce = -(tgt_p[:, i:] * logp).sum(-1)
            ce = ce.mean() if vocab_ids is None else (ce * keep[:, i:]).sum() / keep[:, i:].sum().clamp_min(1.0)
            feat = F.smooth_l1_loss(hit.float(), last[:, 1 + i:].float())
            w = self.decay ** i
            total = total + w * (self.tw * ce + (self.fw * feat if self.fw else 0.0))
            with torch.no_grad():
                top = logp.argmax(-1) if vocab_ids is None else vocab_ids[logp.argmax(-1)]
                out[f"acc_{i}"] = (top == tgt_top[:, i:]).float().mean()
            out[f"token_loss_{i}"], out[f"feature_loss_{i}"] = ce.detach(), feat.detach()
            x = pred  # the next unrolled step reads the draft's own features
        out["loss"] = total
        return out


class FeaturePEagleLoss(PEagleLoss):
    """PEagleLoss fed like EagleLoss (ids, the feature layers concatenated, last), every position trained."""

    def forward(self, ids, feats, last, noise: bool = True) -> dict:
        h = self.draft.config.hidden_size
        hidden = {k: feats[..., j * h:(j + 1) * h] for j, k in enumerate(self.draft.config.feature_layers)}
        return super().forward(ids, torch.ones_like(ids, dtype=torch.bool), hidden, last)


@torch.no_grad()
def heldout_accuracy(loss_fn: EagleLoss, source: FeatureSource, stream: torch.Tensor, seq_len: int,
                     blocks: int) -> dict:
    """Draft top-1 agreement with the target (per unrolled step) over consecutive held-out blocks."""
    was = loss_fn.training
    loss_fn.eval()
    sums: dict[str, float] = {}
    count = 0
    for rows in heldout_batches(stream, seq_len, blocks, source.target.device):
        res = loss_fn(*source.compute(rows), noise=False)
        for k, v in res.items():
            sums[k] = sums.get(k, 0.0) + float(v) * rows.shape[0]
        count += rows.shape[0]
    loss_fn.train(was)
    return {k: v / max(1, count) for k, v in sums.items()}


def measure_tau(target, draft, stream: torch.Tensor, prompts: int, new_tokens: int, prompt_len: int = 128) -> dict:
    """Mean accepted length of the EAGLE-2 tree (P-EAGLE: its tree; default flags) on held-out prompts, greedy."""
    drafter = (PEagleDrafter if isinstance(draft, PEagleDraft) else EagleDrafter)(target, draft.eval())
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
            raise TrainError(f"tokenizer of {cfg.target} has {len(tokenizer)} tokens but the model only {vocab} outputs")
        corpus, train_stream, heldout_stream = load_streams(cfg, tokenizer, acc)

        torch.manual_seed(cfg.seed)
        draft_ids = None
        if cfg.layout == "reference":
            n = cfg.draft_vocab_size
            if n == 0:
                n = max(1, vocab // 4) if len(cfg.feature_layers) > 1 else vocab
            if 0 < n < vocab:
                draft_ids = frequent_tokens(train_stream, vocab, n)
        if cfg.parallel_depths:
            mask = cfg.mask_token_id if cfg.mask_token_id >= 0 else (
                tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
            draft = make_peagle_draft(target, cfg.feature_layers, mask, draft_ids, cfg.init_from_target)
        else:
            draft = make_draft(target, cfg.feature_layers, cfg.layout, draft_ids, cfg.init_from_target)
        draft.config.target_name = target_path
        n_params = sum(p.numel() for p in draft.parameters())
        acc.print(f"EAGLE draft ({cfg.layout} layout): {n_params:,} parameters, features from hidden states "
                  f"{draft.config.feature_layers}, draft vocabulary {draft.config.draft_vocab_size or 'full'}, "
                  f"ttt_steps {cfg.ttt_steps}")

        seed = loop.data_seed
        tfp = target_fingerprint(target) if cfg.regenerate or cfg.cache_features else ""
        if cfg.regenerate:
            rkey = _digest(tfp, corpus.fingerprint, cfg.seq_len, cfg.regen_blocks, cfg.regen_prompt_len,
                           cfg.regen_temperature, cfg.seed)
            with acc.main_process_first():
                pool = regenerate_pool(cfg, target, train_stream, tokenizer.eos_token_id, rkey, acc)
            sampler, data_key = RowSampler(pool, cfg.batch_size, seed), rkey
        else:
            sampler, data_key = BlockSampler(train_stream, cfg.seq_len, cfg.batch_size, seed), corpus.fingerprint
        cycle = cfg.feature_cache_batches or cfg.max_steps * cfg.gradient_accumulation_steps
        fkey = _digest(tfp, data_key, cfg.seq_len, cfg.batch_size, seed, draft.config.feature_layers,
                       cycle) if cfg.cache_features else None
        source = FeatureSource(cfg, target, draft.config, sampler, fkey)

        objective = FeaturePEagleLoss(draft, target, cfg.parallel_depths, cfg.cod_ratio, cfg.cod_ratio_min) \
            if cfg.parallel_depths else EagleLoss(draft, target, cfg)
        (loss_fn,) = loop.prepare(objective)

        def step_loss(i):
            ids, feats, last = source.get(i)
            res = loss_fn(ids.to(acc.device), feats.to(acc.device), last.to(acc.device))
            return res.pop("loss"), res

        def evaluate():
            return heldout_accuracy(loop.unwrap(loss_fn), source, heldout_stream, cfg.seq_len, cfg.eval_blocks)

        result = loop.run(step_loss, evaluate, desc="eagle", show=("acc_1" if cfg.parallel_depths else "acc_0",))
        history = result.history
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": history}
        final, model = result.final, loop.unwrap(loss_fn)
        report = {}
        if acc.is_main_process:
            out = loop.final_dir
            model.draft.save_pretrained(out)
            decode = measure_tau(target, model.draft, heldout_stream, cfg.eval_tau_prompts, cfg.eval_new_tokens)
            model.draft.float().train()
            if decode:
                loop.log({"heldout/tau": decode["tau"]}, step=cfg.max_steps)
            report = {
                "heldout_top1": final.get("acc_1" if cfg.parallel_depths else "acc_0"),
                "heldout_top1_by_depth": [final[f"acc_{d}"] for d in range(1, cfg.parallel_depths + 1)
                                          if f"acc_{d}" in final] or None,
                "heldout_top1_by_step": [final[f"acc_{i}"] for i in range(cfg.ttt_steps) if f"acc_{i}" in final],
                "heldout_token_loss": final.get("token_loss_0"), "heldout_feature_loss": final.get("feature_loss_0"),
                **decode,
                "params": n_params, "steps": cfg.max_steps, "resumed_from": result.start_step,
                "first_train": history[0] if history else None, "last_train": history[-1] if history else None,
                "feature_layers": model.draft.config.feature_layers, "ttt_steps": cfg.ttt_steps,
                "layout": cfg.layout, "draft_vocab_size": model.draft.config.draft_vocab_size or None,
                "target": target_path, "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint,
                "regenerated": cfg.regenerate, "output": out,
            }
            loop.write_report(report)
    return {**report, "history": history}


if __name__ == "__main__":
    cli(main)
