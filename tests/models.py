"""Tiny random causal LMs of several architectures, built from configs (no download)."""
from __future__ import annotations

import torch
import transformers
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


# Attention layouts past a short window: every layer sliding (Mistral), mixed full / sliding layers (Qwen2 with
# max_window_layers, Gemma 2 with soft-capping, Gemma 3, gpt-oss with attention sinks), chunked (Llama 4).
WINDOWED = ("mistral", "qwen2", "gemma2", "gemma3", "gpt-oss", "llama4")


def windowed_model(arch: str, window: int = 8, vocab: int = 64, hidden: int = 32, layers: int = 4, seed: int = 0):
    """A tiny random model whose layers attend over `window` positions (or chunks of `window`)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=512)
    mixed = ["sliding_attention", "full_attention"] * (layers // 2)
    t = transformers
    build = {
        "mistral": lambda: t.MistralForCausalLM(t.MistralConfig(**common, sliding_window=window)),
        "qwen2": lambda: t.Qwen2ForCausalLM(t.Qwen2Config(**common, use_sliding_window=True, sliding_window=window,
                                                          max_window_layers=1)),
        "gemma2": lambda: t.Gemma2ForCausalLM(t.Gemma2Config(**common, head_dim=8, sliding_window=window,
                                                             layer_types=mixed)),
        "gemma3": lambda: t.Gemma3ForCausalLM(t.Gemma3TextConfig(**common, head_dim=8, sliding_window=window,
                                                                 layer_types=mixed)),
        "gpt-oss": lambda: t.GptOssForCausalLM(t.GptOssConfig(**common, head_dim=8, sliding_window=window,
                                                              layer_types=mixed, num_local_experts=4,
                                                              num_experts_per_tok=2, rope_scaling=None)),
        "llama4": lambda: t.Llama4ForCausalLM(t.Llama4TextConfig(
            **common, head_dim=8, attention_chunk_size=window, num_local_experts=2, intermediate_size_mlp=2 * hidden,
            layer_types=["chunked_attention"] * (layers - 1) + ["full_attention"])),
    }
    model = build[arch]()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()


def config_model(model_type: str, seed: int = 0, **overrides):
    """A tiny random model of any transformers architecture, from its config class's defaults and small sizes."""
    torch.manual_seed(seed)
    sizes = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=64, max_position_embeddings=512)
    cfg = transformers.AutoConfig.for_model(model_type, **{**sizes, **overrides})
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):  # inside the tiny vocabulary
        if getattr(cfg, k, None) is not None:
            setattr(cfg, k, 0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model.eval()
