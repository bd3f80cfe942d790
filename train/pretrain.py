"""Pretrain the default target: a small Llama-architecture causal LM.

    accelerate launch train/pretrain.py --config recipes/zoo/target.yaml
    python train/pretrain.py --config recipes/zoo/target.yaml      # one CPU

Trains the tokenizer first if `tokenizer_dir` holds none. Killed and started
again with the same command, it resumes from its last checkpoint.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from train.common import Checkpoints, DataConfig, cosine_lr, field, finish, make_accelerator, parse_config, save_hf  # noqa: E402
from train.data import BlockSampler, build_corpus, token_streams, train_tokenizer  # noqa: E402


@dataclass
class PretrainConfig(DataConfig):
    tokenizer_dir: str = field("zoo/tokenizer", "tokenizer to use; trained on the train split here if absent")
    vocab_size: int = field(8192, "BPE vocabulary size when a tokenizer is trained")
    hidden_size: int = field(384, "model width")
    num_layers: int = field(6, "decoder layers")
    num_heads: int = field(6, "attention heads")
    intermediate_size: int = field(1024, "MLP width")
    max_position: int = field(1024, "longest context the model supports")
    lr: float = field(1e-3, "peak learning rate (AdamW)")
    weight_decay: float = field(0.1, "AdamW weight decay")
    warmup_steps: int = field(200, "linear warmup steps")
    max_steps: int = field(4000, "optimizer steps in total")
    grad_clip: float = field(1.0, "gradient norm clip")
    eval_every: int = field(250, "held-out loss every N steps")
    eval_blocks: int = field(64, "held-out blocks per evaluation")
    checkpoint_every: int = field(200, "checkpoint every N steps (the most work an interruption loses)")
    output_dir: str = field("runs/target", "checkpoints, W&B run and logs")
    export_dir: str = field("", "where the final fp16 model is saved (empty: output_dir/final)")
    seed: int = field(0, "seed for init and data order")
    stop_at_step: int = field(0, "stop after this step as if interrupted (0: run to max_steps); for resume tests")


def load_or_train_tokenizer(cfg, corpus):
    if os.path.exists(os.path.join(cfg.tokenizer_dir, "tokenizer.json")):
        return AutoTokenizer.from_pretrained(cfg.tokenizer_dir)
    print(f"training a {cfg.vocab_size}-token byte-level BPE on {len(corpus.train)} files -> {cfg.tokenizer_dir}")
    return train_tokenizer(corpus.train["text"], cfg.vocab_size, cfg.tokenizer_dir)


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq_len: int, blocks: int) -> float:
    """Mean next-token loss over the first `blocks` consecutive held-out blocks."""
    model.eval()
    n = min(blocks, (stream.numel() - 1) // seq_len)
    losses = []
    for i in range(0, n, 8):
        rows = [stream[j * seq_len:(j + 1) * seq_len] for j in range(i, min(n, i + 8))]
        batch = torch.stack(rows).long().to(next(model.parameters()).device)
        losses.append(model(input_ids=batch, labels=batch).loss.item())
    model.train()
    return sum(losses) / len(losses)


def build_model(cfg, vocab_size: int, eos_id: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                         num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
                         intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position,
                         tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config)


def main(argv=None):
    cfg = parse_config(PretrainConfig, argv, description=__doc__)
    acc = make_accelerator(cfg, "draftkit-pretrain")
    corpus = build_corpus(cfg.corpus, cfg.text_column)
    tokenizer = load_or_train_tokenizer(cfg, corpus)
    train_stream, heldout_stream = token_streams(cfg, corpus, tokenizer)
    acc.print(f"corpus {corpus.source}: {train_stream.numel():,} train / {heldout_stream.numel():,} held-out tokens")

    model = build_model(cfg, len(tokenizer), tokenizer.eos_token_id)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: cosine_lr(s, cfg.max_steps, cfg.warmup_steps))
    model, opt, sched = acc.prepare(model, opt, sched)
    ckpts = Checkpoints(cfg.output_dir)
    start = ckpts.resume(acc)
    sampler = BlockSampler(train_stream, cfg.seq_len, cfg.batch_size, cfg.seed + acc.process_index)

    bar = tqdm(range(start, cfg.max_steps), initial=start, total=cfg.max_steps, desc="pretrain",
               disable=not acc.is_local_main_process)
    for step in bar:
        batch = sampler.batch(step).to(acc.device)
        loss = model(input_ids=batch, labels=batch).loss
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
        metrics = {"train/loss": loss.item(), "train/lr": sched.get_last_lr()[0]}
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.max_steps:
            metrics["heldout/loss"] = heldout_loss(model, heldout_stream, cfg.seq_len, cfg.eval_blocks)
        acc.log(metrics, step=step + 1)
        bar.set_postfix(loss=f"{metrics['train/loss']:.3f}")
        if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < cfg.max_steps:
            ckpts.save(acc, step + 1)
        if step + 1 == cfg.stop_at_step:
            finish(acc)
            return {"start_step": start, "stopped_at": step + 1}

    final = heldout_loss(model, heldout_stream, cfg.seq_len, cfg.eval_blocks)
    if acc.is_main_process:
        out = cfg.export_dir or os.path.join(cfg.output_dir, "final")
        save_hf(acc.unwrap_model(model), tokenizer, out)
    report = {"heldout_loss": final, "params": n_params, "steps": cfg.max_steps, "start_step": start,
              "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint}
    if acc.is_main_process:
        with open(os.path.join(out, "train_report.json"), "w") as fh:
            json.dump(report, fh, indent=2)
        acc.print(json.dumps(report))
    finish(acc)
    return report


if __name__ == "__main__":
    main()
