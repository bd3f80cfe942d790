"""The target, read before its weights: where it is (a folder, a hub id, a named real target or a GGUF file), whether
draftkit can decode it (its config and folder), and where and in what precision it runs (--device, --dtype)."""
from __future__ import annotations

import os

from draftkit.eval.cli_checks import UsageError, error_message


def target_info(name: str | None):
    """(folder or hub id, context length or None, tokenizer) of the target, read before its weights."""
    from transformers import AutoConfig, AutoTokenizer

    from draftkit.gguf import RealTargetMissing
    from draftkit.models import resolve
    from draftkit.verify.attention_layout import config_problem
    from draftkit.zoo import ZooError

    try:
        path = resolve(name, "target")  # a named real target or a .gguf file: its converted folder
    except ZooError as e:
        raise UsageError(f"the shipped target: {e}") from None
    except (RealTargetMissing, FileNotFoundError) as e:
        raise UsageError(f"--target: {e}") from None
    from huggingface_hub.utils import logging as hub_logging
    from transformers.utils import logging as hf_logging

    levels = hub_logging.get_verbosity(), hf_logging.get_verbosity()
    hub_logging.set_verbosity_error()  # their retry warnings would be extra lines: the error below says it all
    hf_logging.set_verbosity_error()
    try:
        cfg = AutoConfig.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, KeyError...
        why = error_message(e)
        if os.path.isdir(path) and not any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES):
            why = "no tokenizer beside the model: save it there too, tokenizer.save_pretrained(folder)"
        raise UsageError(f"--target {path!r}: cannot read its config and tokenizer ({why})") from None
    finally:
        hub_logging.set_verbosity(levels[0])
        hf_logging.set_verbosity(levels[1])
    problem = config_problem(cfg) or weights_problem(path)
    if problem:
        raise UsageError(f"--target {path}: {problem}")
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    context = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    return path, context, tok


def placement(device: str, dtype: str, path: str) -> tuple[str, str]:
    """(device, dtype name) the target loads on: --device / --dtype checked (one line) and their `auto` resolved."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UsageError(f"--device {device!r}: not a device (cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: compare.py runs on cpu or cuda")
    if dev.type == "cuda" and (not torch.cuda.is_available() or (dev.index or 0) >= torch.cuda.device_count()):
        raise UsageError(f"--device {device}: no such GPU here ({torch.cuda.device_count()} visible)")
    if dtype == "auto":
        dtype = "fp32"
        if dev.type == "cuda":
            from transformers import AutoConfig

            saved = str(getattr(AutoConfig.from_pretrained(path), "torch_dtype", "") or "")
            dtype = "fp16" if "float16" in saved and "bfloat" not in saved else "bf16"
    return device, dtype


def torch_dtype(name: str):
    """The torch dtype of a precision's short name (fp32, bf16, fp16), as --dtype and gpu_check's --dtypes take it."""
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "*.pt", "*.gguf")


def weights_problem(path: str) -> str | None:
    """A local model folder without a weights file (a config and tokenizer alone), said before anything loads."""
    import glob

    if not os.path.isdir(path) or any(glob.glob(os.path.join(path, w)) for w in WEIGHTS):
        return None
    return "holds no weights (model.safetensors or pytorch_model.bin beside its config.json)"
