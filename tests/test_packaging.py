"""The installed distribution exposes one namespace, draftkit; the repository keeps its top-level folders."""
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_only_the_draftkit_namespace(tmp_path):
    pytest.importorskip("setuptools", minversion="77")  # the dev extra pins it: PEP 639 license strings
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("draftkit", "verify", "drafters", "eval", "train"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(source)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = tmp_path.glob("draftkit-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"draftkit"}, tops
    for module in ("verify/contract.py", "drafters/eagle.py", "eval/compare.py", "train/eagle.py",
                   "eval/prompts/person.schema.json"):
        assert "draftkit/" + module in names


def test_a_checkout_maps_its_folders_into_the_namespace():
    import draftkit.drafters.registry
    import draftkit.verify.contract

    assert Path(draftkit.verify.contract.__file__).resolve() == ROOT / "verify" / "contract.py"
    assert Path(draftkit.drafters.registry.__file__).resolve() == ROOT / "drafters" / "registry.py"
    assert "verify" not in sys.modules and "drafters" not in sys.modules  # nothing imports the bare names
