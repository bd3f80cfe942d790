"""A prepared check of draftkit's decoding core on one GPU, written to one JSON file.

    python eval/gpu_check.py --out gpu_check.json                        # one GPU: under 8 minutes
    python eval/gpu_check.py --device cpu --quick --out /tmp/check.json  # the same path, small, on a CPU

Needs only torch, transformers, accelerate, peft and safetensors (nothing here imports datasets, wandb,
matplotlib or scipy). Sections, each written to --out as soon as it finishes:

  env                 torch / transformers versions, the device
  zoo-<dtype>         the shipped family (zoo/) on the device: every drafter greedy against plain decoding
                      (identical tokens, fixed caps), tau, host transfers and waits per step (eval/syncs.py), tokens/s
                      of plain decoding and of every drafter under the auto budget, the tree-attention probe
  llama1b-<dtype>     a randomly initialised Llama of about 1B parameters built from a config, with lookahead,
                      suffix, a random standalone draft and a random EAGLE draft: the same measurements
  sampled-<dtype>     the sampled statistical check for a tree drafter on the device: the first two sampled
                      tokens through a standalone top-k tree against the exact target distribution (TV distance
                      under a bound simulated from exact samples)
  hf-<dtype>          transformers' generate on the 1B model, eager and with a static cache and a compiled
                      forward (the fastest plain decoding a user can have), tokens/s and identical output
  compile-<dtype>     draftkit with compile=True (the compiled static-shaped verify forward, every bucket of the
                      run compiled first: compile_s) for plain decoding, a standalone draft's tree, an EAGLE tree,
                      a DFlash tree and Medusa heads' tree, the drafts' own forwards (and heads) compiled too
                      (compile_draft): identical output
                      against compiled plain decoding, tokens/s and speedups over it

dtypes: fp32 and bf16. A rerun with the same --out skips the sections already "ok" (resumable); --redo NAME
runs one again. A section that fails records its error and the next one runs; sections that would start after
--budget-s are recorded as skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import draftkit as dk  # noqa: E402
from draftkit.eval.check_file import Check  # noqa: E402
from draftkit.eval.target_checks import torch_dtype  # noqa: E402
from draftkit.eval.divergence import first_divergence  # noqa: E402
from draftkit.eval.syncs import DeviceShim, SyncCounter  # noqa: E402
from draftkit.verify.tree_probe import probe_tree_attention  # noqa: E402
from draftkit.verify.precision import set_tf32, tf32_matmul  # noqa: E402
from draftkit.verify.timing import synchronize  # noqa: E402

DTYPES = ("fp32", "bf16")  # eval/target_checks.torch_dtype names them
PROMPTS_FILE = Path(__file__).resolve().parent / "prompts" / "other_code.jsonl"


# ----------------------------------------------------------------------------- models and prompts


def random_llama(device, dtype, quick: bool, vocab: int = 32000, seed: int = 0):
    """About 1.0B parameters (20 x 2048, GQA 32/4, MLP 5632), or a 4 x 256 model with --quick."""
    from transformers import LlamaConfig, LlamaForCausalLM

    size = dict(hidden_size=256, num_hidden_layers=4, intermediate_size=704, num_attention_heads=8,
                num_key_value_heads=2) if quick else \
        dict(hidden_size=2048, num_hidden_layers=20, intermediate_size=5632, num_attention_heads=32,
             num_key_value_heads=4)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, max_position_embeddings=4096, **size)
    with torch.device(device):  # initialised where it runs: no 4 GB copy from the host
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def small_llama(target, device, dtype, seed: int = 1):
    """A random 2 x 256 draft with the target's vocabulary (a standalone draft that costs little)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=target.config.vocab_size, hidden_size=256, num_hidden_layers=2,
                      intermediate_size=704, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=4096)
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    return model.to(dtype).eval()


def code_prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """The first n held-out code prompts (eval/prompts/other_code.jsonl), cut to their last `length` tokens."""
    out = []
    for line in PROMPTS_FILE.read_text().splitlines():
        ids = tokenizer(json.loads(line)["prompt"])["input_ids"]
        if len(ids) >= length:
            out.append(ids[-length:])
        if len(out) == n:
            break
    return out


