"""Sliding-window, mixed and chunked attention layouts (verify/attention_layout.py): the verifier's hand-built
masks hide, per layer type, exactly what the model's own masks hide, so that every drafter's greedy output equals
plain decoding (and transformers' generate) on prompts and outputs several windows long, in batches of ragged
lengths, for best-of-N, on the static path, and under sampling."""
import pytest
import torch

import draftkit as dk
from draftkit.drafters.lookahead import LookaheadDrafter
from draftkit.drafters.suffix import SuffixDrafter
from draftkit.verify import attention_layout
from draftkit.verify.accept import Sampling
from draftkit.verify.attention_layout import AttentionLayout, UnsupportedAttention
from draftkit.verify.contract import DraftTree
from draftkit.verify.forward import Verifier
from draftkit.verify.tree_probe import tree_logits_agree
from draftkit.verify.packed import generate_packed
from tests.models import WINDOWED, config_model, tiny_model, windowed_model
from tests.test_lanes import lanes_of
from tests.test_packed import V, exact_pair, tv_bound, tv_of

torch.set_num_threads(1)
WINDOW = 8
PROMPT = (torch.arange(5 * WINDOW) * 5 + 3) % 61  # five windows long
NEW = 3 * WINDOW
DRAFTERS = ["eagle-tree", "standalone-tree", "medusa-tree", "lookahead", "suffix"]


@pytest.fixture(scope="module", params=WINDOWED)
def target(request):
    return windowed_model(request.param, WINDOW)


def tree_vs_branches(model) -> bool:
    """Does one verifier forward of a branched tree past the window give each branch's logits as the model's own
    forward of prefix + branch does?"""
    tree = DraftTree.from_lists([3, 4, 5, 6, 7], [-1, -1, 0, 1, 3]).validate()
    with torch.no_grad():
        logits, _ = Verifier(model, 64).forward(PROMPT, tree)
        ok = True
        for path, rows in (([0, 2], [1, 3]), ([1, 3, 4], [2, 4, 5])):
            branch = torch.cat([PROMPT, tree.tokens[path]])
            ref = model(input_ids=branch[None]).logits[0, -len(path) - 1:]
            ok &= tree_logits_agree(logits[[0, *rows]], ref, model.dtype)
    return ok


def test_tree_logits_equal_the_models_own_past_the_window(target):
    assert tree_vs_branches(target)


def test_the_full_mask_on_every_layer_is_caught(target, monkeypatch):
    """The test above can fail: with every layer given the full mask, the tree's logits leave the model's. (The
    verifier's one-time tree probe, which would catch the wrong mask first and remember it on the module's model,
    is passed over.)"""
    monkeypatch.setattr(AttentionLayout, "masks", lambda self, full, *a, **k: full)
    monkeypatch.setattr("draftkit.verify.forward.probe_tree_attention", lambda model: True)
    assert not tree_vs_branches(target)


def test_plain_decoding_equals_transformers_generate(target):
    ref = target.generate(PROMPT[None], attention_mask=torch.ones(1, PROMPT.numel(), dtype=torch.long),
                          max_new_tokens=NEW, do_sample=False, eos_token_id=None, pad_token_id=0)[0, PROMPT.numel():]
    assert dk.generate(target, PROMPT, None, NEW, eos_token_id=[]).tokens.tolist() == ref.tolist()


def drafted_tokens(target, kind: str, prompt, new: int, static: bool) -> list[int]:
    """One sequence decoded with a fresh drafter of `kind` (a random draft model where it needs one)."""
    make = {"lookahead": LookaheadDrafter, "suffix": lambda: SuffixDrafter(use_global=False)}.get(
        kind, lambda: lanes_of(kind, target, 1)[0])
    return generate_packed(target, [prompt], [make()], new, eos_token_id=[], budget="fixed", logprobs=False,
                           static=static).outputs[0].tokens.tolist()


@pytest.mark.parametrize("kind", DRAFTERS)
def test_every_drafter_equals_plain_decoding_past_the_window(target, kind):
    plain = dk.generate(target, PROMPT, None, NEW, eos_token_id=[]).tokens.tolist()
    for static in (False, True):
        assert drafted_tokens(target, kind, PROMPT, NEW, static) == plain, (kind, static)


def test_a_ragged_batch_past_the_window_equals_each_prompt_alone(target):
    prompts = [PROMPT, PROMPT[:3 * WINDOW + 3], PROMPT[5:2 * WINDOW]]
    alone = [dk.generate(target, p, None, NEW, eos_token_id=[]).tokens.tolist() for p in prompts]
    for static in (False, True):  # rows, then packed with static shapes
        outs = generate_packed(target, prompts, [LookaheadDrafter() for _ in prompts], NEW, eos_token_id=[],
                               budget="fixed", logprobs=False, static=static).outputs
        assert [o.tokens.tolist() for o in outs] == alone, static


