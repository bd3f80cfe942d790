r"""Train Medusa heads for a target (Medusa-1: frozen target; Medusa-2: joint LoRA fine-tune).

    python train/launch.py --config_file recipes/accelerate/single.yaml \
        train/medusa.py --config recipes/medusa/medusa1.yaml
    python train/medusa.py --config recipes/medusa/medusa1.yaml          # one CPU

Head k (0-based) reads the target's final hidden state h_t and predicts token
t + k + 2 (head 0: the token after the next one, which the LM head itself gives).

- medusa1: the target is frozen and run under no_grad; loss = sum_k CE(head_k(h_t), x_{t+k+2}).
- medusa2: the target gets a peft LoRA adapter trained jointly with the heads;
  loss = target_weight * (KL(original || fine-tuned) or LM loss) + sum_k head_decay^k * head_weight * CE_k,
  heads at head_lr_multiplier x the learning rate. Initialise the heads from a Medusa-1 run (init_heads).

Data: the one data path of every drafter recipe (train/targetdata.py): with `regenerate`, text the target
itself wrote (self-distillation, as Medusa's paper recommends when the data differs from the model's own
outputs); Medusa-1 reads the target's stored final hidden state (data_mode cached: no target forward per step),
Medusa-2 runs the target it fine-tunes (data_mode online).

At the end, per-head top-k accuracies (k <= eval_top_k) are measured on held-out blocks, the
tree of head choices is built from them (tree_size nodes) and everything is written to
export_dir (default output_dir/final) in the format drafters/medusa.py loads; Medusa-2 also
writes its LoRA adapter there. The target defaults to the shipped one (zoo/target). The loop
(train/loop.py) resumes a killed run from its last checkpoint.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from draftkit.drafters.medusa import MedusaHeads, save_medusa  # noqa: E402
from draftkit.drafters.medusa_tree import build_tree_choices, expected_accepted  # noqa: E402
from draftkit.train.config import (AUTO, TrainError, auto_or_list, field, parse_config, resolve_model,  # noqa: E402
                                   shared)
from draftkit.train.loop import Loop, cli  # noqa: E402
from draftkit.train.targetdata import TargetDataConfig, target_data  # noqa: E402


@dataclass
class MedusaConfig(TargetDataConfig):
    target: str = field("default", "the target model: a folder, a hub id, a GGUF file, a named real target such as "
                                   "smollm2-135m, or default (the shipped target)")
    tokenizer_dir: str = field("", "tokenizer (empty: the target's folder)")
    mode: str = field("medusa1", "medusa1 (frozen target) or medusa2 (joint LoRA fine-tune of the target)")
    num_heads: int = field(4, "Medusa heads (head k predicts the token k + 2 ahead of its position)")
    num_layers: int = field(1, "ResBlocks per head")
    share_lm_head: bool = field(False, "use the target's frozen LM head as every head's projection")
    init_heads: str = field("", "a Medusa folder to start the heads from (e.g. a Medusa-1 run for Medusa-2; "
                                "default: the shipped Medusa-1 heads, made for the shipped target)")
    lr: float = field(1e-3, "peak learning rate (AdamW); the heads' LR in medusa1, LoRA's in medusa2")
    head_lr_multiplier: float = field(4.0, "medusa2: the heads' LR is lr times this")
    lora_r: int = field(8, "medusa2: LoRA rank")
    lora_alpha: int = field(16, "medusa2: LoRA alpha")
    lora_dropout: float = field(0.0, "medusa2: LoRA dropout")
    lora_targets: list[str] = field(["q_proj", "v_proj"], "medusa2: module names that get LoRA adapters; auto = "
                                                          "peft's default for the target's architecture",
                                    auto=True)
    target_loss: str = field("kl", "medusa2: kl (KL(original || fine-tuned), self-distillation) or lm (next-token CE)")
    kl_weight: float = field(1.0, "medusa2: weight of the target's own loss (KL or LM)")
    head_weight: float = field(0.2, "medusa2: weight of the head losses")
    head_decay: float = field(0.8, "medusa2: head k's loss is scaled by head_decay ** k")
    loss_positions: float = field(1.0, "fraction of each row's positions whose head losses a step computes, drawn "
                                       "at random every step (the heads see one position at a time, so a step "
                                       "costs about this fraction: four 8192-way projections per position "
                                       "dominate it); 1.0: every position")
    eval_top_k: int = field(10, "top-k accuracies measured per head (the tree's widest rank)")
    tree_size: int = field(32, "nodes in the Medusa tree built from the held-out accuracies")
    output_dir: str = shared("output_dir", "runs/medusa1")
    max_steps: int = shared("max_steps", 500)
    warmup_ratio: float = shared("warmup_ratio", 0.1)
    eval_every: int = shared("eval_every", 100)
    eval_blocks: int = shared("eval_blocks", 64)

    def __post_init__(self):
        super().__post_init__()
        self.lora_targets = auto_or_list(self.lora_targets)
        if self.mode not in ("medusa1", "medusa2"):
            raise TrainError(f"mode must be 'medusa1' or 'medusa2', got {self.mode!r}")
        if self.target_loss not in ("kl", "lm"):
            raise TrainError(f"target_loss must be 'kl' or 'lm', got {self.target_loss!r}")
        if self.seq_len < self.num_heads + 3:
            raise TrainError(f"seq_len {self.seq_len} is too short for {self.num_heads} heads")
        if not 0 < self.loss_positions <= 1:
            raise TrainError(f"loss_positions must be in (0, 1], got {self.loss_positions}")
        if self.mode == "medusa2" and self.data_mode == "cached":
            raise TrainError("medusa2 fine-tunes the target, so its outputs cannot be stored ahead: "
                             "use --data_mode online")


# ----------------------------------------------------------------------------- losses and metrics


def head_outputs(heads, hidden: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None,
                 positions: float = 1.0):
    """Per head k: (logits (N, V), labels (N,)) pairing h_t with x_{t+k+2} where that token is trained on.
    hidden (B, T, H), tokens (B, T) (or (B, T, L): L labels per position, paired alike, labels (N, L)), mask (B, T)
    bool: token t + 1 is trained on (None: all). positions < 1:
    only that fraction of the positions t, drawn at random (the same for every head and row), is projected:
    an unbiased sample of the loss at a fraction of the cost."""
    T = tokens.shape[1]
    pos = torch.arange(T - 2, device=hidden.device)  # positions t whose x_{t+2} lies in the row
    if positions < 1.0:
        pos = pos[torch.randperm(T - 2, device=hidden.device)[:max(1, round((T - 2) * positions))]].sort().values
    logits = heads(hidden[:, pos])  # (K, B, P, V): one call, so a DDP-wrapped module syncs its gradients
    out = []
    for k in range(logits.shape[0]):
        t = pos + k + 2  # (P,) the label's index
        valid = t < T
        lk, yk = logits[k][:, valid], tokens[:, t[valid]]
        if mask is not None:
            keep = mask[:, t[valid] - 1]  # x_{t+k+2} is trained on
            out.append((lk[keep], yk[keep]))
        else:
            out.append((lk.reshape(-1, logits.shape[-1]), yk.reshape(-1, *tokens.shape[2:])))
    return out


def head_losses(heads, hidden, tokens, mask=None, top: int = 5, positions: float = 1.0):
    """(losses per head, {metric: value}) with top-1 / top-`top` accuracy per head."""
    losses, metrics = [], {}
    for k, (logits, labels) in enumerate(head_outputs(heads, hidden, tokens, mask, positions)):
        loss = F.cross_entropy(logits.float(), labels)
        losses.append(loss)
        with torch.no_grad():
            hits = logits.topk(top, -1).indices == labels[:, None]
            metrics[f"head{k}_loss"] = loss.item()
            metrics[f"head{k}_top1"] = hits[:, 0].float().mean().item()
            metrics[f"head{k}_top{top}"] = hits.any(-1).float().mean().item()
    return losses, metrics


def kl_to_reference(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(ref || model)."""
    ref = ref_logits.float().log_softmax(-1)
    return (ref.exp() * (ref - logits.float().log_softmax(-1))).sum(-1).mean()


