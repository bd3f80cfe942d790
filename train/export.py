"""Export a drafter to the folder a serving engine loads as it is.

    python train/export.py runs/eagle3-ref/final --format vllm --out exports/eagle3    # vLLM and SGLang
    python train/export.py runs/eagle2-ref/final --format sglang --out exports/eagle2-sglang
    python train/export.py runs/eagle3-ref/final --format speculators --out exports/eagle3-spec
    python train/export.py zoo/medusa --format vllm --out exports/medusa-vllm
    python train/export.py zoo/medusa --format medusa-original --out exports/medusa-orig
    python train/export.py zoo/draft --format vllm --out exports/draft

What each format holds (drafters/formats.py has the key names and config fields):
  vllm             EAGLE-3: LlamaForCausalLMEagle3 folder (midlayer.*, fc, norm, lm_head, d2t, t2d), the same
                   folder SGLang loads. EAGLE-1/2: LlamaForCausalLM (fc without bias, layers.0.* without
                   input_layernorm, no norm, no lm_head). Medusa: model_type "medusa" (blocks.*, lm_heads.*).
                   Standalone: a plain Hugging Face folder (vocabulary checked against --target).
  sglang           EAGLE-3: as vllm. EAGLE-1/2: LlamaForCausalLMEagle with a zero fc.bias (a reduced draft
                   vocabulary goes to hot_token_ids.pt for --speculative-token-map). Standalone: as vllm.
                   Medusa: refused (SGLang has no Medusa algorithm).
  speculators      EAGLE-3 and P-EAGLE: vllm-project/speculators config (Eagle3Speculator / PEagleSpeculator,
                   layers.0.*); DFlash: DFlashSpeculator (with the target's lm_head); `vllm serve DIR`.
P-EAGLE (an EAGLE-3 draft with mask_hidden, train/eagle.py --config recipes/eagle/peagle.yaml): vllm writes the
EAGLE-3 folder plus mask_hidden and pard_token / ptd_token_id, served as eagle3 with "parallel_drafting": true;
sglang is refused. DFlash (train/dflash.py): vllm writes z-lab's layout (DFlashDraftModel, dflash_config), which
vLLM's dflash method and SGLang's DFLASH load; sglang is refused in favour of it.
  medusa-original  Medusa only: FasterDecoding/Medusa (medusa_lm_head.safetensors and .pt, config medusa_num_heads).
EAGLE drafts in draftkit's own layout are refused for every engine (not reference-exact): retrain them with
`--layout reference` (train/eagle.py). A refusal is one line on stderr and exit code 2.

--check then loads the written folder back as draftkit's own drafter and decodes two short prompts greedily with
it and with the source (train/export_check.py): both identical to plain decoding, and, when the export keeps the
dtype the source stores, the same drafts at every step; a failed check is one line and exit code 1 (the folder
stays, for inspection).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from draftkit.drafters.exporters import FORMATS, export_eagle, export_medusa, export_standalone, kind_of  # noqa: E402
from draftkit.drafters.formats import TOKEN_MAP, ExportRefused, detect, load_eagle_draft, read_config  # noqa: E402
from draftkit.drafters.medusa import has_adapter  # noqa: E402

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _default_target(path: str, recorded: str) -> str:
    """The target to name when --target is not given: the shipped target for a shipped drafter (it records the
    folder it was trained against, which a fresh checkout does not have), else the target the drafter records
    (a folder or a hub id), else the shipped one."""
    from draftkit.models import resolve

    shipped = resolve(None, "target")
    zoo = os.path.dirname(os.path.abspath(shipped))
    if os.path.dirname(os.path.abspath(path)) == zoo or not recorded:
        return shipped
    return recorded


def _architectures(target: str) -> list[str] | None:
    """The target's architectures when it is a local folder (named in speculators' verifier)."""
    p = os.path.join(target or "", "config.json")
    if not os.path.exists(p):
        return None
    with open(p) as fh:
        return (json.load(fh).get("architectures") or None)


def drafter_kind(src: str, name: str, target: str | None) -> str:
    """eagle, medusa or standalone; a folder that holds no drafter (a run folder, the target itself) is refused
    with what to pass instead."""
    if not os.path.exists(os.path.join(src, "config.json")):
        final = os.path.join(src, "final")
        if os.path.exists(os.path.join(final, "config.json")):
            raise ExportRefused(f"{name} is a training run, not a drafter: export its model, {name.rstrip('/')}/final")
        raise ExportRefused(f"{name} holds no drafter (no config.json): pass a drafter's folder, such as a training "
                            f"run's final/ or zoo/eagle3")
    kind = kind_of(src)
    if kind == "standalone" and os.path.realpath(src) == os.path.realpath(target or _default_target(src, "")):
        raise ExportRefused(f"{name} is the target model itself, not a drafter: export a draft trained for it "
                            f"(train/draft.py, train/eagle.py, train/medusa.py) or one of zoo/draft, zoo/eagle3, "
                            f"zoo/medusa")
    return kind


def serve_name(path: str) -> str:
    """How a serve command names a model: a local folder by its absolute path (the command may run anywhere),
    a hub id as it is."""
    return os.path.abspath(path) if os.path.exists(path) else path


# draft tokens per step the serve commands use when --speculative-tokens is not given (the README's): EAGLE
# drafts 5 levels; Medusa proposes one token per head; a standalone draft a chain of 4
DRAFT_TOKENS = {"eagle": 5, "standalone": 4}


def serve_commands(kind: str, fmt: str, out: str, target: str, eagle3: bool, k: int) -> list[str]:
    """The engine commands that serve the exported folder."""
    out, target = serve_name(out), serve_name(target)
    vllm = ("vllm serve {t} --speculative-config "
            "'{{\"method\": \"{m}\", \"model\": \"{o}\", \"num_speculative_tokens\": {k}}}'")
    if kind == "peagle":  # EAGLE-3's method with parallel drafting on: every draft token in one forward
        command = vllm.format(t=target, m="eagle3", o=out, k=k)[:-2] + ', "parallel_drafting": true}\''
        return ([f"vllm serve {out}   # target and method come from speculators_config"] if fmt == "speculators"
                else []) + [command]
    if kind == "dflash":
        return [vllm.format(t=target, m="dflash", o=out, k=k) + "   # k <= block_size - 1",
                f"python -m sglang.launch_server --model-path {target} --speculative-algorithm DFLASH "
                f"--speculative-draft-model-path {out} --speculative-num-draft-tokens {k + 1}"] \
            if fmt == "vllm" else [f"vllm serve {out}   # target and method come from speculators_config"]
    sglang = ("python -m sglang.launch_server --model-path {t} --speculative-algorithm {a} "
              "--speculative-draft-model-path {o} --speculative-num-steps {k} --speculative-eagle-topk {tk} "
              "--speculative-num-draft-tokens {n}")
    if kind == "eagle":
        if fmt == "speculators":
            return [f"vllm serve {out}   # target and method come from speculators_config",
                    vllm.format(t=target, m="eagle3", o=out, k=k)]
        if eagle3:  # one folder for both engines
            return [vllm.format(t=target, m="eagle3", o=out, k=k),
                    sglang.format(t=target, a="EAGLE3", o=out, k=k, tk=8, n=32)]
        if fmt == "vllm":
            return [vllm.format(t=target, m="eagle", o=out, k=k)]
        token_map = os.path.join(out, TOKEN_MAP)
        extra = f" --speculative-token-map {token_map}" if os.path.exists(token_map) else ""
        return [sglang.format(t=target, a="EAGLE", o=out, k=k, tk=8, n=32) + extra]
    if kind == "medusa":
        if fmt == "vllm":
            return [vllm.format(t=target, m="medusa", o=out, k=k) + "   # vLLM drafts Medusa's top-1 chain"]
        return [f"python -m medusa.inference.cli --model {out}   # FasterDecoding/Medusa, base model from the config"]
    return [vllm.format(t=target, m="draft_model", o=out, k=k),
            f"python -m sglang.launch_server --model-path {target} --speculative-algorithm STANDALONE "
            f"--speculative-draft-model-path {out} --speculative-num-steps {k} --speculative-eagle-topk 1 "
            f"--speculative-num-draft-tokens {k + 1}"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (argparse then names the flag in its one-line error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


MERGED_PLACEHOLDER = "MERGED_TARGET_DIR"  # what the serve commands name when a Medusa-2 target was not written


def merged_target_problem(args) -> None:
    """--merged-target is for a Medusa-2 folder only, and writes into an empty or new folder (or --force): refused in
    one line before anything loads."""
    d = args.merged_target
    if d is None:
        return
    if not has_adapter(args.drafter):
        raise ExportRefused(f"--merged-target: {args.drafter} holds no Medusa-2 LoRA adapter, so there is no merged "
                            "target to write")
    if os.path.exists(d) and (not os.path.isdir(d) or os.listdir(d) and not args.force):
        raise ExportRefused(f"--merged-target {d} " + ("is a file, not a folder" if not os.path.isdir(d)
                                                       else "exists and is not empty (pass --force to replace it)"))


def write_merged_target(src: str, target: str, out: str, dtype: torch.dtype) -> str:
    """The target with the Medusa-2 adapter in `src` merged in, saved as a Hugging Face folder with its tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    from draftkit.drafters.medusa import load_target_with_adapter
    from draftkit.models import load_model

    shutil.rmtree(out, ignore_errors=True)
    merged = load_target_with_adapter(src, load_model(target)).to(dtype)
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(target).save_pretrained(out)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python train/export.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafter", metavar="DRAFTER_DIR",
                   help="a drafter folder: EAGLE (train/eagle.py, reference layout; or an imported public one), "
                        "Medusa (train/medusa.py, zoo/medusa) or a standalone causal LM (zoo/draft)")
    p.add_argument("--format", required=True, choices=FORMATS,
                   help="what to write: vllm, sglang, speculators (EAGLE-3 for vLLM) or medusa-original "
                        "(FasterDecoding) (required)")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (required; must be empty or new "
                                                              "unless --force)")
    p.add_argument("--target", default=None, metavar="PATH_OR_ID",
                   help="the target model (folder, hub id, GGUF file or a named real target such as smollm2-135m): "
                        "loaded for Medusa (its LM head, shape check) and read for standalone (vocabulary check); "
                        "named in speculators' verifier and in the printed serve commands (default: EAGLE, the target "
                        "name the draft records; Medusa and standalone, the target the drafter records if it is a "
                        "local folder, else the shipped zoo target)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float16",
                   help="dtype of the written floating-point weights (default: float16, what draftkit saves; "
                        "d2t / t2d stay int64 / bool)")
    p.add_argument("--speculative-tokens", type=positive_int, default=None, metavar="K",
                   help="draft tokens per step written into speculators_config and the printed commands (default: "
                        "5 for EAGLE, the number of heads for Medusa, 4 for a standalone draft, as in the README, "
                        "and for DFlash its block size - 1, the most it can be)")
    p.add_argument("--merged-target", default=None, metavar="DIR",
                   help="Medusa-2 only (heads trained with a LoRA adapter on the target): also write the target with "
                        "that adapter merged in here, in --dtype (a full copy of the target), and name it in the "
                        "serve commands, which otherwise name a placeholder for it (default: not written)")
    p.add_argument("--force", action="store_true",
                   help="replace a non-empty --out whole, once the new export is written (default: refuse)")
    p.add_argument("--check", action="store_true",
                   help="after writing, load the folder back as draftkit's drafter and decode two prompts with it "
                        "and with the source (loads the target; about a minute for a 135M target on 2 CPU cores): "
                        "exit 1 if it drafts differently or loses losslessness (default: off)")
    return p


