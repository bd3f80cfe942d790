"""Loading models by name: the shipped zoo (None / "default"), a named real target (`smollm2-135m`), a GGUF file,
a local folder or a hub id."""
from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

import torch

from draftkit.gguf import resolve_real
from draftkit.zoo import verified_path

HUB_TIMEOUT_S = 2.0  # how long the hub may take to answer before a hub id counts as unreachable


class ModelUnreachable(OSError):
    """A hub id that is neither a local folder, nor in the local hub cache, nor reachable now."""


def resolve(name_or_path: str | None, default: str) -> str:
    """A loadable folder or hub id: the zoo's `default` (None), a named real target or a .gguf file (converted
    once into a cached folder, draftkit/gguf.py), or `name_or_path` as it is."""
    if name_or_path in (None, "", "default"):
        return verified_path(default)
    return resolve_real(str(name_or_path)) or name_or_path


def looks_like_path(name: str) -> bool:
    """A local path rather than a hub id ("name" or "org/name"): it starts like a path, has more than one "/",
    or lies under an existing folder."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.path.isdir(name.split("/")[0])


def hub_problem(name: str, repo_type: str = "model") -> str | None:
    """Why the hub id `name` (a model, or with repo_type "dataset" a dataset) cannot be loaded now (one clause),
    or None: a local folder, in the local hub cache, or the hub answers within HUB_TIMEOUT_S. Without it, no
    network costs a minute of retries and a traceback."""
    from huggingface_hub import constants, try_to_load_from_cache

    if os.path.exists(os.path.expanduser(name)):
        return None
    local = "folder" if repo_type == "model" else "folder or file"  # what a local dataset may also be
    try:
        if repo_type == "dataset":
            try_to_load_from_cache(name, "README.md", repo_type="dataset")  # checks the id's form
            if _dataset_cached(name, constants.HF_HUB_CACHE):
                return None
        elif isinstance(try_to_load_from_cache(name, "config.json"), str):
            return None
    except ValueError:  # not of a hub id's form (a mistyped path): from_pretrained would say "Repo id must use ..."
        return f"no such {local}, and not a hub id (org/name) either"
    if constants.HF_HUB_OFFLINE:
        return f"neither a {local} nor in the local hub cache, and HF_HUB_OFFLINE is set"
    if repo_type == "dataset" and os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return f"neither a {local} nor in the local datasets cache, and HF_DATASETS_OFFLINE is set"
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or (80 if url.scheme == "http" else 443)),
                                 timeout=HUB_TIMEOUT_S).close()
    except OSError:
        return (f"neither a {local} nor reachable: the hub ({constants.ENDPOINT}) did not answer within "
                f"{HUB_TIMEOUT_S:.0f} s (no network? HF_HUB_OFFLINE=1 uses the local hub cache only)")
    return None


def _dataset_cached(name: str, hub_cache: str) -> bool:
    """A hub dataset downloaded before: in the hub's cache or in datasets' own (where load_dataset finds it
    offline)."""
    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(os.path.dirname(hub_cache), "datasets")
    return os.path.isdir(os.path.join(hub_cache, "datasets--" + name.replace("/", "--"))) or \
        os.path.isdir(os.path.join(datasets_cache, name.replace("/", "___")))


def check_reachable(name: str) -> str:
    """`name`, or a ModelUnreachable that says in one line why it cannot be loaded."""
    problem = hub_problem(name)
    if problem:
        raise ModelUnreachable(f"{name}: {problem}")
    return name


def load_model(name_or_path: str | None = None, default: str = "target", dtype=torch.float32):
    """A causal LM from the zoo (None), a local folder or a Hugging Face hub id; eval mode."""
    from transformers import AutoModelForCausalLM

    path = check_reachable(resolve(name_or_path, default))
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def load_target(name_or_path: str | None = None, dtype=torch.float32):
    """(model, tokenizer) for the target."""
    from transformers import AutoTokenizer

    path = resolve(name_or_path, "target")
    return load_model(path, dtype=dtype), AutoTokenizer.from_pretrained(path)
