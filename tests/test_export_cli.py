"""train/export.py as a newcomer meets it: what is not a drafter is refused with what to pass instead, and the
printed serve commands name the target and the export the same way for every drafter, with the README's
draft lengths."""
import json
import os
import shutil

import pytest
import torch

from draftkit.models import resolve
from draftkit.train.export import main as export_main


def refused(capsys, *argv) -> str:
    assert export_main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("export: error: "), err
    return err


def test_what_is_not_a_drafter_is_refused(tmp_path, capsys):
    target = resolve(None, "target")
    out = tmp_path / "out"
    assert "the target model itself" in refused(capsys, target, "--format", "vllm", "--out", str(out))
    copy = tmp_path / "my-target"
    shutil.copytree(target, copy)  # the target named by --target, wherever it lies
    assert "the target model itself" in refused(capsys, str(copy), "--format", "vllm", "--out", str(out),
                                                 "--target", str(copy))
    run = tmp_path / "runs" / "eagle3"
    (run / "final").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "final" / "config.json").write_text("{}")
    assert f"export its model, {run}/final" in refused(capsys, str(run), "--format", "vllm", "--out", str(out))
    assert "holds no drafter" in refused(capsys, str(run / "checkpoints"), "--format", "vllm", "--out", str(out))
    assert not out.exists()


@pytest.mark.parametrize("drafter, k", [("eagle3", 5), ("medusa", 4), ("draft", 4)])
def test_serve_commands_name_absolute_folders_and_the_readme_draft_length(drafter, k, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths, as a user types them
    src = os.path.relpath(resolve(None, drafter))
    assert export_main([src, "--format", "vllm", "--out", "exp"]) == 0
    printed = capsys.readouterr().out
    vllm = next(line for line in printed.splitlines() if line.strip().startswith("vllm serve"))
    target = os.path.abspath(resolve(None, "target"))
    assert vllm.split()[2] == target, vllm
    config = json.loads(vllm.split("--speculative-config ")[1].split("'")[1])
    assert config["model"] == str(tmp_path / "exp") and config["num_speculative_tokens"] == k, config


def test_a_draft_length_the_drafter_cannot_propose_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    for bad in ("0", "-5"):  # argparse: one line naming the flag, exit 2
        with pytest.raises(SystemExit) as e:
            export_main([resolve(None, "eagle3"), "--format", "speculators", "--out", str(out),
                         "--speculative-tokens", bad])
        assert e.value.code == 2 and "--speculative-tokens: must be >= 1" in capsys.readouterr().err
    block = json.loads(open(os.path.join(resolve(None, "dflash"), "config.json")).read())["block_size"]
    err = refused(capsys, resolve(None, "dflash"), "--format", "vllm", "--out", str(out),
                  "--speculative-tokens", str(block))
    assert f"at most {block - 1} tokens a step" in err
    assert not out.exists()


@pytest.mark.parametrize("drafter", ["eagle3", "medusa", "draft"])
def test_check_loads_the_export_back_with_the_sources_drafts(drafter, tmp_path, capsys):
    assert export_main([resolve(None, drafter), "--format", "vllm", "--out", str(tmp_path / "exp"), "--check"]) == 0
    verdict = capsys.readouterr().out.splitlines()[-1]
    method = "standalone" if drafter == "draft" else drafter
    assert verdict.startswith(f"check: {tmp_path / 'exp'} loads back as draftkit's {method};"), verdict
    assert "identical to plain decoding" in verdict and "the same drafts as the source" in verdict, verdict


def test_check_fails_on_an_export_that_drafts_differently(tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    from draftkit.train.export_check import CheckFailed, check_export

    src, out = resolve(None, "eagle3"), tmp_path / "exp"
    assert export_main([src, "--format", "vllm", "--out", str(out)]) == 0
    state = load_file(str(out / "model.safetensors"))
    state["fc.weight"] = state["fc.weight"].flip(0)  # a projection written with its rows out of order
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(CheckFailed, match="drafts differently from the source"):
        check_export("eagle3", src, str(out), resolve(None, "target"), torch.float16)


def test_force_replaces_the_folder_whole_and_a_failed_export_changes_nothing(tmp_path, capsys, monkeypatch):
    """An export is written beside --out and then put in place: --force leaves no file of the earlier export (a
    Medusa export's tree.json beside an EAGLE-3 one would be read by an engine), and an export that fails midway
    leaves --out as it was, with no staging folder behind."""
    import draftkit.train.export as export_module

    out, fresh = tmp_path / "exp", tmp_path / "fresh"
    assert export_main([resolve(None, "medusa"), "--format", "medusa-original", "--out", str(out)]) == 0
    capsys.readouterr()
    assert "not empty (pass --force" in refused(capsys, resolve(None, "eagle3"), "--format", "vllm", "--out", str(out))
    assert export_main([resolve(None, "eagle3"), "--format", "vllm", "--out", str(out), "--force"]) == 0
    assert export_main([resolve(None, "eagle3"), "--format", "vllm", "--out", str(fresh)]) == 0
    assert sorted(os.listdir(out)) == sorted(os.listdir(fresh))

    def fails(*a, **k):
        raise ValueError("disk full")
    monkeypatch.setattr(export_module, "export_eagle", fails)
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    capsys.readouterr()
    assert "disk full" in refused(capsys, resolve(None, "eagle3"), "--format", "vllm", "--out", str(out), "--force")
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["exp", "fresh"]


def test_a_medusa2_export_writes_the_merged_target_its_serve_command_names(tmp_path, capsys):
    """Medusa-2 heads read the LoRA-fine-tuned target: the serve command names a placeholder for it unless
    --merged-target writes it (the adapter merged in: its logits are the merged model's, not the base target's);
    --merged-target for heads without an adapter, or into a folder in use, is refused before anything loads."""
    from draftkit.drafters.medusa import load_target_with_adapter
    from draftkit.models import load_model

    src, base = resolve(None, "medusa2"), resolve(None, "target")
    assert export_main([src, "--format", "vllm", "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    assert "pass --merged-target DIR" in printed and "vllm serve MERGED_TARGET_DIR " in printed, printed
    merged_dir = tmp_path / "merged"
    assert export_main([src, "--format", "vllm", "--out", str(tmp_path / "b"), "--merged-target", str(merged_dir),
                        "--dtype", "float32"]) == 0
    vllm = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("vllm serve"))
    assert vllm.split()[2] == str(merged_dir), vllm
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        written = load_model(str(merged_dir))(ids).logits
        merged = load_target_with_adapter(src, load_model(base))(ids).logits
        plain = load_model(base)(ids).logits
    assert torch.allclose(written, merged, atol=1e-5) and not torch.allclose(written, plain, atol=1e-3)
    capsys.readouterr()  # the loads' progress bars
    assert "holds no Medusa-2 LoRA adapter" in refused(capsys, resolve(None, "medusa"), "--format", "vllm", "--out",
                                                       str(tmp_path / "c"), "--merged-target", str(tmp_path / "m"))
    assert "exists and is not empty" in refused(capsys, src, "--format", "vllm", "--out", str(tmp_path / "c"),
                                                "--merged-target", str(merged_dir))
    assert not (tmp_path / "c").exists() and not (tmp_path / "m").exists()