def export(args) -> tuple[str, list[str], str, str]:
    """Write the export into a staging folder beside --out, then put it in place: a failed export leaves --out as it
    was, and --force replaces the folder whole (no file of an earlier export stays beside the new one)."""
    import shutil

    final = os.path.abspath(args.out)
    if os.path.exists(final) and not os.path.isdir(final):
        raise ExportRefused(f"--out {args.out} is a file, not a folder")
    if os.path.isdir(final) and os.listdir(final) and not args.force:
        raise ExportRefused(f"{args.out} exists and is not empty (pass --force to replace it)")
    merged_target_problem(args)
    staging = f"{final}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    try:
        msg, commands, method, target = write_export(args, staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if os.path.isdir(final):
        old = f"{final}.replaced-{os.getpid()}"
        os.replace(final, old)
        os.replace(staging, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staging, final)
    return msg.replace(staging, final), commands, method, target


def write_export(args, out: str, final: str) -> tuple[str, list[str], str, str]:
    """Write the export into `out` (serve commands name `final`, where it will be); (message, serve commands, the
    draftkit method that loads it back, the target)."""
    src = os.path.abspath(args.drafter)
    if not os.path.isdir(src):
        raise FileNotFoundError(f"{args.drafter} is not a folder")
    dtype = DTYPES[args.dtype]
    if args.target:  # a named real target (smollm2-135m) or a GGUF file: its converted folder, as everywhere else
        from draftkit.models import resolve

        args.target = resolve(args.target, "target")
    kind = drafter_kind(src, args.drafter, args.target)
    cfg = read_config(src)
    k = args.speculative_tokens or DRAFT_TOKENS.get(kind) or int(cfg.get("num_heads") or cfg.get("medusa_num_heads")
                                                                 or 4)
    if kind == "eagle":
        if detect(src) == "draftkit-eagle":
            raise ExportRefused(
                f"{args.drafter} is an EAGLE draft in draftkit's own layout (fc with bias -> a full decoder layer "
                "with its input norm -> a final norm), which no engine computes; retrain it with `--layout reference` "
                "(python train/eagle.py --config ... --layout reference) to export it")
        try:
            draft = load_eagle_draft(src)
        except ValueError as e:
            if "pass the target" not in str(e) or not args.target:
                raise
            from draftkit.models import load_model

            draft = load_eagle_draft(src, load_model(args.target))
        target = args.target or _default_target(src, draft.config.target_name)
        msg = export_eagle(draft, args.format, out, dtype, target_name=target,
                           speculative_tokens=k, target_architectures=_architectures(target))
        eagle3 = len(draft.config.feature_layers) == 3
        kind = "peagle" if draft.config.mask_token_id is not None else kind
    elif kind == "dflash":
        from draftkit.drafters.dflash_formats import export_dflash, load_dflash_draft
        from draftkit.models import load_model

        target = args.target or _default_target(src, cfg.get("target_name", ""))
        model = load_model(target) if args.format == "speculators" or not cfg.get("num_target_layers") else None
        draft = load_dflash_draft(src, model)
        block = draft.config.block_size
        if args.speculative_tokens and args.speculative_tokens > block - 1:
            raise ExportRefused(f"--speculative-tokens {args.speculative_tokens}: {args.drafter} drafts a block of "
                                f"{block} (the root and {block - 1} masked positions), so at most {block - 1} tokens "
                                "a step")
        k = args.speculative_tokens or block - 1  # DFlash drafts its whole block a step
        msg = export_dflash(draft, args.format, out, model, dtype, target_name=target,
                            target_architectures=_architectures(target))
        eagle3 = False
    elif kind == "medusa":
        if args.format not in ("vllm", "medusa-original"):  # refuse before loading anything
            export_medusa(src, args.format, out, None, dtype)
        from draftkit.models import load_model

        target = args.target or _default_target(src, (cfg.get("target") or {}).get("name", "")
                                                or cfg.get("base_model_name_or_path", ""))
        msg = export_medusa(src, args.format, out, load_model(target), dtype)
        if has_adapter(src):  # the heads read the fine-tuned target: the serve commands must name that one
            target = write_merged_target(src, target, args.merged_target, dtype) if args.merged_target \
                else MERGED_PLACEHOLDER
            msg += f" (written to {args.merged_target})" if args.merged_target else \
                f"; pass --merged-target DIR to write it (the commands below name it {MERGED_PLACEHOLDER})"
        eagle3 = False
    else:
        target = args.target or _default_target(src, "")
        msg = export_standalone(src, args.format, out, target, dtype)
        eagle3 = False
    method = "eagle3" if kind == "eagle" and eagle3 else kind  # the draftkit drafter that loads the folder back
    return f"wrote {args.out}: {msg}", serve_commands(kind, args.format, final, target, eagle3, k), method, target


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        msg, commands, method, target = export(args)
    except (ExportRefused, ValueError, FileNotFoundError, OSError) as e:
        print("export: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(msg)
    print("serve it with:")
    for c in commands:
        print("  " + c)
    if args.check:
        from draftkit.train.export_check import CheckFailed, check_export

        try:
            print(check_export(method, os.path.abspath(args.drafter), os.path.abspath(args.out), target,
                               DTYPES[args.dtype]))
        except CheckFailed as e:
            print(f"export: check failed: {e} ({args.out} is kept)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
