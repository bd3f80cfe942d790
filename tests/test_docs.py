"""The README and the pages under docs/ hold together: every relative link and image points at a file that exists,
the README stays a five-minute read, and every `python` command in the README's shell blocks names a script or a
module that exists. Fast: nothing is imported from draftkit and no model loads."""
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 250

# draftkit's namespace maps onto the repository's top-level folders (pyproject.toml's package-dir)
NAMESPACE = {"eval": "eval", "train": "train", "verify": "verify", "drafters": "drafters"}

LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^```.*?^```[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`]*`")


def relative_links(page: Path) -> list[str]:
    """The targets of the page's markdown links and images, outside code, that are neither web addresses nor
    anchors within the page."""
    text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
    targets = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):  # http(s), mailto, ...
            continue
        targets.append(target)
    return targets


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (ROOT / path.lstrip("/")) if path.startswith("/") else (page.parent / path)
        if not resolved.exists():
            broken.append(target)
    return broken


def bash_commands(page: Path) -> list[str]:
    """Every command line of the page's ```bash blocks: comments dropped, backslash continuations joined."""
    commands = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", page.read_text(), re.S | re.M):
        block = re.sub(r"\s*\\\n\s*", " ", block)
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
            if line:
                commands.append(line)
    return commands


def module_exists(module: str) -> bool:
    parts = module.split(".")
    if parts[0] == "pytest":
        return True
    if parts[0] != "draftkit":
        import importlib.util
        return importlib.util.find_spec(parts[0]) is not None
    if len(parts) > 1 and parts[1] in NAMESPACE:
        base, rest = ROOT / NAMESPACE[parts[1]], parts[2:]
    else:
        base, rest = ROOT / "draftkit", parts[1:]
    path = base.joinpath(*rest)
    if rest and path.with_suffix(".py").is_file():
        return True
    return (path / "__main__.py").is_file() or (not rest and (path / "__init__.py").is_file())


def missing_python_target(command: str) -> str | None:
    """What a `python ...` command names that does not exist (None when it all exists, or when the command is
    not a python command)."""
    words = shlex.split(command)
    if not words or words[0] not in ("python", "python3"):
        return None
    args = words[1:]
    while args and args[0].startswith("-") and args[0] != "-m":  # interpreter flags (-u, -X dev, ...)
        args = args[2:] if args[0] in ("-X", "-W") else args[1:]
    if not args:
        return None  # the bare interpreter
    if args[0] == "-m":
        return None if len(args) > 1 and module_exists(args[1]) else f"module {args[1:2]}"
    return None if (ROOT / args[0]).is_file() else args[0]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_image_resolves(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)} links to files that do not exist"


def test_the_docs_pages_are_linked_from_the_readme():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in relative_links(README)}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert unlinked == [], "docs pages the README's Documentation list does not link"


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move the detail into docs/"


def test_every_python_command_of_the_readme_names_what_exists():
    commands = [c for c in bash_commands(README) if c.split()[0] in ("python", "python3")]
    assert commands, "the README's install block names its two commands"
    missing = {c: m for c in commands if (m := missing_python_target(c))}
    assert missing == {}


def test_the_readme_keeps_runnable_python_snippets():
    from tests.test_readme import runnable_snippets

    assert len(runnable_snippets(README)) >= 2, "the API and the batch snippets (tests/test_readme.py runs them)"


def test_the_checks_catch_what_they_check(tmp_path):
    """The helpers above on a page made to fail: a missing file, a missing image, a missing script and module."""
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#part) [web](https://example.com/x) [anchor](#top) ![img](gone.png)\n"
                    "[gone](nowhere.md) `[in code](nowhere2.md)`\n```bash\n[fenced](nowhere3.md)\n```\n")
    assert broken_links(page) == ["gone.png", "nowhere.md"]
    assert missing_python_target("python eval/compare.py --quick") is None
    assert missing_python_target("python -m pytest -m slow") is None
    assert missing_python_target("python -m draftkit.eval.compare --quick") is None
    assert missing_python_target("python eval/nope.py") == "eval/nope.py"
    assert missing_python_target("python -m draftkit.eval.nope") is not None
    assert missing_python_target("pip install -e .") is None
    page.write_text("```bash\npython a.py \\\n    --flag  # comment\n# only a comment\npython -m pytest\n```\n")
    assert bash_commands(page) == ["python a.py --flag", "python -m pytest"]