@torch.no_grad()
def evaluate_heads(target, heads, data, blocks: int, top_k: int = 10) -> dict:
    """Held-out head losses, per-rank and cumulative top-k accuracies, and the target's LM loss.

    Only the labels the recipe trains on count (a conversation's answer tokens: its prompt and the padding after
    it would be most of a row, and the padding is trivially predicted). Two labels per position: the held-out
    text's own token x_{t+k+2} (per_rank, topk, head_loss) and the target's own prediction of it (agree_per_rank,
    agree_topk): what greedy acceptance tests, and what EAGLE's held-out top-1 measures too; the tree is built
    from the agreement. follow_top1[k]: head k's top-1 agreement at the positions whose text tokens t+1 .. t+k+1
    are each the target's own prediction (the case decoding meets: a head reads h_t alone, and on written text
    x_{t+1} is often not what the target would say).
    per_rank[k][r]: share of positions where the label is head k's rank-r guess.
    topk[k][r]:     share where it is among head k's top r + 1 (cumulative).
    """
    was_training = heads.training, target.training
    heads.eval(), target.eval()
    device = next(heads.parameters()).device
    K = heads.num_heads
    rank_hits, agree_hits = torch.zeros(K, top_k), torch.zeros(K, top_k)
    follow_hits, follow_counts = torch.zeros(K), torch.zeros(K)
    counts = torch.zeros(K)
    loss_sum = torch.zeros(K)
    lm_sum, lm_n, n = 0.0, 0, 0
    for batch, mask in data.heldout_tokens(blocks):  # mask: the positions trained on (a conversation's answers)
        out = target(input_ids=batch, output_hidden_states=True)
        hidden = out.hidden_states[-1].to(device)
        trained = mask[:, :-1]
        lm = F.cross_entropy(out.logits[:, :-1][trained].float(), batch[:, 1:][trained], reduction="sum") \
            if trained.any() else out.logits.new_zeros(())
        lm_sum, lm_n, n = lm_sum + lm.item(), lm_n + int(trained.sum()), n + batch.shape[0]
        # (B, T): the target's prediction of token j at index j (index 0 keeps the text's token, never a label)
        predicted = torch.cat([batch[:, :1], out.logits[:, :-1].argmax(-1)], 1)
        run = following_run(predicted == batch)
        # one heads forward, three labels per position: the text's token, the target's, the run before it
        labels3 = torch.stack([batch, predicted, run], -1)
        for k, (logits, paired) in enumerate(head_outputs(heads, hidden, labels3, mask)):  # trained labels only
            labels, agreed, followed = paired.unbind(-1)
            if not labels.numel():
                continue
            loss_sum[k] += F.cross_entropy(logits.float(), labels, reduction="sum").item()
            counts[k] += labels.numel()
            guesses = logits.topk(top_k, -1).indices
            rank_hits[k] += (guesses == labels[:, None]).float().sum(0).cpu()
            agree_hits[k] += (guesses == agreed[:, None]).float().sum(0).cpu()
            on_target_text = followed >= k + 1  # x_{t+1} .. x_{t+k+1} each the target's own top-1
            follow_hits[k] += (guesses[:, 0] == agreed)[on_target_text].sum().item()
            follow_counts[k] += on_target_text.sum().item()
    heads.train(was_training[0]), target.train(was_training[1])
    per_rank, agree_per_rank = rank_hits / counts[:, None], agree_hits / counts[:, None]
    return {"head_loss": (loss_sum / counts).tolist(), "per_rank": per_rank.tolist(),
            "topk": per_rank.cumsum(-1).tolist(), "agree_per_rank": agree_per_rank.tolist(),
            "agree_topk": agree_per_rank.cumsum(-1).tolist(),
            "follow_top1": (follow_hits / follow_counts.clamp(min=1)).tolist(),
            "follow_positions": follow_counts.tolist(),
            "target_loss": lm_sum / lm_n, "blocks": n}


