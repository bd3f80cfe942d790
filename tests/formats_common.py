"""What the format tests share: tiny Llama targets, fixed-budget decoding, folders written by hand."""
from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.verify.decode import generate as _generate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = [torch.tensor([5]), torch.tensor([3, 17, 42, 8, 8, 61, 0, 9]), torch.arange(20) % 7 + 30]

DRAFT_IDS = torch.arange(0, 64, 2)  # the even ids: a reduced draft vocabulary of 32


def generate(*args, **kwargs):
    return _generate(*args, **{"budget": "fixed", **kwargs})


def tiny_target(layers=4, vocab=64, hidden=32, seed=0, logit_scale=4.0, name="tiny-target"):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512, rope_theta=10000.0,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    model.config._name_or_path = name
    return model


def write_folder(path, cfg, tensors, name="model.safetensors"):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    if name.endswith(".safetensors"):
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(path, name))
    else:
        torch.save(tensors, os.path.join(path, name))
    return str(path)


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 0.15
