"""Distil the standalone draft model from the target.

    accelerate launch train/draft.py --config recipes/draft/distill.yaml
    python train/draft.py --config recipes/draft/distill.yaml           # one CPU

Loss: KL(p_target || q_draft) over the whole vocabulary at every position (the
draft learns the target's distributions, not just the corpus's next token), plus
an optional cross-entropy term. `init_from` starts from an existing small causal
LM instead of random weights; with `lora_r` > 0 only LoRA adapters (peft) train.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from train.common import Checkpoints, DataConfig, cosine_lr, field, finish, make_accelerator, parse_config, save_hf  # noqa: E402
from train.data import BlockSampler, build_corpus, token_streams  # noqa: E402
from train.pretrain import heldout_loss  # noqa: E402


@dataclass
class DraftConfig(DataConfig):
    target: str = field("runs/target/final", "target model (path or hub id) to distil from")
    init_from: str = field("", "start from this causal LM (path or hub id) instead of random weights")
    lora_r: int = field(0, "with init_from: train LoRA adapters of this rank only (0: full fine-tune)")
    lora_alpha: int = field(16, "LoRA alpha")
    hidden_size: int = field(128, "draft width (random init)")
    num_layers: int = field(2, "draft decoder layers (random init)")
    num_heads: int = field(4, "draft attention heads (random init)")
    intermediate_size: int = field(384, "draft MLP width (random init)")
    lr: float = field(3e-3, "peak learning rate")
    warmup_steps: int = field(50, "linear warmup steps")
    max_steps: int = field(1200, "optimizer steps")
    ce_weight: float = field(0.0, "weight of the plain next-token cross-entropy beside the KL")
    grad_clip: float = field(1.0, "gradient norm clip")
    eval_every: int = field(200, "held-out metrics every N steps")
    eval_blocks: int = field(32, "held-out blocks per evaluation")
    checkpoint_every: int = field(100, "checkpoint every N steps")
    output_dir: str = field("runs/draft", "checkpoints, W&B run and logs")
    export_dir: str = field("", "where the final fp16 draft is saved (empty: output_dir/final)")
    seed: int = field(1, "seed")


def build_draft(cfg, target) -> torch.nn.Module:
    if cfg.init_from:
        draft = AutoModelForCausalLM.from_pretrained(cfg.init_from, dtype=torch.float32)
        if cfg.lora_r:
            from peft import LoraConfig, get_peft_model

            draft = get_peft_model(draft, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules="all-linear"))
        return draft
    t = target.config
    config = LlamaConfig(vocab_size=t.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
                         intermediate_size=cfg.intermediate_size, max_position_embeddings=t.max_position_embeddings,
                         tie_word_embeddings=True, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id,
                         pad_token_id=t.pad_token_id)
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config)


def distill_loss(draft_logits, target_logits, labels, ce_weight):
    """Mean over positions of KL(p || q) (+ ce_weight * CE). Shapes (B, T, V), labels (B, T)."""
    logq = draft_logits.float().log_softmax(-1)
    logp = target_logits.float().log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean()
    if not ce_weight:
        return kl, kl
    ce = F.cross_entropy(draft_logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
    return kl + ce_weight * ce, kl


@torch.no_grad()
def top1_agreement(draft, target, stream, seq_len, blocks) -> float:
    """Share of held-out positions where the draft's argmax equals the target's."""
    n = min(blocks, (stream.numel() - 1) // seq_len)
    hits = total = 0
    for i in range(0, n, 8):
        batch = torch.stack([stream[j * seq_len:(j + 1) * seq_len] for j in range(i, min(n, i + 8))]).long()
        batch = batch.to(next(draft.parameters()).device)
        same = draft(input_ids=batch).logits.argmax(-1) == target(input_ids=batch).logits.argmax(-1)
        hits += int(same.sum())
        total += same.numel()
    return hits / total


def main(argv=None):
    cfg = parse_config(DraftConfig, argv, description=__doc__)
    acc = make_accelerator(cfg, "draftkit-draft")
    tokenizer = AutoTokenizer.from_pretrained(cfg.target)
    target = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=torch.float32).eval().requires_grad_(False)
    corpus = build_corpus(cfg.corpus, cfg.text_column)
    train_stream, heldout_stream = token_streams(cfg, corpus, tokenizer)
    draft = build_draft(cfg, target)
    n_params = sum(p.numel() for p in draft.parameters())
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, cfg.max_steps, cfg.warmup_steps))
    draft, opt, sched = acc.prepare(draft, opt, sched)
    target = target.to(acc.device)
    start = Checkpoints(cfg.output_dir).resume(acc)
    ckpts = Checkpoints(cfg.output_dir)
    sampler = BlockSampler(train_stream, cfg.seq_len, cfg.batch_size, cfg.seed + acc.process_index)

    bar = tqdm(range(start, cfg.max_steps), initial=start, total=cfg.max_steps, desc="distil draft",
               disable=not acc.is_local_main_process)
    for step in bar:
        batch = sampler.batch(step).to(acc.device)
        with torch.no_grad():
            t_logits = target(input_ids=batch).logits
        loss, kl = distill_loss(draft(input_ids=batch).logits, t_logits, batch, cfg.ce_weight)
        acc.backward(loss)
        acc.clip_grad_norm_(params, cfg.grad_clip)
        opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
        metrics = {"train/loss": loss.item(), "train/kl": kl.item(), "train/lr": sched.get_last_lr()[0]}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps:
            model = acc.unwrap_model(draft)
            metrics["heldout/loss"] = heldout_loss(model, heldout_stream, cfg.seq_len, cfg.eval_blocks)
            metrics["heldout/top1_agreement"] = top1_agreement(model, target, heldout_stream, cfg.seq_len, cfg.eval_blocks)
        acc.log(metrics, step=step + 1)
        bar.set_postfix(kl=f"{kl.item():.3f}")
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.max_steps:
            ckpts.save(acc, step + 1)

    model = acc.unwrap_model(draft)
    if cfg.lora_r and cfg.init_from:
        model = model.merge_and_unload()
    report = {"heldout_loss": heldout_loss(model, heldout_stream, cfg.seq_len, cfg.eval_blocks),
              "top1_agreement": top1_agreement(model, target, heldout_stream, cfg.seq_len, cfg.eval_blocks),
              "params": n_params, "steps": cfg.max_steps, "corpus": corpus.source,
              "corpus_fingerprint": corpus.fingerprint}
    if acc.is_main_process:
        out = cfg.export_dir or os.path.join(cfg.output_dir, "final")
        save_hf(model, tokenizer, out)
        with open(os.path.join(out, "train_report.json"), "w") as fh:
            json.dump(report, fh, indent=2)
        acc.print(json.dumps(report))
    finish(acc)
    return report


if __name__ == "__main__":
    main()