def following_run(follows: torch.Tensor) -> torch.Tensor:
    """(B, T) bool -> (B, T) long: at index j, how many text tokens in a row just before j (j-1, j-2, ...) are the
    target's own prediction (index 0 never is). Read at a head's label index t+k+2, >= k+1 means that tokens
    t+1 .. t+k+1 all followed the target."""
    run = torch.zeros(follows.shape, dtype=torch.long, device=follows.device)
    for j in range(2, follows.shape[1]):
        run[:, j] = torch.where(follows[:, j - 1], run[:, j - 1] + 1, 0)
    return run


def eval_metrics(res: dict) -> dict:
    """The scalars of an evaluate() result, for logging."""
    m = {"target_loss": res["target_loss"], "head_loss": sum(res["head_loss"])}
    for k, loss in enumerate(res["head_loss"]):
        m[f"head{k}_loss"] = loss
        m[f"head{k}_top1"] = res["topk"][k][0]
        m[f"head{k}_top5"] = res["topk"][k][min(4, len(res["topk"][k]) - 1)]
        m[f"head{k}_agreement"] = res["agree_topk"][k][0]
        m[f"head{k}_follow_top1"] = res["follow_top1"][k]
    return m


# ----------------------------------------------------------------------------- models


def init_heads_file(cfg, target) -> str | None:
    """The weights file of cfg.init_heads, checked against the heads this run makes for `target` (a one-line
    TrainError before any data is made), or None for new heads."""
    if not cfg.init_heads:
        return None
    folder = resolve_model(cfg.init_heads, "medusa", "--init_heads")
    src = os.path.join(folder, "model.safetensors")
    if not os.path.exists(src):
        raise TrainError(f"--init_heads {cfg.init_heads}: {src} does not exist (train Medusa-1 first, or pass "
                         "--init_heads '' for new heads)")
    with open(os.path.join(folder, "config.json")) as fh:
        icfg = json.load(fh)
    if "num_heads" not in icfg:
        kind = icfg.get("kind") or icfg.get("model_type") or "another kind of model"
        raise TrainError(f"--init_heads {cfg.init_heads}: not a Medusa folder (its config.json describes {kind}); "
                         f"give a Medusa run's final/ folder, or --init_heads '' for new heads")
    vocab, hidden = target.get_output_embeddings().weight.shape
    want = MedusaHeads.settings(hidden, vocab, cfg.num_heads, cfg.num_layers, cfg.share_lm_head)
    if any(icfg.get(k) != v for k, v in want.items()):
        raise TrainError(f"--init_heads {cfg.init_heads} has heads {({k: icfg.get(k) for k in want})}, this run "
                         f"wants {want} (pass --init_heads '' for new heads, or heads made for this target)")
    return src