def repetitive_prompts(vocab: int, n: int, length: int) -> list[list[int]]:
    """Random tokens with repeats (a random model has no text to continue; repeats give n-grams to find)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        motif = torch.randint(0, vocab, (max(4, length // 4),), generator=g).tolist()
        out.append((motif * 4)[:length])
    return out


# ----------------------------------------------------------------------------- measurements


def run_method(target, ids: list[int], drafter, n: int, budget: str, **kwargs):
    out = dk.generate(target, torch.tensor(ids, device=target.device), drafter, max_new_tokens=n, eos_token_id=[],
                      budget=budget, **kwargs)
    return out.tokens.tolist(), out.stats


def family_report(target, makers: dict, prompts: list[list[int]], n: int, repeats: int) -> dict:
    """Per drafter: greedy identical to plain (fixed caps), tau, transfers per step, tokens/s (auto budget)."""
    device = target.device
    plain = [run_method(target, ids, None, n, "fixed")[0] for ids in prompts]
    report = {"probe_tree_attention": probe_tree_attention(target), "drafters": {}}
    for name, make in makers.items():
        drafter = make()
        outs = [run_method(target, ids, drafter, n, "fixed") for ids in prompts]
        same = sum(o[0] == p for o, p in zip(outs, plain))
        first_diff = [first_divergence(target, ids, p, o[0]) for ids, o, p in zip(prompts, outs, plain)]
        mismatches = sum(d is not None and not d["near_tie"] for d in first_diff)
        with SyncCounter(drafter, device_only=device.type != "cpu") as counter:
            _, stats = run_method(target, prompts[0], drafter, n, "fixed")
        taus = [o[1].tau for o in outs]
        report["drafters"][name] = {"identical": f"{same}/{len(prompts)}", "first_divergence": first_diff,
                                    "mismatches": mismatches,  # differences that are not near-ties: bugs
                                    "tau": statistics.mean(taus), "syncs_per_step": counter.per_step(len(stats.steps)),
                                    "waits_per_step": waits_per_step(target, prompts[0], drafter, n)}
    report["tokens_per_s"] = tokens_per_s(target, {"plain": lambda: None, **makers}, prompts, n, repeats)
    plain_tps = report["tokens_per_s"]["plain"]
    report["speedup"] = {k: v / plain_tps for k, v in report["tokens_per_s"].items()}
    return report


def waits_per_step(target, ids: list[int], drafter, n: int) -> float:
    """Waits of the host for the device per decoding step, past what a run pays once (runs of n and 2n tokens,
    the difference over the difference in steps): on a GPU the reads of device tensors and the synchronizes; on
    a CPU the device code path through eval/syncs.DeviceShim."""
    runs = []
    for new in (n, 2 * n):
        if target.device.type == "cpu":
            with DeviceShim(drafter) as shim:
                _, stats = run_method(target, ids, drafter, new, "fixed")
            waits = sum(shim.waits.values())
        else:
            with SyncCounter(drafter, device_only=True) as counter:
                _, stats = run_method(target, ids, drafter, new, "fixed")
            waits = sum(v for k, v in counter.counts.items() if k.endswith("read")) + counter.counts["synchronize"]
        runs.append((len(stats.steps), waits))
    (s1, w1), (s2, w2) = runs
    return (w2 - w1) / max(s2 - s1, 1)


def tokens_per_s(target, makers: dict, prompts, n: int, repeats: int, **kwargs) -> dict[str, float]:
    """Medians over repeats of tokens / second per method, methods interleaved; one untimed warm-up each
    (the auto budget measures its cost profile there)."""
    drafters = {name: make() for name, make in makers.items()}
    for name, d in drafters.items():
        dk.generate(target, torch.tensor(prompts[0], device=target.device), d, max_new_tokens=8, eos_token_id=[],
                    **kwargs)
    rates = {name: [] for name in drafters}
    for _ in range(repeats):
        for name, d in drafters.items():
            synchronize(target.device)
            t0, made = time.perf_counter(), 0
            for ids in prompts:
                out = dk.generate(target, torch.tensor(ids, device=target.device), d, max_new_tokens=n,
                                  eos_token_id=[], **kwargs)
                made += out.tokens.numel()
            synchronize(target.device)
            rates[name].append(made / (time.perf_counter() - t0))
    return {name: statistics.median(r) for name, r in rates.items()}


def sampled_check(device, dtype, n: int) -> dict:
    """First two sampled tokens through a standalone top-k tree (vocabulary 8) against the exact distribution."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftkit.drafters.standalone import StandaloneDrafter

    V = 8

    def tiny(seed):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=V, hidden_size=16, num_hidden_layers=1, intermediate_size=32,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        return LlamaForCausalLM(cfg).to(device, dtype).eval()

    target, small = tiny(3), tiny(4)
    prompt = torch.tensor([1, 2, 3, 1, 2], device=device)
    with torch.no_grad():
        p1 = target(input_ids=prompt[None]).logits[0, -1].float().softmax(-1)
        seqs = torch.cat([prompt.expand(V, -1), torch.arange(V, device=device)[:, None]], 1)
        p2 = target(input_ids=seqs).logits[:, -1].float().softmax(-1)
    exact = (p1[:, None] * p2).flatten().cpu()
    counts, accepted = torch.zeros(V * V), 0
    drafter = StandaloneDrafter(small, max_depth=2, top_k=3, max_nodes=6)  # its draws: the run's seed, salted
    for i in range(n):
        out = dk.generate(target, prompt, drafter, max_new_tokens=3, eos_token_id=[],
                          sampling=dk.Sampling(temperature=1.0), seed=i, budget="fixed")
        a, b = out.tokens.tolist()[:2]
        counts[a * V + b] += 1
        accepted += sum(s.accepted for s in out.stats.decode_steps)
    tv = 0.5 * float((counts / n - exact).abs().sum())
    draws = torch.multinomial(exact.expand(2000, -1), n, replacement=True, generator=torch.Generator().manual_seed(0))
    sims = torch.zeros(2000, V * V).scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float))
    bound = float(torch.quantile(0.5 * (sims / n - exact).abs().sum(1), 0.999))
    # bf16 rounds p itself: the exact reference is the model's own (rounded) distribution, so the bound holds
    return {"samples": n, "tv": tv, "tv_bound_0.999": bound, "passed": tv < bound, "accepted_draft_tokens": accepted}


