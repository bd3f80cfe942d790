r"""Distil the standalone draft model from the target.

    python train/launch.py --config_file recipes/accelerate/single.yaml \
        train/draft.py --config recipes/draft/distill.yaml
    python train/draft.py --config recipes/draft/distill.yaml           # one CPU

Loss: KL(p_target || q_draft) over the whole vocabulary at every trained position (the draft learns the target's
distributions, not just the next token), plus an optional cross-entropy term. The rows and p come through the
one data path (train/targetdata.py): text the target regenerated, p from its stored final hidden state.
`init_from` starts from an existing small causal LM instead of random weights ("default": the shipped draft);
with `lora_r` > 0 only LoRA adapters (peft) train. The target defaults to the shipped one (zoo/target).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM  # noqa: E402

from draftkit.train.config import TrainError, field, parse_config, resolve_model, shared  # noqa: E402
from draftkit.train.loop import Loop, cli, save_hf  # noqa: E402
from draftkit.train.pretrain import llama_config  # noqa: E402
from draftkit.train.targetdata import TargetDataConfig, target_data  # noqa: E402


@dataclass
class DraftConfig(TargetDataConfig):
    target: str = field("default", "target model to distil from: a folder, a hub id, a GGUF file, a named real "
                                   "target such as smollm2-135m, or default (the shipped target)")
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

    def __post_init__(self):
        if self.lora_r < 0 or (self.lora_r and not self.init_from):
            raise TrainError(f"lora_r {self.lora_r}: LoRA adapters train on a model given by --init_from (a rank "
                             f">= 1), or 0 for a full fine-tune / a random draft")
        super().__post_init__()


def build_draft(cfg, target) -> tuple[torch.nn.Module, str | None]:
    """(draft, the folder it started from): cfg.init_from's causal LM (with LoRA adapters when lora_r), or a new
    small Llama over the target's vocabulary (folder None)."""
    if cfg.init_from:
        path = resolve_model(cfg.init_from, "draft", "--init_from", target)
        try:
            draft = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        except (OSError, ValueError) as err:  # an EAGLE / Medusa / DFlash folder, or no model at all
            raise TrainError(f"--init_from {cfg.init_from}: not a causal LM transformers can load "
                             f"({' '.join(str(err).split())[:160]})") from None
        if cfg.lora_r:
            from peft import LoraConfig, get_peft_model

            draft = get_peft_model(draft, LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                                                     target_modules="all-linear"))
        return draft, path
    t = target.config
    config = llama_config(vocab_size=t.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                          num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
                          intermediate_size=cfg.intermediate_size, max_position_embeddings=t.max_position_embeddings,
                          tie_word_embeddings=True, bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id,
                          pad_token_id=t.pad_token_id)
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config), None


def logits_at(model, ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(N, V) logits of `model` at the positions `rows` (B, T) bool selects. The LM head runs on those positions
    only: over a real vocabulary (49,152 tokens) the head and the loss at every position of every row cost most of
    a step, while the loss reads the answers' positions alone. A model whose logits are more than its head of the
    last hidden state (soft-capping, a logit scale) computes them all, then picks."""
    inner = getattr(model, "module", model)  # a data-parallel wrapper runs the forward; the head is its model's
    config = getattr(inner, "config", None)
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return model(input_ids=ids).logits[rows]
    out = model(input_ids=ids, output_hidden_states=True, logits_to_keep=1)  # hidden_states[-1]: after the final norm
    return inner.get_output_embeddings()(out.hidden_states[-1][rows])


def distill_loss(draft_logits, target_logits, labels, ce_weight):
    """KL(p || q) (+ ce_weight * CE) averaged over the trained positions: draft_logits, target_logits (N, V) at
    those positions; labels (N,) the token that follows each, -100 where none does (a row's last position)."""
    logq = draft_logits.float().log_softmax(-1)
    logp = target_logits.float().log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean() if len(logq) else logq.sum()
    if not ce_weight:
        return kl, kl
    ce = F.cross_entropy(draft_logits.float(), labels, ignore_index=-100) if (labels >= 0).any() else kl * 0
    return kl + ce_weight * ce, kl


def next_tokens(ids: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(N,) the token after each selected position of ids (B, T), -100 at a row's last position."""
    following = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    return following[rows]


@torch.no_grad()
def heldout_metrics(draft, head, data, blocks) -> dict:
    """Held-out next-token loss of the draft and the share of positions where its argmax equals the target's."""
    hits = total = 0
    nll = 0.0
    for b in data.heldout(blocks):
        logits = logits_at(draft, b.ids, b.loss_mask)
        same = logits.argmax(-1) == head(b.last[b.loss_mask]).argmax(-1)
        hits, total = hits + int(same.sum()), total + same.numel()
        nll += F.cross_entropy(logits.float(), next_tokens(b.ids, b.loss_mask), ignore_index=-100,
                               reduction="sum").item()
    return {"loss": nll / max(1, total), "top1_agreement": hits / max(1, total)}


def main(argv=None):
    cfg = parse_config(DraftConfig, argv, description=__doc__)
    target_path = resolve_model(cfg.target, "target")
    with Loop(cfg, "draftkit-draft") as loop:
        tokenizer = AutoTokenizer.from_pretrained(target_path)
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval().requires_grad_(False)
        target = target.to(loop.acc.device)
        data = target_data(cfg, target, tokenizer, loop.acc, seed=cfg.seed)  # the last hidden state: p
        loop.tokens_per_row = data.tokens_per_epoch / data.rows.shape[0]
        head = target.get_output_embeddings()
        draft, start = build_draft(cfg, target)
        if start is not None:
            loop.continue_from(start)
        n_params = sum(p.numel() for p in draft.parameters())
        (draft,) = loop.prepare(draft)

        def step_loss(i):
            b = data.batch(i)
            with torch.no_grad():
                t_logits = head(b.last[b.loss_mask])  # (N, V): p from the stored final hidden state, no target forward
            loss, kl = distill_loss(logits_at(draft, b.ids, b.loss_mask), t_logits, next_tokens(b.ids, b.loss_mask),
                                    cfg.ce_weight)
            return loss, {"kl": kl.detach()}

        def evaluate():
            return heldout_metrics(loop.unwrap(draft), head, data, cfg.eval_blocks)

        result = loop.run(step_loss, evaluate, desc="distil draft", show=("kl",))
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": result.history}
        model = loop.unwrap(draft)
        if cfg.lora_r and cfg.init_from:
            model = model.merge_and_unload()
        report = {"heldout_loss": result.final["loss"], "top1_agreement": result.final["top1_agreement"],
                  "params": n_params, "steps": cfg.max_steps, "resumed_from": result.start_step,
                  "target": target_path, "corpus": data.corpus.source, "corpus_fingerprint": data.corpus.fingerprint,
                  "regenerated": cfg.regenerate, "data_mode": cfg.data_mode,
                  **loop.token_counts(cfg.max_steps),
                  "scaling": loop.heldout_history()}
        if loop.acc.is_main_process:
            save_hf(model, tokenizer, loop.final_dir)
        loop.write_report(report)
    return {**report, "history": result.history}


if __name__ == "__main__":
    cli(main)
