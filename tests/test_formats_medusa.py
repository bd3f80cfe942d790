"""Medusa's public formats (FasterDecoding v1 / v2, vLLM) and the standalone export, without downloads."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

import draftkit as dk
from draftkit.drafters.formats import detect
from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads, save_medusa
from draftkit.drafters.medusa_tree import build_tree_choices, default_accuracies
from draftkit.train.export import main as export_main
from tests.formats_common import PROMPTS, generate, rand, tiny_target, write_folder

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target4():
    return tiny_target(layers=4, seed=1)


# ----------------------------------------------------------------------------- Medusa


def medusa_reference_logits(blocks, lm_heads, h):
    out = []
    for k, layers in enumerate(blocks):
        x = h
        for w, b in layers:
            x = x + torch.nn.functional.silu(x @ w.T + b)
        out.append(x @ lm_heads[k].T)
    return torch.stack(out)


@pytest.mark.parametrize("kind", ["vllm", "vllm-original-lm-head", "original-v1", "original-v2", "original-pt"])
def test_public_medusa_imports(tmp_path, target4, kind):
    n, L, H, V = 3, 1, 32, 64
    blocks = [[(rand(H, H, seed=10 * k + l), rand(H, seed=10 * k + l + 5)) for l in range(L)] for k in range(n)]
    own = [rand(V, H, seed=100 + k) * 10 for k in range(n)]
    base = target4.lm_head.weight.detach()
    if kind.startswith("vllm"):
        w = {f"blocks.{k}.layers.{l}.{p}": t for k in range(n) for l in range(L)
             for p, t in zip(("weight", "bias"), blocks[k][l])}
        cfg = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": H, "vocab_size": V,
               "num_heads": n, "num_hidden_layers": L, "medusa_fc_bias": True}
        if kind == "vllm":
            w.update({f"lm_heads.{k}.weight": own[k] for k in range(n)})
            heads_used = own
        else:
            cfg["original_lm_head"] = True
            w["lm_heads.0.weight"] = base.clone()
            heads_used = [base] * n
        path = write_folder(tmp_path / kind, cfg, w)
    else:
        w = {f"{k}.{l}.linear.{p}": t for k in range(n) for l in range(L)
             for p, t in zip(("weight", "bias"), blocks[k][l])}
        if kind != "original-v2":
            w.update({f"{k}.{L}.weight": own[k] for k in range(n)})
        heads_used = [base] * n if kind == "original-v2" else own
        cfg = {"medusa_num_heads": n, "medusa_num_layers": L, "base_model_name_or_path": "tiny-target"}
        name = "medusa_lm_head.pt" if kind == "original-pt" else "medusa_lm_head.safetensors"
        path = write_folder(tmp_path / kind, cfg, w, name)
    drafter = dk.make_drafter("medusa", target4, path, max_nodes=8)
    h = torch.randn(2, H)
    with torch.no_grad():
        torch.testing.assert_close(drafter.heads(h), medusa_reference_logits(blocks, heads_used, h),
                                   atol=1e-4, rtol=1e-4)
    assert drafter.heads.share_lm_head == (kind in ("vllm-original-lm-head", "original-v2"))
    for prompt in PROMPTS:
        ref = generate(target4, prompt, max_new_tokens=10, eos_token_id=[])
        assert generate(target4, prompt, drafter=drafter, max_new_tokens=10, eos_token_id=[]).tokens.equal(ref.tokens)
    with pytest.raises(ValueError, match="trained for target .*hidden size 32.*other-B.*hidden size 48"):
        MedusaDrafter.from_pretrained(path, tiny_target(hidden=48, name="other-B"))


@pytest.mark.parametrize("fmt", ["vllm", "medusa-original"])
@pytest.mark.parametrize("share", [False, True])
def test_medusa_export_reimport(tmp_path, target4, fmt, share):
    target_dir = tmp_path / "target"
    target4.save_pretrained(str(target_dir))
    torch.manual_seed(0)
    heads = MedusaHeads(32, 64, num_heads=3, num_layers=1, share_lm_head=share)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(std=0.3)
    if share:
        heads.attach_lm_head(target4.lm_head)
    choices = build_tree_choices(default_accuracies(3), 8)
    save_medusa(str(tmp_path / "src"), heads, choices, target4)
    out = tmp_path / "out"
    assert export_main([str(tmp_path / "src"), "--format", fmt, "--out", str(out), "--target", str(target_dir)]) == 0
    a = MedusaDrafter.from_pretrained(str(tmp_path / "src"), target4)
    b = MedusaDrafter.from_pretrained(str(out), target4)
    h = torch.randn(4, 32)
    with torch.no_grad():
        torch.testing.assert_close(a.heads(h), b.heads(h))
    assert a.tree_choices == b.tree_choices and b.heads.share_lm_head == share
    for prompt in PROMPTS[1:]:
        ra = generate(target4, prompt, drafter=a, max_new_tokens=12, eos_token_id=[])
        rb = generate(target4, prompt, drafter=b, max_new_tokens=12, eos_token_id=[])
        assert ra.tokens.equal(rb.tokens)
        assert [s.accepted for s in ra.stats.decode_steps] == [s.accepted for s in rb.stats.decode_steps]
    cfg = json.loads((out / "config.json").read_text())
    if fmt == "vllm":
        keys = set(load_file(str(out / "model.safetensors")))
        assert cfg["model_type"] == "medusa" and cfg["num_heads"] == 3 and cfg["num_hidden_layers"] == 1
        assert cfg["medusa_fc_bias"] is True and cfg["original_lm_head"] == share
        assert not [k for k in cfg if "num" in k and k not in ("num_heads", "num_hidden_layers")]
        heads_keys = {"lm_heads.0.weight"} if share else {f"lm_heads.{k}.weight" for k in range(3)}
        assert keys == {f"blocks.{k}.layers.0.{p}" for k in range(3) for p in ("weight", "bias")} | heads_keys
    else:
        keys = set(load_file(str(out / "medusa_lm_head.safetensors")))
        assert cfg["medusa_num_heads"] == 3 and cfg["medusa_num_layers"] == 1 and "base_model_name_or_path" in cfg
        own = set() if share else {f"{k}.1.weight" for k in range(3)}
        assert keys == {f"{k}.0.linear.{p}" for k in range(3) for p in ("weight", "bias")} | own
        assert (out / "medusa_lm_head.pt").exists()


def test_medusa_original_refuses_distinct_blocks(tmp_path, target4, capsys):
    target4.save_pretrained(str(tmp_path / "target"))
    heads = MedusaHeads(32, 64, num_heads=2, num_layers=2)
    with torch.no_grad():
        for p in heads.parameters():
            p.normal_(std=0.1)
    save_medusa(str(tmp_path / "src"), heads, [(0,)], target4)
    argv = [str(tmp_path / "src"), "--format", "medusa-original", "--out", str(tmp_path / "o"), "--target",
            str(tmp_path / "target")]
    assert export_main(argv) == 2
    assert "repeats one block" in capsys.readouterr().err


# ----------------------------------------------------------------------------- standalone


def test_standalone_export_checks_the_vocabulary(tmp_path, target4, capsys):
    target4.save_pretrained(str(tmp_path / "target"))
    small = tiny_target(layers=1, seed=5)
    small.save_pretrained(str(tmp_path / "draft"))
    out = tmp_path / "out"
    assert export_main([str(tmp_path / "draft"), "--format", "sglang", "--out", str(out), "--target",
                        str(tmp_path / "target")]) == 0
    reloaded = LlamaForCausalLM.from_pretrained(str(out))
    assert reloaded.config.vocab_size == 64 and detect(str(out)) == "standalone"
    tiny_target(layers=1, vocab=80).save_pretrained(str(tmp_path / "wrong"))
    assert export_main([str(tmp_path / "wrong"), "--format", "vllm", "--out", str(tmp_path / "o2"), "--target",
                        str(tmp_path / "target")]) == 2
    assert "vocabulary mismatch" in capsys.readouterr().err