def fresh_compile_state() -> None:
    """Forget every compiled graph before a section compiles its own model: graphs of the earlier sections' models
    sit on the same transformers code objects, and past dynamo's limit of graphs per code object a compiled call
    falls back to eager without an error (seen: transformers' static-cache forward in the second dtype)."""
    torch._dynamo.reset()


def hf_generate_speeds(target, prompts, n: int, repeats: int) -> dict:
    """transformers' generate: eager (dynamic cache) and static cache + torch.compile'd forward."""
    def run(ids, **kw):
        x = torch.tensor([ids], device=target.device)
        with torch.no_grad():
            return target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                                   do_sample=False, pad_token_id=0, **kw)[0, len(ids):].tolist()

    fresh_compile_state()
    eager_forward = target.forward
    compiled = torch.compile(eager_forward, dynamic=False)
    report = {}
    try:
        eager = [run(ids) for ids in prompts]
        t0 = time.perf_counter()
        target.forward = compiled
        static = [run(ids, cache_implementation="static") for ids in prompts]  # compiles here
        report["compile_s"] = time.perf_counter() - t0
        report["identical"] = f"{sum(a == b for a, b in zip(eager, static))}/{len(prompts)}"
        ways = {"eager": (eager_forward, {}), "static_compiled": (compiled, {"cache_implementation": "static"})}
        rates = {name: [] for name in ways}
        for _ in range(repeats):
            for name, (forward, kw) in ways.items():
                target.forward = forward
                synchronize(target.device)
                t0 = time.perf_counter()
                for ids in prompts:
                    run(ids, **kw)
                synchronize(target.device)
                rates[name].append(len(prompts) * n / (time.perf_counter() - t0))
        report["tokens_per_s"] = {k: statistics.median(v) for k, v in rates.items()}
    finally:
        target.forward = eager_forward
    return report


# ----------------------------------------------------------------------------- sections


def env(device) -> dict:
    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
            "device": str(device), "threads": torch.get_num_threads(), "tf32_matmul": tf32_matmul()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        info["memory_gb"] = torch.cuda.get_device_properties(device).total_memory / 2 ** 30
    return info


def zoo_section(device, dtype, args) -> dict:
    target, tok = dk.load_target(dtype=dtype)
    target = target.to(device)
    makers = {name: (lambda name=name: dk.make_drafter(name, target, tokenizer=tok)) for name in dk.DRAFTERS}
    prompts = code_prompts(tok, args.prompts, args.prompt_len)
    return family_report(target, makers, prompts, args.max_new_tokens, args.repeats)


