"""Distil the standalone draft model from the target.

    python train/launch.py --config_file recipes/accelerate/single.yaml train/draft.py --config recipes/draft/distill.yaml
    python train/draft.py --config recipes/draft/distill.yaml           # one CPU

Loss: KL(p_target || q_draft) over the whole vocabulary at every position (the draft learns the target's
distributions, not just the corpus's next token), plus an optional cross-entropy term. `init_from` starts
from an existing small causal LM instead of random weights ("default": the shipped draft); with `lora_r` > 0
only LoRA adapters (peft) train. The target defaults to the shipped one (zoo/target).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: E402

from draftkit.train.config import TrainConfig, field, parse_config, resolve_model, shared  # noqa: E402
from draftkit.train.data import BlockSampler, heldout_batches, load_streams  # noqa: E402
from draftkit.train.loop import Loop, cli, save_hf  # noqa: E402
from draftkit.train.pretrain import heldout_loss, llama_config  # noqa: E402


@dataclass
class DraftConfig(TrainConfig):
    target: str = field("default", "target model to distil from: a folder, a hub id, or default (the shipped target)")
    init_from: str = field("", "start from this causal LM (folder, hub id, or default: the shipped draft) instead "
                               "of random weights")
    lora_r: int = field(0, "with init_from: train LoRA adapters of this rank only (0: full fine-tune)")
    lora_alpha: int = field(16, "LoRA alpha")
    hidden_size: int = field(128, "draft width (random init)")
    num_layers: int = field(2, "draft decoder layers (random init)")
    num_heads: int = field(4, "draft attention heads (random init)")
    intermediate_size: int = field(384, "draft MLP width (random init)")
    ce_weight: float = field(0.0, "weight of the plain next-token cross-entropy beside the KL")
    output_dir: str = shared("output_dir", "runs/draft")
    lr: float = shared("lr", 3e-3)
    warmup_steps: int = shared("warmup_steps", 50)
    max_steps: int = shared("max_steps", 1200)
    seed: int = shared("seed", 1)


def build_draft(cfg, target) -> torch.nn.Module:
    if cfg.init_from:
        path = resolve_model(cfg.init_from, "draft", "--init_from")
        draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if cfg.lora_r:
            from peft import LoraConfig, get_peft_model

            draft = get_peft_model(draft, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, target_modules="all-linear"))
        return draft
    t = target.config
    config = llama_config(vocab_size=t.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
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
    hits = total = 0
    for batch in heldout_batches(stream, seq_len, blocks, next(draft.parameters()).device):
        same = draft(input_ids=batch).logits.argmax(-1) == target(input_ids=batch).logits.argmax(-1)
        hits += int(same.sum())
        total += same.numel()
    return hits / total


def main(argv=None):
    cfg = parse_config(DraftConfig, argv, description=__doc__)
    target_path = resolve_model(cfg.target, "target")
    with Loop(cfg, "draftkit-draft") as loop:
        tokenizer = AutoTokenizer.from_pretrained(target_path)
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval().requires_grad_(False)
        corpus, train_stream, heldout_stream = load_streams(cfg, tokenizer, loop.acc)
        draft = build_draft(cfg, target)
        n_params = sum(p.numel() for p in draft.parameters())
        (draft,) = loop.prepare(draft)
        target = target.to(loop.acc.device)
        sampler = BlockSampler(train_stream, cfg.seq_len, cfg.batch_size, loop.data_seed)

        def step_loss(i):
            batch = sampler.batch(i).to(loop.acc.device)
            with torch.no_grad():
                t_logits = target(input_ids=batch).logits
            loss, kl = distill_loss(draft(input_ids=batch).logits, t_logits, batch, cfg.ce_weight)
            return loss, {"kl": kl.detach()}

        def evaluate():
            model = loop.unwrap(draft)
            return {"loss": heldout_loss(model, heldout_stream, cfg.seq_len, cfg.eval_blocks),
                    "top1_agreement": top1_agreement(model, target, heldout_stream, cfg.seq_len, cfg.eval_blocks)}

        result = loop.run(step_loss, evaluate, desc="distil draft", show=("kl",))
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": result.history}
        model = loop.unwrap(draft)
        if cfg.lora_r and cfg.init_from:
            model = model.merge_and_unload()
        report = {"heldout_loss": result.final["loss"], "top1_agreement": result.final["top1_agreement"],
                  "params": n_params, "steps": cfg.max_steps, "resumed_from": result.start_step,
                  "target": target_path, "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint}
        if loop.acc.is_main_process:
            save_hf(model, tokenizer, loop.final_dir)
        loop.write_report(report)
    return {**report, "history": result.history}


if __name__ == "__main__":
    cli(main)