def test_best_of_n_past_the_window_equals_greedy_lanes(target):
    """Best-of-N's lanes share the prompt's entries and interleave their own behind it: at a temperature that
    makes sampling greedy, each lane's output is plain greedy decoding's."""
    plain = dk.generate(target, PROMPT, None, NEW, eos_token_id=[]).tokens.tolist()
    res = dk.best_of_n(target, PROMPT, 3, drafter="lookahead", sampling=Sampling(temperature=1e-4),
                       max_new_tokens=NEW, eos_token_id=[], seed=0, budget="fixed")
    assert [s.tokens.tolist() for s in res.samples] == [plain] * 3


def test_sampling_past_the_window_follows_the_target():
    """The first two sampled tokens after a prompt longer than the window follow the model's own distribution."""
    target = windowed_model("gemma3", WINDOW, vocab=V, hidden=16, layers=2, seed=3)
    small = tiny_model("llama", vocab=V, hidden=16, layers=1, seed=4)
    prompt = PROMPT[:2 * WINDOW + 1] % V
    exact = exact_pair(target, prompt)
    n = 200
    pairs = []
    for i in range(n):
        out = generate_packed(target, [prompt], [lanes_of("standalone-tree", target, 1, draft=small)[0]], 3,
                              sampling=Sampling(temperature=1.0), eos_token_id=[], seed=i, budget="fixed",
                              logprobs=False).outputs[0]
        pairs.append(out.tokens.tolist()[:2])
    assert tv_of(pairs, exact) < tv_bound(exact, n)


def test_layouts_are_read_from_the_config():
    assert AttentionLayout.of(windowed_model("mistral", 6)).spans == {"sliding_attention": 6}
    mixed = AttentionLayout.of(windowed_model("gemma3", 6))
    assert mixed.spans == {"sliding_attention": 6, "full_attention": None} and mixed.mapping
    assert AttentionLayout.of(windowed_model("llama4", 6)).spans == {"chunked_attention": 6, "full_attention": None}
    assert AttentionLayout.of(tiny_model("llama")).plain
    assert AttentionLayout.of(tiny_model("qwen2")).plain  # a window field without use_sliding_window narrows nothing


def test_models_a_mask_cannot_serve_are_refused_in_one_line(monkeypatch):
    """A forward that needs a hand-built mask (a branched tree) is refused; plain decoding, on the model's own
    mask, still runs."""
    branched = DraftTree.from_lists([3, 4], [-1, -1]).validate()
    model = tiny_model("llama")
    model.config.alibi = True
    with pytest.raises(UnsupportedAttention, match="ALiBi"):
        Verifier(model, 64).forward(PROMPT, branched)
    assert dk.generate(model, PROMPT, None, 8, eos_token_id=[]).tokens.numel() == 8
    for impl in ("flash_attention_2", "flex_attention"):
        kernel = tiny_model("llama")
        kernel.config._attn_implementation = impl  # set by hand: no flash-attn kernels on this machine
        with pytest.raises(UnsupportedAttention, match=f'runs {impl}.*attn_implementation="sdpa"'):
            Verifier(kernel, 64).forward(PROMPT, branched)
    mixed = windowed_model("gemma3", WINDOW, seed=1)
    monkeypatch.setattr(attention_layout, "_module_source", lambda m: "")  # a forward that takes one mask only
    with pytest.raises(UnsupportedAttention, match="mixes attention layer types") as err:
        Verifier(mixed, 64).forward(PROMPT, branched)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("model_type, extra", [
    ("lfm2", {"num_hidden_layers": 2, "layer_types": ["conv", "full_attention"]}),  # short convolutions
    ("qwen3_next", {"layer_types": ["linear_attention", "full_attention"]}),  # gated delta-net
    ("mamba", {}),
    ("rwkv", {}),  # no layer types, no key/value cache argument
])
def test_models_with_recurrent_state_are_refused_before_any_forward(model_type, extra):
    """A rejected draft would leave a recurrent or convolution state advanced; plain decoding through draftkit's
    key/value cache would be wrong too (RWKV's ran without an error and differed from transformers' generate)."""
    model = config_model(model_type, **extra)
    forwards = []
    model.register_forward_pre_hook(lambda *a: forwards.append(1))
    with pytest.raises(UnsupportedAttention, match="recurrent state|takes no key/value cache") as err:
        dk.generate(model, PROMPT, None, 4, eos_token_id=[])
    assert "\n" not in str(err.value) and type(model).__name__ in str(err.value) and not forwards


def test_wrapped_models_keep_their_cache_and_are_not_refused():
    """The cache check reads the model class's forward: a PEFT model (LoRA not merged) is judged by the model it
    wraps, and a forward wrapped on the instance (hooks, profilers) changes nothing; both decode exactly."""
    from peft import LoraConfig, get_peft_model

    peft = get_peft_model(tiny_model("llama", seed=3), LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).eval()
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # an adapter that changes the output
    ref = peft.generate(input_ids=PROMPT[None], attention_mask=torch.ones(1, PROMPT.numel(), dtype=torch.long),
                        max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)[0, PROMPT.numel():]
    assert dk.generate(peft, PROMPT, LookaheadDrafter(), 12, eos_token_id=[]).tokens.tolist() == ref.tolist()
    model = tiny_model("llama", seed=3)
    real = model.forward
    model.forward = lambda *a, **k: real(*a, **k)
    assert dk.generate(model, PROMPT, None, 4, eos_token_id=[]).tokens.numel() == 4