def llama_section(device, dtype, args) -> dict:
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
    from draftkit.drafters.lookahead import LookaheadDrafter
    from draftkit.drafters.standalone import StandaloneDrafter
    from draftkit.drafters.suffix import SuffixDrafter

    target = random_llama(device, dtype, args.quick)
    small = small_llama(target, device, dtype)
    eagle = EagleDraftModel.from_target(target).to(device)
    makers = {"lookahead": LookaheadDrafter, "suffix": lambda: SuffixDrafter(use_global=False),
              "standalone": lambda: StandaloneDrafter(small, max_depth=4, top_k=2, max_nodes=8),
              "eagle": lambda: EagleDrafter(target, eagle, max_depth=4, top_k=2, max_nodes=8)}
    prompts = repetitive_prompts(target.config.vocab_size, args.prompts, args.prompt_len)
    report = family_report(target, makers, prompts, args.max_new_tokens, args.repeats)
    report["params"] = sum(p.numel() for p in target.parameters())
    return report


def hf_section(device, dtype, args) -> dict:
    target = random_llama(device, dtype, args.quick)
    prompts = repetitive_prompts(target.config.vocab_size, args.prompts, args.prompt_len)
    return hf_generate_speeds(target, prompts, args.max_new_tokens, args.repeats)


def compile_section(device, dtype, args) -> dict:
    """compile=True: the compiled verify forward (every bucket a step of up to 8 rows meets, with and without
    hidden states) and the drafts' own compiled forwards (compile_draft: a random standalone draft's top-k tree, a
    random EAGLE draft's tree, a random DFlash draft's on its static context buffer and Medusa heads on the target's
    LM head, each draft's graphs compiled when it is first given a prompt). Greedy output
    against compiled plain decoding, the seconds spent compiling, tokens/s and speedups over compiled plain
    decoding."""
    from draftkit.drafters.dflash import DFlashDrafter, make_dflash_draft
    from draftkit.drafters.eagle import EagleDraftModel, EagleDrafter
    from draftkit.drafters.medusa import MedusaDrafter, MedusaHeads
    from draftkit.drafters.medusa_tree import build_tree_choices, default_accuracies
    from draftkit.drafters.standalone import StandaloneDrafter
    from draftkit.verify.forward import warm_compiled
    from draftkit.verify.packed import static_capacity

    fresh_compile_state()
    target = random_llama(device, dtype, args.quick)
    small = small_llama(target, device, dtype)
    eagle = EagleDraftModel.from_target(target).to(device)
    dflash = make_dflash_draft(target, block_size=4, mask_token_id=0, draft_layers=1)
    cfg = target.config
    heads = MedusaHeads(cfg.hidden_size, cfg.vocab_size, 3, share_lm_head=True).to(device, dtype)
    heads.attach_lm_head(target.get_output_embeddings())
    # trees of up to 6 nodes: verify steps of up to 8 rows (buckets 1, 2, 4, 8), so the compiles fit the check
    makers = {"standalone": lambda: StandaloneDrafter(small, max_depth=3, top_k=2, max_nodes=6, compile_draft=True),
              "eagle": lambda: EagleDrafter(target, eagle, max_depth=3, top_k=2, max_nodes=6, compile_draft=True),
              "dflash": lambda: DFlashDrafter(target, dflash, max_depth=3, top_k=2, max_nodes=6, compile_draft=True),
              "medusa": lambda: MedusaDrafter(target, heads, build_tree_choices(default_accuracies(3), 6),
                                              compile_draft=True)}
    prompts = repetitive_prompts(target.config.vocab_size, args.prompts, args.prompt_len)
    t0 = time.perf_counter()  # every bucket of this run, on a buffer as large as the longest prompt needs
    buckets = warm_compiled(target, static_capacity(max(map(len, prompts)), 1, args.max_new_tokens, 6), 8,
                            (False, True))
    report = {"compile_s": time.perf_counter() - t0, "buckets": buckets, "drafters": {}}
    run = lambda ids, d: run_method(target, ids, d, args.max_new_tokens, "fixed", compile=True)[0]  # noqa: E731
    plain = [run(ids, None) for ids in prompts]
    for name, make in makers.items():
        drafter, t0 = make(), time.perf_counter()
        drafter.reset(torch.tensor(prompts[0], device=device))  # its draft's buckets compile here
        outs = [run(ids, drafter) for ids in prompts]
        diffs = [first_divergence(target, ids, p, o) for ids, o, p in zip(prompts, outs, plain)]
        report["drafters"][name] = {"draft_compile_s": time.perf_counter() - t0,
                                    "identical": f"{sum(o == p for o, p in zip(outs, plain))}/{len(prompts)}",
                                    "first_divergence": diffs,
                                    "mismatches": sum(d is not None and not d["near_tie"] for d in diffs)}
    report["tokens_per_s"] = tokens_per_s(target, {"plain": lambda: None, **makers}, prompts, args.max_new_tokens,
                                          args.repeats, compile=True)
    report["speedup"] = {k: v / report["tokens_per_s"]["plain"] for k, v in report["tokens_per_s"].items()}
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check.json", help="the JSON file to write (and to resume from) "
                    "(default: gpu_check.json)")
    ap.add_argument("--device", default="cuda", help="device to check (default: cuda)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated, of fp32 and bf16 (default: fp32,bf16)")
    ap.add_argument("--quick", action="store_true", help="small sizes: a 4 x 256 Llama instead of the 1B one, "
                    "2 prompts, 16 new tokens, 150 sampled runs (proves the path end to end on a CPU)")
    ap.add_argument("--tf32", choices=("off", "on", "keep"), default="off",
                    help="float32 matrix products on the GPU: off (IEEE fp32), on (TF32) or keep (as torch left "
                         "them); recorded in the env section (default: %(default)s)")
    ap.add_argument("--redo", default="", help="comma-separated section names to run again even if ok (env, "
                    "zoo-, llama1b-, sampled-, hf- and compile- each dtype, e.g. compile-bf16) (default: none)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="no section starts after this many seconds "
                    "(default: 450)")
    args = ap.parse_args(argv)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad or not dtypes:
        ap.error(f"--dtypes takes fp32 and/or bf16, got {args.dtypes!r}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        ap.error(f"--device {args.device!r} is not a torch device")
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda but torch sees no CUDA device (use --device cpu --quick to try the path here)")
    if args.budget_s <= 0:
        ap.error("--budget-s must be > 0")
    args.prompts, args.prompt_len = (2, 64) if args.quick else (4, 192)
    args.max_new_tokens, args.repeats = (16, 1) if args.quick else (96, 2)
    samples = 150 if args.quick else 1500
    set_tf32(args.tf32)

    names = ["env"] + [f"{kind}-{d}" for d in dtypes for kind in ("zoo", "llama1b", "sampled", "hf", "compile")]
    redo = {s.strip() for s in args.redo.split(",") if s.strip()}
    if redo - set(names):
        ap.error(f"--redo: no section {', '.join(sorted(redo - set(names)))} in this run; sections: {', '.join(names)}")
    config = {"device": device.type, "quick": args.quick, "tf32": args.tf32}
    check = Check(Path(args.out), redo, args.budget_s, config)
    try:
        run_sections(check, device, dtypes, args, samples)
    except KeyboardInterrupt:
        print(f"interrupted; the sections finished so far are in {args.out}, and the same command runs the rest",
              file=sys.stderr)
        return 130
    failed = [k for k, v in check.data["sections"].items() if v["status"] == "failed"]
    lossy = [f"{k}/{d}" for k, v in check.data["sections"].items() if v["status"] == "ok"
             for d, r in ((v.get("result") or {}).get("drafters") or {}).items() if r.get("mismatches")]
    print(f"wrote {args.out}; failed sections: {', '.join(failed) or 'none'}; outputs that differ from plain decoding "
          f"other than at near-ties: {', '.join(lossy) or 'none'}")
    return 1 if lossy else 0


def run_sections(check: Check, device, dtypes: list[str], args, samples: int) -> None:
    check.section("env", lambda: env(device))
    for name in dtypes:
        dtype = torch_dtype(name)
        check.section(f"zoo-{name}", lambda: zoo_section(device, dtype, args))
        check.section(f"llama1b-{name}", lambda: llama_section(device, dtype, args))
        check.section(f"sampled-{name}", lambda: sampled_check(device, dtype, samples))
        check.section(f"hf-{name}", lambda: hf_section(device, dtype, args))
        check.section(f"compile-{name}", lambda: compile_section(device, dtype, args))


if __name__ == "__main__":
    sys.exit(main())
