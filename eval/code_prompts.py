"""A prompts file of Python code that the default family never trained on (python eval/code_prompts.py).

The corpus (draftkit/corpus.py) reads the standard library and draftkit's own dependencies; this reads the
installed source of *other* projects (default: pytest, requests, rich, click, jinja2, networkx, whichever are
installed), picks --prompts windows of about --chars characters that start at a line start, and writes them
as compare.py's JSONL ({"prompt": ..., "task": "other-code", "source": "<dist>/<path>:<line>"}):

    python eval/code_prompts.py --out eval/prompts/other_code.jsonl
    python eval/compare.py --prompts-file eval/prompts/other_code.jsonl

A distribution the corpus reads is refused: its code is training data, not held-out code.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as metadata
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from draftkit.files import write_text_atomically  # noqa: E402
from draftkit.corpus import MAX_FILE_BYTES, dependencies  # noqa: E402

DEFAULT_DISTS = ("pytest", "requests", "rich", "click", "jinja2", "networkx")
_SKIP_PARTS = {"test", "tests", "testing", "vendor", "_vendor", "__pycache__"}


class UsageError(Exception):
    pass


def _norm(name: str) -> str:
    return name.lower().replace("_", "-")


def source_files(dist_name: str) -> list[tuple[str, Path]]:
    """(<dist>/<path>, absolute path) of the .py files a distribution installed, tests and vendored code out."""
    try:
        dist = metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise UsageError(f"--dists: {dist_name!r} is not installed") from None
    out = []
    for f in dist.files or []:
        rel = str(f)
        if not rel.endswith(".py") or _SKIP_PARTS.intersection(Path(rel).parts) or Path(rel).name.startswith("test_"):
            continue
        path = Path(dist.locate_file(f))
        if path.is_file() and 2000 <= path.stat().st_size <= MAX_FILE_BYTES:
            out.append((f"{_norm(dist_name)}/{rel}", path))
    return sorted(out)


def window(text: str, chars: int, rng: random.Random) -> tuple[int, str]:
    """(line number, about `chars` characters of `text` starting at a line start and ending at a line end)."""
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip()]
    first = rng.choice(starts[: max(1, len(starts) * 3 // 4)])
    out, n = [], 0
    for line in lines[first:]:
        if n >= chars:
            break
        out.append(line)
        n += len(line)
    return first + 1, "".join(out)


def build(dists: list[str], n: int, chars: int, seed: int) -> list[dict]:
    """n windows, taken from the distributions in turn (a large project does not crowd out the others)."""
    pools = [f for f in (source_files(d) for d in dists) if f]
    if not pools:
        raise UsageError(f"--dists {','.join(dists)}: no Python source files of 2 KB or more")
    rng = random.Random(seed)
    for pool in pools:
        rng.shuffle(pool)
    chosen = [pools[i % len(pools)].pop() for i in range(n) if pools[i % len(pools)]]
    rows = []
    for rel, path in chosen:
        line, text = window(path.read_text(encoding="utf-8", errors="replace"), chars, rng)
        rows.append({"prompt": text, "task": "other-code", "source": f"{rel}:{line}"})
    return rows


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dists", default=",".join(DEFAULT_DISTS),
                   help="comma-separated installed distributions to draw from; those not installed are skipped "
                        "when they are the default (default: %(default)s)")
    p.add_argument("--prompts", type=int, default=12, help="how many prompts (default: %(default)s)")
    p.add_argument("--chars", type=int, default=1200, help="about how many characters each (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="which files and windows (default: %(default)s)")
    p.add_argument("--out", default="eval/prompts/other_code.jsonl", help="the JSONL to write (default: %(default)s)")
    args = p.parse_args(argv)
    if args.prompts < 1:
        raise UsageError(f"--prompts {args.prompts}: needs at least 1")
    if args.chars < 100:
        raise UsageError(f"--chars {args.chars}: needs at least 100")
    names = [d.strip() for d in args.dists.split(",") if d.strip()]
    if not names:
        raise UsageError("--dists is empty: name at least one installed distribution")
    corpus = {_norm(d) for d in dependencies()} | {"draftkit"}
    taken = [d for d in names if _norm(d) in corpus]
    if taken:
        raise UsageError(f"--dists {','.join(taken)}: the training corpus reads it (draftkit and its dependencies "
                         f"are training data); choose projects outside {sorted(corpus)}")
    if args.dists == p.get_default("dists"):
        names = [d for d in names if _installed(d)]
    args.names = names
    return args


def _installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def main(argv=None) -> int:
    try:
        args = parse(argv)
        rows = build(args.names, args.prompts, args.chars, args.seed)
    except UsageError as e:
        print(f"code_prompts.py: error: {e}", file=sys.stderr)
        return 2
    write_text_atomically(args.out, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    digest = hashlib.sha256(Path(args.out).read_bytes()).hexdigest()[:12]
    versions = ", ".join(f"{d} {metadata.version(d)}" for d in args.names)
    print(f"wrote {len(rows)} prompts to {args.out} (sha256 {digest}) from {versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
