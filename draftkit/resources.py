"""Files draftkit ships beside its code: the recipes (recipes/ in a checkout, draftkit/_recipes in a wheel).

A recipe named as the README writes it (`recipes/eagle/eagle3.yaml`) is the file at that path when it exists
(a checkout, or the user's own copy), else the installed copy of the same recipe, so that
`python -m draftkit.train.eagle --config recipes/eagle/eagle3.yaml` works from any folder.
"""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def recipes_root() -> Path:
    checkout = PACKAGE.parent / "recipes"
    return checkout if checkout.is_dir() else PACKAGE / "_recipes"


def recipe_path(name: str) -> str:
    """`name` itself when it exists; else the shipped recipe of that name (`recipes/...` or a path inside it)."""
    path = Path(name).expanduser()
    if path.exists():
        return str(path)
    parts = path.parts[1:] if path.parts[:1] == ("recipes",) else path.parts
    shipped = recipes_root().joinpath(*parts)
    return str(shipped) if parts and shipped.is_file() else str(path)
