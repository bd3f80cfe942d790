"""The README's Python snippets run as written, in order, in one fresh interpreter (a later snippet may use what
an earlier one defined, as a reader running them in one session would). Snippets that need a hub model or a
user's own files (they name "path/to/...") are left out: no machine here can download them."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def runnable_snippets(readme: Path) -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), re.S)
    return [b for b in blocks if "path/to/" not in b]


@pytest.mark.slow
def test_readme_python_snippets_run_as_written(tmp_path):
    snippets = runnable_snippets(ROOT / "README.md")
    assert len(snippets) >= 2, "the API and the batch snippets"
    script = tmp_path / "readme_snippets.py"
    script.write_text("\n".join(snippets))
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("\n") >= 3, res.stdout  # every snippet prints its result
