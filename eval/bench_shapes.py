"""Which target shape gives the default family a real LLM's cost ratios? (python eval/bench_shapes.py)

For each candidate shape (random Llama weights, the zoo's 8192-token vocabulary) this prints, at a
--context-token cache, interleaved and as medians of --reps runs:
  target    one-token decode step of the target (ms)
  verify8   an 8-token verify step, relative to `target`
  eagle3    one EAGLE-3 draft step (reference layout, one layer, --draft-vocab head), relative to `target`
  eagle2    one EAGLE-2 draft step (reference layout, the target's full LM head), relative to `target`
  train     one training step (forward + backward, batch 8 x 256) (s), what the pretraining budget buys
On a 7B-class model an EAGLE draft step is a few percent of a target step; the aim is at most 0.1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from draftkit.drafters.eagle_reference import make_draft  # noqa: E402

SHAPES = ["6x384", "12x320", "16x256", "20x256", "24x256", "24x192"]


def parse_shape(text: str) -> tuple[int, int]:
    try:
        layers, width = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"--shapes: {text!r} is not LAYERSxWIDTH (for example 24x256)") from None
    if layers < 4 or width % 64:
        raise SystemExit(f"--shapes: {text!r} needs at least 4 layers and a width divisible by 64")
    return layers, width


def make_target(layers: int, width: int, vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab, hidden_size=width, num_hidden_layers=layers,
                         num_attention_heads=width // 64, num_key_value_heads=width // 64,
                         intermediate_size=int(width * 8 / 3) // 32 * 32, max_position_embeddings=2048,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def timed(fn, reps: int) -> float:
    """Median seconds of fn() over reps runs (after one warm-up)."""
    fn()
    runs = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


@torch.no_grad()
def target_step(model, context: int, new: int):
    """fn() running a `new`-token forward over a `context`-token cache (the cache is cropped back after)."""
    ids = torch.randint(0, model.config.vocab_size, (1, context + new))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)

    def fn():
        model(input_ids=ids[:, context:], past_key_values=cache, use_cache=True, logits_to_keep=new)
        cache.crop(-new)
    return fn


@torch.no_grad()
def draft_step(target, draft, context: int):
    """fn() running one draft node: the draft layer over a `context`-entry cache, then its head."""
    h = target.config.hidden_size
    width = draft.fc.in_features if hasattr(draft, "fc") else 2 * h
    feats = torch.randn(1, context + 1, width if width != 2 * h else h)
    embeds = torch.randn(1, context + 1, h)
    cache = DynamicCache(config=draft.cache_config)
    draft(feats[:, :context], embeds[:, :context], cache=cache)
    head = target.get_output_embeddings()

    def fn():
        out = draft(feats[:, context:], embeds[:, context:], cache=cache)
        draft.draft_logits(out, head)
        cache.crop(-1)
    return fn


def train_step(model, batch: int = 8, seq: int = 256):
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))

    def fn():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
    return fn


def measure(shape: str, args) -> dict:
    layers, width = parse_shape(shape)
    target = make_target(layers, width, args.vocab)
    feats3 = [1, layers // 2, layers - 1]
    draft_ids = torch.arange(args.draft_vocab)
    eagle3 = make_draft(target, feats3, layout="reference", draft_ids=draft_ids).eval()
    eagle2 = make_draft(target, [-1], layout="reference").eval()
    fns = {"target": target_step(target, args.context, 1), "verify8": target_step(target, args.context, 8),
           "eagle3": draft_step(target, eagle3, args.context), "eagle2": draft_step(target, eagle2, args.context)}
    # interleave the measurements so that a slow moment hits every column alike
    samples = {k: [] for k in fns}
    for _ in range(args.reps):
        for k, fn in fns.items():
            samples[k].append(timed(fn, 1))
    med = {k: statistics.median(v) for k, v in samples.items()}
    params = sum(p.numel() for p in target.parameters())
    row = {"shape": shape, "params_m": params / 1e6, "target_ms": med["target"] * 1e3,
           "verify8": med["verify8"] / med["target"], "eagle3": med["eagle3"] / med["target"],
           "eagle2": med["eagle2"] / med["target"]}
    if args.train:
        target.train()
        row["train_s"] = timed(train_step(target), 2)
    return row


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=",".join(SHAPES),
                   help="comma-separated LAYERSxWIDTH target shapes (default: %(default)s)")
    p.add_argument("--context", type=int, default=256, help="tokens already in the cache (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=8192, help="target vocabulary size (default: %(default)s)")
    p.add_argument("--draft-vocab", type=int, default=2048,
                   help="EAGLE-3's reduced draft vocabulary (default: %(default)s)")
    p.add_argument("--reps", type=int, default=15, help="interleaved repetitions per figure (default: %(default)s)")
    p.add_argument("--no-train", dest="train", action="store_false",
                   help="skip the training-step timing (default: timed)")
    args = p.parse_args(argv)
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    for s in shapes:
        parse_shape(s)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, context {args.context}, "
          f"vocab {args.vocab}, EAGLE-3 draft vocab {args.draft_vocab}, medians of {args.reps}")
    print(f"{'shape':>8} {'params':>7} {'target ms':>9} {'verify8':>8} {'eagle3':>7} {'eagle2':>7} {'train s':>8}")
    for s in shapes:
        r = measure(s, args)
        train = f"{r['train_s']:8.2f}" if "train_s" in r else f"{'-':>8}"
        print(f"{r['shape']:>8} {r['params_m']:6.1f}M {r['target_ms']:9.2f} {r['verify8']:8.2f} "
              f"{r['eagle3']:7.3f} {r['eagle2']:7.3f} {train}", flush=True)


if __name__ == "__main__":
    main()
