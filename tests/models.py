"""Tiny random causal LMs of several architectures, built from configs (no download)."""
from __future__ import annotations

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

ARCHS = ("llama", "qwen2", "mistral", "gpt2")


def tiny_model(arch: str = "llama", vocab: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0,
               max_len: int = 512):
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=max_len)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif arch == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=None))
    elif arch == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4,
                                           n_positions=max_len, bos_token_id=0, eos_token_id=0))
    else:
        raise ValueError(arch)
    # sharpen the random logits so greedy paths are stable and drafts get accepted sometimes
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()