def make_heads(cfg, target, src: str | None) -> MedusaHeads:
    """New heads for `target`, loaded from `src` (init_heads_file's, checked) when given."""
    emb = target.get_output_embeddings()
    torch.manual_seed(cfg.seed)
    heads = MedusaHeads(emb.weight.shape[1], emb.weight.shape[0], cfg.num_heads, cfg.num_layers, cfg.share_lm_head)
    if cfg.share_lm_head:
        heads.attach_lm_head(emb)
    else:
        heads.init_from_lm_head(emb)
    if src is not None:
        from safetensors.torch import load_file

        heads.load_state_dict({k: v.float() for k, v in load_file(src).items()})
    return heads.to(emb.weight.device)


def lora_targets(cfg, target) -> list[str]:
    """The module names that get adapters: the recipe's when the target has them, peft's default for its
    architecture for `auto`; else a one-line TrainError naming the target's own linear layers."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS
    from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

    kind = target.config.model_type
    names = DEFAULTS.get(kind, []) if cfg.lora_targets == AUTO else list(cfg.lora_targets)
    linear = sorted({n.rsplit(".", 1)[-1] for n, m in target.named_modules()
                     if isinstance(m, (torch.nn.Linear, Conv1D))} - {"lm_head"})
    if not names or not set(names) & set(linear):
        asked = f"peft has no default for {kind}" if not names else f"{names} match no module of it"
        raise TrainError(f"lora_targets: {asked}; {type(target).__name__}'s linear layers are {', '.join(linear)}")
    return names


def add_lora(cfg, target):
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=lora_targets(cfg, target), bias="none", task_type="CAUSAL_LM")
    return get_peft_model(target, lora)


def count_trainable(*modules) -> int:
    return sum(p.numel() for m in modules for p in m.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------- main


def main(argv=None):
    cfg = parse_config(MedusaConfig, argv, description=__doc__)
    target_path = resolve_model(cfg.target, "target")
    medusa2 = cfg.mode == "medusa2"
    with Loop(cfg, f"draftkit-{cfg.mode}") as loop:
        acc = loop.acc
        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_dir or target_path)
        target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).to(acc.device)
        vocab = target.get_output_embeddings().weight.shape[0]
        if len(tokenizer) > vocab:
            raise TrainError(f"tokenizer has {len(tokenizer)} tokens but target {cfg.target} only {vocab} outputs")
        target.requires_grad_(False).eval()
        init_heads = init_heads_file(cfg, target)  # the settings' one-line errors before the data is made
        if medusa2:                                # (minutes on a real target)
            lora_targets(cfg, target)
        data = target_data(cfg, target, tokenizer, acc, seed=cfg.seed)  # the final hidden state
        loop.tokens_per_row = data.tokens_per_epoch / data.rows.shape[0]
        heads = make_heads(cfg, target, init_heads)
        if init_heads:
            loop.continue_from(os.path.dirname(init_heads))
        if medusa2:
            target = add_lora(cfg, target)
            target.train()
            groups = [{"params": [p for p in target.parameters() if p.requires_grad], "lr": cfg.lr},
                      {"params": list(heads.parameters()), "lr": cfg.lr * cfg.head_lr_multiplier}]
            heads, target = loop.prepare(heads, target, param_groups=groups)
        else:
            (heads,) = loop.prepare(heads)
        n_trainable = count_trainable(heads, target)
        plain = loop.unwrap(target)

        def evaluate(top_k=cfg.eval_top_k):
            res = evaluate_heads(plain, loop.unwrap(heads), data, cfg.eval_blocks, top_k)
            return {**eval_metrics(res), "result": res}

        initial = None
        if loop.start_step == 0:
            initial = evaluate(5)["result"]
            loop.log({f"heldout/{k}": v for k, v in eval_metrics(initial).items()}, step=0)
            acc.print(f"before training: held-out head losses {[round(x, 3) for x in initial['head_loss']]}")

        def step_loss(i):
            metrics = {}
            if medusa2:
                batch, mask = data.tokens(i)
                out = target(input_ids=batch, output_hidden_states=True)
                if cfg.target_loss == "kl":
                    with torch.no_grad(), plain.disable_adapter():
                        reference = plain(input_ids=batch).logits  # the original target's p
                    own = kl_to_reference(out.logits, reference)
                else:
                    own = F.cross_entropy(out.logits[:, :-1].reshape(-1, vocab).float(), batch[:, 1:].reshape(-1))
                losses, hm = head_losses(heads, out.hidden_states[-1], batch, mask, positions=cfg.loss_positions)
                head_total = sum(cfg.head_decay ** k * cfg.head_weight * l for k, l in enumerate(losses))
                metrics[f"target_{cfg.target_loss}"] = own.detach()
                metrics["head_loss_weighted"] = head_total.detach()
                loss = cfg.kl_weight * own + head_total
            else:
                b = data.batch(i)  # the stored final hidden state: no target forward
                losses, hm = head_losses(heads, b.last, b.ids, b.loss_mask, positions=cfg.loss_positions)
                loss = sum(losses)
            return loss, {**metrics, **hm, "head_loss": sum(l.item() for l in losses)}

        result = loop.run(step_loss, evaluate, desc=cfg.mode, show=("head0_top1",))
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": result.history}

        # the tree and the export, from the final held-out accuracies
        res = result.final["result"]
        heads_final = loop.unwrap(heads).eval()
        plain.eval()
        choices = build_tree_choices(res["agree_per_rank"], cfg.tree_size)
        report = {
            "mode": cfg.mode, "steps": cfg.max_steps, "resumed_from": result.start_step,
            "train_seconds": round(result.seconds, 1), "trainable_params": n_trainable,
            "head_top1": [r[0] for r in res["topk"]], "head_top5": [r[min(4, cfg.eval_top_k - 1)] for r in res["topk"]],
            "head_agreement": [r[0] for r in res["agree_topk"]], "head_follow_top1": res["follow_top1"],
            "heldout_head_loss": res["head_loss"],
            "initial_heldout_head_loss": initial["head_loss"] if initial else None,
            "heldout_target_loss": res["target_loss"],
            "tree_size": len(choices), "expected_accepted": expected_accepted(choices, res["agree_per_rank"]),
            "heldout_blocks": res["blocks"], "corpus": data.corpus.source,
            "corpus_fingerprint": data.corpus.fingerprint, "target": target_path, "regenerated": cfg.regenerate,
            "data_mode": cfg.data_mode, **loop.token_counts(cfg.max_steps),
            "scaling": loop.heldout_history(),
        }
        if medusa2:
            with plain.disable_adapter():
                report["heldout_target_loss_original"] = evaluate_heads(
                    plain, heads_final, data, cfg.eval_blocks, 1)["target_loss"]
        out_dir = loop.final_dir
        if acc.is_main_process:
            base = plain.get_base_model() if medusa2 else plain
            save_medusa(out_dir, heads_final, choices, base, accuracies=res["agree_per_rank"],
                        extra_config={"mode": cfg.mode, "target": {
                            "name": target_path, "hidden_size": base.config.hidden_size, "vocab_size": vocab,
                            "num_layers": getattr(base.config, "num_hidden_layers", None),
                            "model_type": base.config.model_type},
                            "train_config": asdict(cfg)},
                        metrics={"heldout_topk": res["topk"], "heldout_agreement_topk": res["agree_topk"],
                                 "heldout_head_loss": res["head_loss"],
                                 "heldout_target_loss": res["target_loss"]})
            if medusa2:
                plain.save_pretrained(out_dir)
            tokenizer.save_pretrained(out_dir)
        report["export_dir"] = out_dir
        loop.write_report(report)
    return {**report, "history": result.history}


__all__ = ["MedusaConfig", "main", "evaluate_heads", "following_run", "head_losses", "head_outputs", "kl_to_reference"]

if __name__ == "__main__":
    cli(main)
