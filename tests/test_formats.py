"""The public EAGLE checkpoint formats (import), train/export.py (export, re-import, refusals), without downloads;
the reference drafts' own cache, reduced vocabulary and training are in tests/test_eagle_reference.py.

External checkpoints are written here by hand, from random tensors of the right shapes, with the key names and
config fields of ../shared/serving-formats.md (checked against the engines' source), and the imported draft is
compared with an independent re-implementation of the engines' computation (plain torch, no cache).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

import draftkit as dk
from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
from draftkit.drafters.eagle_reference import Eagle1Draft, Eagle3Draft, make_draft
from draftkit.drafters.reference_config import vocab_mapping
from draftkit.drafters.formats import detect, load_eagle_draft
from draftkit.drafters.medusa import MedusaHeads, save_medusa
from draftkit.train.export import main as export_main
from tests.formats_common import DRAFT_IDS, PROMPTS, ROOT, generate, rand, tiny_target, write_folder

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def target8():
    return tiny_target(layers=8)


@pytest.fixture(scope="module")
def target4():
    return tiny_target(layers=4, seed=1)


# ----------------------------------------------------------------------------- the engines' computation, by hand


def rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta=10000.0):
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    f = pos[:, None].float() * inv[None]
    cos, sin = torch.cat([f, f], -1).cos(), torch.cat([f, f], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(x, w, prefix, heads=4, kv=2):
    """Causal multi-head attention with rotary positions 0..T-1 over x (T, in)."""
    T = x.shape[0]
    q = (x @ w[prefix + "q_proj.weight"].T).view(T, heads, -1).transpose(0, 1)
    k = (x @ w[prefix + "k_proj.weight"].T).view(T, kv, -1).transpose(0, 1)
    v = (x @ w[prefix + "v_proj.weight"].T).view(T, kv, -1).transpose(0, 1)
    pos = torch.arange(T)
    q, k = rope(q, pos), rope(k, pos)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    s = q @ k.transpose(1, 2) / q.shape[-1] ** 0.5
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, -1)
    return o @ w[prefix + "o_proj.weight"].T


def mlp(x, w, prefix):
    g = x @ w[prefix + "gate_proj.weight"].T
    return (torch.nn.functional.silu(g) * (x @ w[prefix + "up_proj.weight"].T)) @ w[prefix + "down_proj.weight"].T


def eagle3_by_hand(w, feats, emb, norm_before_residual=False):
    """vLLM llama_eagle3.py / SGLang llama_eagle3.py / SafeAILab cnets.py: (pre-norm out, draft-vocab logits)."""
    g = feats @ w["fc.weight"].T if feats.shape[-1] != emb.shape[-1] else feats
    normed = rms(g, w["midlayer.hidden_norm.weight"])
    residual = normed if norm_before_residual else g
    x = torch.cat([rms(emb, w["midlayer.input_layernorm.weight"]), normed], -1)
    h = residual + attention(x, w, "midlayer.self_attn.")
    out = h + mlp(rms(h, w["midlayer.post_attention_layernorm.weight"]), w, "midlayer.mlp.")
    return out, rms(out, w["norm.weight"]) @ w["lm_head.weight"].T


def eagle1_by_hand(w, feats, emb):
    """vLLM llama_eagle.py / SafeAILab cnets1.py: layer 0 without input norm, hidden + residual, no final norm."""
    x = torch.cat([emb, feats], -1) @ w["fc.weight"].T + (w["fc.bias"] if "fc.bias" in w else 0)
    h = x + attention(x, w, "layers.0.self_attn.")
    return h + mlp(rms(h, w["layers.0.post_attention_layernorm.weight"]), w, "layers.0.mlp.")


# ----------------------------------------------------------------------------- external checkpoints, by hand


def llama_fields(target):
    c = target.config
    return {"model_type": "llama", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": 1, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.hidden_size // c.num_attention_heads,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}


def _norm(h, seed):
    return 1.0 + rand(h, seed=seed)


def layer_tensors(target, prefix, q_in, seed, input_norm=False, hidden_norm=False):
    c = target.config
    H, I, hd = c.hidden_size, c.intermediate_size, c.hidden_size // c.num_attention_heads
    w = {f"{prefix}self_attn.q_proj.weight": rand(c.num_attention_heads * hd, q_in, seed=seed),
         f"{prefix}self_attn.k_proj.weight": rand(c.num_key_value_heads * hd, q_in, seed=seed + 1),
         f"{prefix}self_attn.v_proj.weight": rand(c.num_key_value_heads * hd, q_in, seed=seed + 2),
         f"{prefix}self_attn.o_proj.weight": rand(H, c.num_attention_heads * hd, seed=seed + 3),
         f"{prefix}mlp.gate_proj.weight": rand(I, H, seed=seed + 4),
         f"{prefix}mlp.up_proj.weight": rand(I, H, seed=seed + 5),
         f"{prefix}mlp.down_proj.weight": rand(H, I, seed=seed + 6),
         f"{prefix}post_attention_layernorm.weight": _norm(H, seed + 7)}
    if input_norm:
        w[f"{prefix}input_layernorm.weight"] = _norm(H, seed + 8)
    if hidden_norm:
        w[f"{prefix}hidden_norm.weight"] = _norm(H, seed + 9)
    return w


def eagle3_tensors(target, draft_ids, seed=0, prefix="midlayer."):
    H, V = target.config.hidden_size, target.config.vocab_size
    d2t, t2d = vocab_mapping(draft_ids, V)
    w = {"fc.weight": rand(H, 3 * H, seed=seed), **layer_tensors(target, prefix, 2 * H, seed + 10, True, True),
         "norm.weight": _norm(H, seed + 30), "lm_head.weight": rand(d2t.numel(), H, seed=seed + 31) * 10,
         "d2t": d2t, "t2d": t2d}
    return w


def eagle1_tensors(target, seed=0, bias=False):
    H = target.config.hidden_size
    w = {"fc.weight": rand(H, 2 * H, seed=seed), **layer_tensors(target, "layers.0.", H, seed + 10)}
    if bias:
        w["fc.bias"] = rand(H, seed=seed + 40)
    return w


def public_eagle3(tmp_path, target, kind, draft_ids):
    """(folder, hidden-state indices the draft must read, norm_before_residual, its tensors in midlayer names)."""
    L = target.config.num_hidden_layers
    w = eagle3_tensors(target, draft_ids)
    base = llama_fields(target)
    if kind == "safeailab":  # yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: LlamaForCausalLM + draft_vocab_size, defaults
        cfg = {**base, "architectures": ["LlamaForCausalLM"], "draft_vocab_size": len(draft_ids)}
        return write_folder(tmp_path / kind, cfg, w), [2, L // 2, L - 3], False, w
    if kind == "specforge":  # SGLang ids: the output of layer j = hidden_states[j + 1]
        cfg = {**base, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": len(draft_ids),
               "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 6], "use_aux_hidden_state": True}}
        return write_folder(tmp_path / kind, cfg, w), [1, 4, 7], False, w
    # speculators: layers.0.* keys, top-level vLLM ids; norm_before_residual absent means true in vLLM
    spec = {k.replace("midlayer.", "layers.0."): v for k, v in w.items()}
    cfg = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
           "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                  "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                  "verifier": {"name_or_path": "tiny-target", "architectures": ["LlamaForCausalLM"]}},
           "transformer_layer_config": base, "draft_vocab_size": len(draft_ids),
           "eagle_aux_hidden_state_layer_ids": [1, 3, 6]}
    if kind == "speculators":
        cfg["norm_before_residual"] = False
    return write_folder(tmp_path / kind, cfg, spec), [1, 3, 6], kind != "speculators", w




@pytest.mark.parametrize("kind", ["safeailab", "specforge", "speculators", "speculators-nbr-absent"])
def test_public_eagle3_imports_and_computes_the_reference(tmp_path, target8, kind):
    path, layers, nbr, w = public_eagle3(tmp_path, target8, kind, DRAFT_IDS)
    assert detect(path) == ("speculators" if kind.startswith("speculators") else "eagle3")
    drafter = dk.make_drafter("eagle", target8, path, max_depth=4, max_nodes=8, top_k=3)
    draft = drafter.draft
    assert isinstance(draft, Eagle3Draft) and draft.config.feature_layers == layers
    assert draft.config.norm_before_residual == nbr and draft.draft_vocab == 32
    ids = torch.tensor([[3, 17, 42, 8, 8, 61, 0, 9, 12]])
    with torch.no_grad():
        hs = target8(input_ids=ids, output_hidden_states=True).hidden_states
        feats = torch.cat([hs[k][0] for k in layers], -1)[:-1]
        emb = target8.get_input_embeddings()(ids[0, 1:])
        out = draft(feats[None], emb[None])[0]
        ref_out, ref_small = eagle3_by_hand(w, feats, emb, nbr)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        logits = draft.logits(out, target8.lm_head)
        torch.testing.assert_close(logits[:, DRAFT_IDS], ref_small, atol=1e-4, rtol=1e-4)
        assert torch.isinf(logits[:, 1::2]).all()
        # a later step: the draft's own PRE-norm output goes back in as the feature (no fc)
        out2 = draft(out[None], emb[None])[0]
        torch.testing.assert_close(out2, eagle3_by_hand(w, out, emb, nbr)[0], atol=1e-4, rtol=1e-4)
    for prompt in PROMPTS:
        ref = generate(target8, prompt, max_new_tokens=12, eos_token_id=[])
        assert generate(target8, prompt, drafter=drafter, max_new_tokens=12, eos_token_id=[]).tokens.equal(ref.tokens)


@pytest.mark.parametrize("kind", ["safeailab-bin", "vllm", "sglang"])
def test_public_eagle1_imports_and_computes_the_reference(tmp_path, target4, kind):
    bias = kind != "vllm"
    w = eagle1_tensors(target4, bias=bias)
    base = llama_fields(target4)
    if kind == "safeailab-bin":  # original EAGLE-1: pytorch_model.bin, fc.bias, the target's embeddings inside
        w_file = {**w, "embed_tokens.weight": target4.get_input_embeddings().weight.detach().clone()}
        path = write_folder(tmp_path / kind, {**base, "architectures": ["LlamaForCausalLM"]}, w_file,
                            "pytorch_model.bin")
    elif kind == "vllm":
        path = write_folder(tmp_path / kind, {**base, "architectures": ["LlamaForCausalLM"]}, w)
    else:  # SGLang's layout: LlamaForCausalLMEagle, fc built with a bias
        path = write_folder(tmp_path / kind, {**base, "architectures": ["LlamaForCausalLMEagle"]}, w)
    drafter = EagleDrafter.from_pretrained(path, target4, max_depth=4, top_k=2, max_nodes=8)
    draft = drafter.draft
    assert isinstance(draft, Eagle1Draft) and draft.config.feature_layers == [4] and draft.config.fc_bias == bias
    assert not any("input_layernorm" in k or k.startswith("norm") or "lm_head" in k for k in draft.state_dict())
    ids = torch.tensor([[3, 17, 42, 8, 8, 61, 0, 9, 12]])
    with torch.no_grad():
        feats = target4(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, :-1]  # after the final norm
        emb = target4.get_input_embeddings()(ids[0, 1:])
        torch.testing.assert_close(draft(feats[None], emb[None])[0], eagle1_by_hand(w, feats, emb),
                                   atol=1e-4, rtol=1e-4)
    for prompt in PROMPTS:
        ref = generate(target4, prompt, max_new_tokens=12, eos_token_id=[])
        assert generate(target4, prompt, drafter=drafter, max_new_tokens=12, eos_token_id=[]).tokens.equal(ref.tokens)


def test_public_checkpoint_for_another_target_is_a_clear_error(tmp_path, target8):
    path, *_ = public_eagle3(tmp_path, target8, "specforge", DRAFT_IDS)
    for other, what in ((tiny_target(layers=8, hidden=48, name="other-B"), "hidden size 48"),
                        (tiny_target(layers=8, vocab=80, name="other-B"), "vocabulary 80"),
                        (tiny_target(layers=4, name="other-B"), "4 layers")):
        with pytest.raises(ValueError) as err:
            EagleDrafter.from_pretrained(path, other)
        msg = str(err.value)
        assert "\n" not in msg and "other-B" in msg and what in msg and "specforge" in msg, msg


# ----------------------------------------------------------------------------- export, then import again


class Recorder(EagleDrafter):
    def propose(self, state):
        tree = super().propose(state)
        self.trees = getattr(self, "trees", [])
        self.trees.append((tree.tokens.tolist(), [int(p) for p in tree.parents.tolist()]))
        return tree


def _run(drafter, target, sampling=None):
    drafter.trees = []
    outs = [generate(target, p, drafter=drafter, max_new_tokens=16, eos_token_id=[], sampling=sampling, seed=3).tokens
            for p in PROMPTS[1:]]
    return [o.tolist() for o in outs], drafter.trees


@pytest.mark.parametrize("case", ["eagle3-vllm", "eagle3-sglang", "eagle3-speculators", "eagle1-vllm", "eagle1-sglang",
                                  "eagle2-reduced-sglang"])
def test_export_reimport_same_output_and_trees(tmp_path, target8, case):
    kind, fmt = case.rsplit("-", 1)
    torch.manual_seed(0)
    layers = [2, 4, 6] if kind == "eagle3" else None
    ids = DRAFT_IDS if kind in ("eagle3", "eagle2-reduced") else None
    draft = make_draft(target8, layers, "reference", ids)
    with torch.no_grad():  # a peaked draft, so that the trees are deep and the runs compare many tokens
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    src = tmp_path / "draft"
    draft.save_pretrained(str(src))
    assert detect(str(src)) == "draftkit-eagle-reference"
    out = tmp_path / fmt
    assert export_main([str(src), "--format", fmt, "--out", str(out)]) == 0
    flags = dict(max_depth=4, max_nodes=10, top_k=3)
    before = _run(Recorder(target8, load_eagle_draft(str(src), target8), **flags), target8)
    after = _run(Recorder.from_pretrained(str(out), target8, **flags), target8)
    assert before == after
    assert sum(len(t) for t, _ in before[1]) > 10
    plain = [generate(target8, p, max_new_tokens=16, eos_token_id=[]).tokens.tolist() for p in PROMPTS[1:]]
    assert before[0] == plain
    files = load_file(str(out / "model.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    check_export_layout(kind, fmt, files, cfg, target8)
    with pytest.raises(ValueError, match="8 layers.*other-B has .*7 layers"):  # recorded in the export
        EagleDrafter.from_pretrained(str(out), tiny_target(layers=7, name="other-B"))


def check_export_layout(kind, fmt, files, cfg, target):
    """The exported keys and config fields are exactly what ../shared/serving-formats.md lists."""
    H, V = target.config.hidden_size, target.config.vocab_size
    keys = set(files)
    assert "bias" not in cfg and not any(k.startswith("embed_tokens") for k in keys)
    if kind == "eagle3":
        layer = "layers.0." if fmt == "speculators" else "midlayer."
        want = {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
            layer + k for k in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                                "mlp.down_proj.weight", "input_layernorm.weight", "hidden_norm.weight",
                                "post_attention_layernorm.weight")}
        assert keys == want
        assert tuple(files["fc.weight"].shape) == (H, 3 * H) and tuple(files["lm_head.weight"].shape) == (32, H)
        assert files["d2t"].dtype == torch.int64 and files["t2d"].dtype == torch.bool
        assert (torch.arange(32) + files["d2t"]).tolist() == DRAFT_IDS.tolist() and int(files["t2d"].sum()) == 32
        assert tuple(files[layer + "self_attn.q_proj.weight"].shape)[1] == 2 * H
        if fmt == "speculators":
            assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
            assert cfg["norm_before_residual"] is False and cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]
            assert cfg["draft_vocab_size"] == 32 and cfg["transformer_layer_config"]["vocab_size"] == V
            sc = cfg["speculators_config"]
            assert sc["algorithm"] == "eagle3" and sc["proposal_methods"][0]["proposal_type"] == "greedy"
            assert sc["verifier"]["name_or_path"] == "tiny-target" and sc["default_proposal_method"] == "greedy"
        else:
            assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
            assert cfg["num_hidden_layers"] == 1 and cfg["vocab_size"] == V and cfg["draft_vocab_size"] == 32
            assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False and cfg["mlp_bias"] is False
            assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 6]
            assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 5]
            assert cfg["max_position_embeddings"] == target.config.max_position_embeddings
            assert not any(cfg.get(k) for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"))
        return
    want = {"fc.weight"} | {"layers.0." + k for k in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight")}
    if fmt == "vllm":
        assert keys == want and cfg["architectures"] == ["LlamaForCausalLM"]
    else:
        assert keys == want | {"fc.bias"} and not files["fc.bias"].any()
        assert cfg["architectures"] == ["LlamaForCausalLMEagle"]
    assert tuple(files["fc.weight"].shape) == (H, 2 * H) and cfg["num_hidden_layers"] == 1


# ----------------------------------------------------------------------------- refusals


def test_export_refusals_are_one_line(tmp_path, target8, capsys):
    torch.manual_seed(0)
    EagleDraftModel.from_target(target8).save_pretrained(str(tmp_path / "dk"))
    make_draft(target8, None, "reference").save_pretrained(str(tmp_path / "e1"))
    med = tmp_path / "med"
    heads = MedusaHeads(32, 64, num_heads=2, num_layers=1)
    save_medusa(str(med), heads, [(0,), (0, 0)], target8)
    cases = [([str(tmp_path / "dk"), "--format", "vllm"], "draftkit's own layout"),
             ([str(tmp_path / "dk"), "--format", "sglang"], "--layout reference"),
             ([str(tmp_path / "e1"), "--format", "speculators"], "only EAGLE-3"),
             ([str(tmp_path / "e1"), "--format", "medusa-original"], "cannot hold an EAGLE draft"),
             ([str(med), "--format", "sglang"], "SGLang has no Medusa"),
             ([str(med), "--format", "speculators"], "cannot hold Medusa")]
    for i, (argv, why) in enumerate(cases):
        assert export_main(argv + ["--out", str(tmp_path / f"out{i}")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("export: error: ") and why in err, err
        assert not (tmp_path / f"out{i}").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert export_main([str(tmp_path / "e1"), "--format", "vllm", "--out", str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train", "export.py"), str(tmp_path / "dk"), "--format",
                           "vllm", "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "retrain" in proc.stderr, proc.stderr
    helped = subprocess.run([sys.executable, os.path.join(ROOT, "train", "export.py"), "--help"], capture_output=True,
                            text=True, cwd=ROOT)
    for flag in ("--format", "--out", "--target", "--dtype", "--speculative-tokens", "--force", "default"):
        assert flag in helped.stdout


@pytest.mark.parametrize("name, fmt", [("eagle", "vllm"), ("eagle", "sglang"), ("eagle3", "vllm"),
                                       ("eagle3", "speculators"), ("peagle", "vllm"), ("dflash", "vllm"),
                                       ("dflash", "speculators")])
def test_an_export_keeps_the_drafts_own_decoding_settings(tmp_path, name, fmt):
    # the shipped drafts carry a fitted tree temperature and an attention window (docs/zoo.md); an export that
    # dropped them loaded back with the defaults and drafted other trees than its source
    from draftkit.drafters.dflash_formats import export_dflash, load_dflash_draft
    from draftkit.drafters.exporters import export_eagle
    from draftkit.drafters.formats import DECODING_FIELDS
    from draftkit.models import load_model, resolve

    src, target = resolve(None, name), load_model(None)
    if name == "dflash":
        draft = load_dflash_draft(src, target)
        export_dflash(draft, fmt, str(tmp_path), target)
        back = load_dflash_draft(str(tmp_path), target)
    else:
        draft = load_eagle_draft(src, target)
        export_eagle(draft, fmt, str(tmp_path))
        back = load_eagle_draft(str(tmp_path), target)
    settings = {k: getattr(draft.config, k) for k in DECODING_FIELDS}
    assert settings["tree_temperature"] != 1.0 and settings["attention_window"] > 0  # not the defaults
    assert {k: getattr(back.config, k) for k in DECODING_FIELDS} == settings
