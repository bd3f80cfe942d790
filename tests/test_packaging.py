"""The installed distribution exposes one namespace, draftkit, with the shipped models, recipes and prompts inside
it; the repository keeps its top-level folders. A wheel installed into a fresh environment works from any folder."""
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def build_wheel(tmp_path: Path) -> Path:
    pytest.importorskip("setuptools", minversion="77")  # the dev extra pins it: PEP 639 license strings
    source = tmp_path / "src"  # a copy: building writes build/ and *.egg-info beside the sources
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("draftkit", "verify", "drafters", "eval", "train", "zoo", "recipes"):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__", "results"))
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          "-w", str(tmp_path), str(source)], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = tmp_path.glob("draftkit-*.whl")
    return wheel


def test_the_wheel_holds_only_the_draftkit_namespace_with_its_data(tmp_path):
    names = zipfile.ZipFile(build_wheel(tmp_path)).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"draftkit"}, tops
    for module in ("verify/contract.py", "drafters/eagle.py", "eval/compare.py", "train/eagle.py",
                   "eval/prompts/person.schema.json", "eval/prompts/chat.jsonl", "eval/prompts/other_code.jsonl",
                   "_recipes/eagle/eagle3.yaml", "_recipes/smollm2/eagle3.yaml", "_recipes/accelerate/single.yaml"):
        assert "draftkit/" + module in names, module
    import json

    for name, entry in json.loads((ROOT / "zoo" / "manifest.json").read_text())["models"].items():
        for rel in entry["files"]:  # every shipped file the manifest lists
            assert f"draftkit/_zoo/{entry['path']}/{rel}" in names, (name, rel)


@pytest.mark.slow
def test_a_wheel_in_a_fresh_environment_decodes_compares_and_trains_from_another_folder(tmp_path):
    """The wheel alone (no checkout on the path, no editable install): the default target and drafters from the
    packaged zoo, `python -m draftkit.eval.compare --quick`, and a few training steps from a shipped recipe."""
    wheel = build_wheel(tmp_path)
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site = Path(subprocess.check_output([str(env_dir / "bin" / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    # the dependencies (torch, transformers, ...) from this environment's site-packages, read as a plain path: its
    # .pth files (the editable draftkit among them) are not processed for a path added this way
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DRAFTKIT_ZOO", "PYTHONPATH")}
    env["WANDB_MODE"] = "offline"
    py = str(env_dir / "bin" / "python")

    def run(*args):
        out = subprocess.run([py, *args], capture_output=True, text=True, cwd=elsewhere, env=env, timeout=900)
        assert out.returncode == 0, out.stdout[-1500:] + out.stderr[-3000:]
        return out.stdout
    decoded = run("-c", "import draftkit as dk, torch; t, tok = dk.load_target(); "
                        "print(dk.__file__); ids = tok('def add(a, b):').input_ids; "
                        "print(all(dk.generate(t, ids, dk.make_drafter(m, t), 16).tokens.numel() == 16 "
                        "for m in ('eagle', 'medusa', 'standalone', 'suffix')))")
    assert str(site) in decoded and decoded.strip().endswith("True"), decoded
    run("-m", "draftkit.eval.compare", "--quick", "--drafters", "suffix", "--prompts", "1", "--max-new-tokens", "8",
        "--no-peers", "--no-plots", "--out", str(tmp_path / "cmp"))
    assert (tmp_path / "cmp" / "compare.json").is_file()
    run("-m", "draftkit.train.eagle", "--config", "recipes/eagle/eagle2.yaml", "--max_steps", "2", "--train_rows",
        "8", "--shard_rows", "8", "--regenerate", "false", "--corpus", "stdlib", "--eval_every", "1000",
        "--eval_tau_prompts", "0",
        "--output_dir", str(tmp_path / "run"))
    assert (tmp_path / "run" / "final").is_dir()


def test_a_checkout_maps_its_folders_into_the_namespace():
    import draftkit.drafters.registry
    import draftkit.verify.contract

    assert Path(draftkit.verify.contract.__file__).resolve() == ROOT / "verify" / "contract.py"
    assert Path(draftkit.drafters.registry.__file__).resolve() == ROOT / "drafters" / "registry.py"
    assert "verify" not in sys.modules and "drafters" not in sys.modules  # nothing imports the bare names
