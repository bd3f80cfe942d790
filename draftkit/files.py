"""The files draftkit keeps for later processes: where its cache lives, and writes that are whole or not at all
(what a later process, or a resumed run, reads must never be half a file)."""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """Where measurements and conversions are kept: $DRAFTKIT_CACHE, else ~/.cache/draftkit."""
    return Path(os.environ.get("DRAFTKIT_CACHE") or Path.home() / ".cache" / "draftkit")


def write_atomically(path, write: Callable[[str], None]) -> None:
    """`write(scratch)` fills a scratch file beside `path`, which then replaces `path` in one rename. A write that
    fails or is interrupted leaves `path` as it was and removes its scratch; processes writing the same path at
    once (two benchmarks saving one cost profile) each have a scratch of their own, and the last rename wins."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        write(str(scratch))
        os.replace(scratch, path)
    except BaseException:
        scratch.unlink(missing_ok=True)
        raise


def write_text_atomically(path, text: str) -> None:
    write_atomically(path, lambda scratch: Path(scratch).write_text(text, encoding="utf-8"))


def write_jsonl_atomically(path, rows) -> None:
    """One JSON object per line (a prompts file), written atomically."""
    import json

    write_text_atomically(path, "".join(json.dumps(row) + "\n" for row in rows))
