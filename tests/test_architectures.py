"""Generality across transformers' causal-LM families: tiny random models of each architecture, built from
its config class, decode exactly as transformers' `generate` does and every drafter equals plain decoding, with
dynamic and static shapes. The families differ in what a verifier meets: GPT-2-style bodies (`.h`, learned
positions, fused attention), parallel attention and MLP (GPT-J, CodeGen, Falcon, GPT-NeoX), multi-head latent
attention whose keys and values differ in width (DeepSeek V2 / V3), mixtures of experts, per-layer head sizes
(Gemma 4), partial rotary embeddings (Phi, Persimmon), layer norms with biases (OPT, StableLM)."""
import pytest
import torch

import draftkit as dk
from tests.models import config_model
from tests.test_attention_layout import drafted_tokens

torch.set_num_threads(1)

MLA = dict(qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, kv_lora_rank=16, q_lora_rank=16,
           num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
           moe_intermediate_size=16, first_k_dense_replace=1)
FAMILIES = {
    "qwen3": {}, "qwen3_moe": {}, "qwen2_moe": {}, "mixtral": {}, "phi3": {}, "phi": {}, "gemma": {},
    "gemma4_text": {"head_dim": 8}, "cohere": {}, "granite": {}, "olmo2": {}, "smollm3": {}, "glm4": {},
    "exaone4": {}, "starcoder2": {}, "stablelm": {}, "persimmon": {}, "nemotron": {}, "opt": {}, "gpt_neox": {},
    "gptj": {"rotary_dim": 4}, "codegen": {"rotary_dim": 4}, "falcon": {}, "gpt_bigcode": {}, "gpt2": {},
    "biogpt": {}, "deepseek_v2": MLA, "deepseek_v3": MLA,
}
PROMPT = (torch.arange(40) * 5 + 3) % 61
NEW = 20
DRAFTERS = ["eagle-tree", "eagle3-tree", "standalone-tree", "medusa-tree", "lookahead", "suffix"]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_drafter_equals_plain_decoding(model_type):
    target = config_model(model_type, **FAMILIES[model_type])
    ref = target.generate(PROMPT[None], attention_mask=torch.ones(1, PROMPT.numel(), dtype=torch.long),
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)[0, PROMPT.numel():]
    plain = dk.generate(target, PROMPT, None, NEW, eos_token_id=[]).tokens.tolist()
    assert plain == ref.tolist()
    for kind in DRAFTERS:
        for static in (False, True):
            assert drafted_tokens(target, kind, PROMPT, NEW, static) == plain, (kind, static)
