r"""Pretrain the default target: a small Llama-architecture causal LM.

    python train/launch.py --config_file recipes/accelerate/single.yaml \
        train/pretrain.py --config recipes/zoo/target.yaml
    python train/pretrain.py --config recipes/zoo/target.yaml      # one CPU

Trains the tokenizer first if `tokenizer_dir` holds none. The loop (train/loop.py) resumes a killed run
from its last checkpoint and continues a finished one when --max_steps is raised.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from draftkit.train.config import TrainConfig, TrainError, field, parse_config, shared  # noqa: E402
from draftkit.train.data import (BlockSampler, build_corpus, heldout_batches, token_streams,  # noqa: E402
                                 train_tokenizer)
from draftkit.train.loop import Loop, cli, save_hf  # noqa: E402


@dataclass
class PretrainConfig(TrainConfig):
    tokenizer_dir: str = field("zoo/tokenizer", "tokenizer to use; trained on the train split and saved here if absent")
    vocab_size: int = field(8192, "BPE vocabulary size when a tokenizer is trained")
    hidden_size: int = field(384, "model width")
    num_layers: int = field(6, "decoder layers")
    num_heads: int = field(6, "attention heads")
    intermediate_size: int = field(1024, "MLP width")
    max_position: int = field(1024, "longest context the model supports")
    output_dir: str = shared("output_dir", "runs/target")
    max_steps: int = shared("max_steps", 4000)
    weight_decay: float = shared("weight_decay", 0.1)
    warmup_steps: int = shared("warmup_steps", 200)
    eval_every: int = shared("eval_every", 250)
    eval_blocks: int = shared("eval_blocks", 64)
    checkpoint_every: int = shared("checkpoint_every", 200)


def load_or_train_tokenizer(cfg, corpus):
    if os.path.exists(os.path.join(cfg.tokenizer_dir, "tokenizer.json")):
        return AutoTokenizer.from_pretrained(cfg.tokenizer_dir)
    print(f"training a {cfg.vocab_size}-token byte-level BPE on {len(corpus.train)} files -> {cfg.tokenizer_dir}")
    return train_tokenizer(corpus.train["text"], cfg.vocab_size, cfg.tokenizer_dir)


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq_len: int, blocks: int) -> float:
    """Mean next-token loss over the first `blocks` consecutive held-out blocks."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    losses = [model(input_ids=b, labels=b).loss.item() for b in heldout_batches(stream, seq_len, blocks, device)]
    model.train(was)
    return sum(losses) / len(losses)


def llama_config(**kwargs) -> LlamaConfig:
    """A LlamaConfig; a shape transformers rejects (heads not dividing the width, ...) is a one-line error."""
    try:
        return LlamaConfig(**kwargs)
    except Exception as err:  # noqa: BLE001 - transformers' validators raise several kinds
        raise TrainError("model shape: " + " ".join(str(err).split())) from None


def build_model(cfg, vocab_size: int, eos_id: int) -> LlamaForCausalLM:
    config = llama_config(vocab_size=vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
                          num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_heads,
                          intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position,
                          tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    torch.manual_seed(cfg.seed)
    return LlamaForCausalLM(config)


def main(argv=None):
    cfg = parse_config(PretrainConfig, argv, description=__doc__)
    with Loop(cfg, "draftkit-pretrain") as loop:
        with loop.acc.main_process_first():  # the main process trains the tokenizer and fills the caches
            corpus = build_corpus(cfg.corpus, cfg.text_column)
            tokenizer = load_or_train_tokenizer(cfg, corpus)
            train_stream, heldout_stream = token_streams(cfg, corpus, tokenizer)
        loop.acc.print(f"corpus {corpus.source}: {train_stream.numel():,} train / "
                       f"{heldout_stream.numel():,} held-out tokens")
        model = build_model(cfg, len(tokenizer), tokenizer.eos_token_id)
        n_params = sum(p.numel() for p in model.parameters())
        (model,) = loop.prepare(model)
        sampler = BlockSampler(train_stream, cfg.seq_len, cfg.batch_size, loop.data_seed)

        def step_loss(i):
            batch = sampler.batch(i).to(loop.acc.device)
            return model(input_ids=batch, labels=batch).loss, {}

        def evaluate():
            return {"loss": heldout_loss(loop.unwrap(model), heldout_stream, cfg.seq_len, cfg.eval_blocks)}

        result = loop.run(step_loss, evaluate, desc="pretrain")
        if result.stopped:
            return {"resumed_from": result.start_step, "stopped_at": result.step, "history": result.history}
        if loop.acc.is_main_process:
            save_hf(loop.unwrap(model), tokenizer, loop.final_dir)
        report = {"heldout_loss": result.final["loss"], "params": n_params, "steps": cfg.max_steps,
                  "resumed_from": result.start_step, "corpus": corpus.source, "corpus_fingerprint": corpus.fingerprint}
        loop.write_report(report)
    return {**report, "history": result.history}


if __name__ == "__main__":
    cli(main)
