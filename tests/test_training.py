"""Recipes through the one loop (train/loop.py): every YAML loads against its script; every recipe lowers its
loss in a few steps and resumes onto exactly the losses of an uninterrupted run; a finished run continues
when --max_steps is raised, into the same W&B run, writing only under --output_dir; a changed model shape or
a corrupt checkpoint is a one-line error; every README training command runs in a fresh clone (slow)."""
import glob
import importlib
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from draftkit.train.config import TrainConfig, TrainError, load_recipe, parse_config
from draftkit.train.data import train_tokenizer
from draftkit.train.loop import STATE_FILE
from draftkit.train.targetdata import corpus_parts

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"zoo": "pretrain", "draft": "draft", "medusa": "medusa", "eagle": "eagle", "dflash": "dflash"}
SINGLE = "python train/launch.py --config_file recipes/accelerate/single.yaml"


def config_class(module):
    return next(v for k, v in vars(module).items() if k.endswith("Config") and isinstance(v, type)
                and v.__module__ == module.__name__)


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize("path", sorted(glob.glob("recipes/*/*.yaml")))
def test_every_recipe_loads_against_its_script(path, tmp_path):
    folder = path.split(os.sep)[-2]
    if folder == "accelerate":
        cfg = yaml.safe_load(open(path))
        assert "distributed_type" in cfg and "num_processes" in cfg
        return
    first = open(path).readline()
    launch = re.match(rf"# {re.escape(SINGLE)} train/(\w+)\.py --config {re.escape(path)}", first)
    assert launch, "the launch command comes first"
    script = launch.group(1)
    assert folder not in SCRIPTS or script == SCRIPTS[folder], "a recipe folder named after a script runs that script"
    argv = ["--config", path]
    recipe = yaml.safe_load(open(path))
    corpus = str(recipe.get("corpus", ""))
    if corpus.startswith("runs/"):
        # inputs an earlier step of the folder's build script writes (a fresh clone has no runs/): the script
        # must write each; stand-in files let the recipe load
        build = Path(path).parent / "build.sh"
        text = build.read_text() if build.exists() else ""
        stand_ins = []
        for i, (source, rows) in enumerate(corpus_parts(corpus, recipe.get("train_rows", 1))):
            assert Path(source).name in text and f"OUT:-{Path(source).parent}" in text, \
                f"nothing in {build} writes {source}"
            (tmp_path / f"corpus{i}.jsonl").write_text("")
            stand_ins.append(f"{tmp_path / f'corpus{i}.jsonl'}:{rows}")
        argv += ["--corpus", ",".join(stand_ins)]
    cfg = parse_config(config_class(importlib.import_module(f"draftkit.train.{script}")), argv)
    data = load_recipe(path, type(cfg))
    assert "export_dir" not in data, "the final model must follow --output_dir"
    assert not any("runs/" in str(data.get(k, "")) for k in ("target", "init_from", "init_heads")), \
        "recipes start from the shipped models, which a fresh checkout has"


@pytest.mark.parametrize("script", sorted(set(SCRIPTS.values())))
def test_every_flag_has_help(script, capsys):
    cls = config_class(importlib.import_module(f"draftkit.train.{script}"))
    assert issubclass(cls, TrainConfig)
    for f in cls.__dataclass_fields__.values():
        assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"
    with pytest.raises(SystemExit) as exit_:
        parse_config(cls, ["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "--max_steps" in out and "(default: " in out and "--config" in out


def test_flags_override_the_yaml_and_lists_take_both_forms():
    from draftkit.train.eagle import EagleTrainConfig

    path = "recipes/eagle/eagle3.yaml"
    cfg = parse_config(EagleTrainConfig, ["--config", path, "--lr", "1e-2", "--feature_layers", "[0, 2, -1]"])
    assert cfg.lr == 0.01 and cfg.feature_layers == [0, 2, -1] and cfg.ttt_steps == 3  # ttt_steps from the YAML
    assert parse_config(EagleTrainConfig, ["--feature_layers", "1", "-1"]).feature_layers == [1, -1]
    assert parse_config(EagleTrainConfig, ["--config", path, "--feature_layers", "[]"]).feature_layers == []
    cfg = parse_config(EagleTrainConfig, ["--output_dir", "elsewhere", "--wandb", "false"])
    assert cfg.cache_dir == "elsewhere/cache" and cfg.wandb is False


def test_unknown_recipe_key_is_an_error(tmp_path, capsys):
    from draftkit.train.pretrain import PretrainConfig

    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden_sise: 12\n")
    with pytest.raises(ValueError, match="unknown key 'hidden_sise' \\(did you mean 'hidden_size'\\?\\)"):
        load_recipe(str(bad), PretrainConfig)
    with pytest.raises(SystemExit) as exit_:
        parse_config(PretrainConfig, ["--config", str(bad)])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err  # one line, not argparse's usage block
    assert "did you mean 'hidden_size'?" in err and "learning" not in err, err  # no list of every key
    bad.write_text("zzz_qqq: 1\n")
    with pytest.raises(ValueError, match="unknown key 'zzz_qqq' for PretrainConfig$"):
        load_recipe(str(bad), PretrainConfig)


@pytest.mark.parametrize("argv, says", [
    (["--max_step", "5"], "unrecognized argument: '--max_step' (did you mean --max_steps?)"),  # no abbreviations
    (["--lr", "0.1", "stray"], "unrecognized argument: 'stray'"),
    (["--conf", "x.yaml"], "unrecognized argument: '--conf' (did you mean --config?)"),
])
def test_unknown_flags_are_one_line_naming_the_nearest_flag(argv, says, capsys):
    from draftkit.train.eagle import EagleTrainConfig

    with pytest.raises(SystemExit) as exit_:
        parse_config(EagleTrainConfig, argv)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("corpus, says", [("./nosuch.jsonl", "--corpus ./nosuch.jsonl: no such file"),
                                          ("data/x/y", "--corpus data/x/y: no such folder or file")])
def test_a_corpus_that_is_not_there_is_one_line_before_anything_loads(corpus, says, capsys):
    from draftkit.train.eagle import EagleTrainConfig

    with pytest.raises(SystemExit) as exit_:
        parse_config(EagleTrainConfig, ["--corpus", corpus])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and says in err, err


LAUNCH = [sys.executable, "train/launch.py", "--config_file", "recipes/accelerate/single.yaml"]


@pytest.mark.parametrize("script, argv, says", [
    ("pretrain", ["--config", "nosuch.yaml"], "pretrain.py: error: --config nosuch.yaml: no such file"),  # checked
    # before any process starts; the next one only by the launched script itself
    pytest.param("draft", ["--target", "runs/nosuch/final"], "draft.py: error: --target runs/nosuch/final: no such "
                 "folder", marks=pytest.mark.slow),
])
def test_errors_through_the_launcher_are_one_line_and_exit_code_2(script, argv, says, tmp_path):
    res = subprocess.run(LAUNCH + [f"train/{script}.py"] + argv + ["--output_dir", str(tmp_path / "out")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    err = res.stderr.strip()
    assert res.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1 and err.startswith(says), err
    assert not (tmp_path / "out").exists()


def test_a_missing_target_folder_is_named(tmp_path, monkeypatch):
    from draftkit import models
    from draftkit.train.config import TrainError, resolve_model

    monkeypatch.setattr(models, "hub_problem", lambda name: None)  # as if the hub answered (tests/test_hub_ids.py)

    with pytest.raises(TrainError, match="runs/target/final: no such folder"):
        resolve_model("runs/target/final", "target")
    assert resolve_model("default", "target").endswith("zoo/target")
    assert resolve_model("org/model", "target") == "org/model"  # a hub id passes through


# ----------------------------------------------------------------------------- tiny runs of every recipe


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small text corpus, a 300-token BPE tokenizer and a tiny random target saved like a real one."""
    root = tmp_path_factory.mktemp("tiny")
    rng = random.Random(0)
    names = ["alpha", "beta", "gamma", "delta", "value", "items", "result"]
    lines = []
    for i in range(1500):
        a, b = rng.choice(names), rng.choice(names)
        lines.append(f"def {a}_{i % 7}({b}): return {b} + {i % 10}")
    (root / "corpus.txt").write_text("\n".join(lines))
    tok = train_tokenizer(lines, vocab_size=300, save_dir=str(root / "tok"))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id)
    target = LlamaForCausalLM(cfg)
    with torch.no_grad():
        target.lm_head.weight.mul_(8)  # peaked distributions, as a trained target has
    target.save_pretrained(str(root / "target"))
    tok.save_pretrained(str(root / "target"))
    return root


COMMON = ["--seq_len", "32", "--batch_size", "4", "--lr", "0.01", "--warmup_steps", "2", "--eval_blocks", "4",
          "--eval_every", "100", "--cache_dir", "", "--wandb", "false"]


def recipe_argv(name, tiny, out, *extra):
    own = {
        "pretrain": ["--corpus", str(tiny / "corpus.txt"), "--tokenizer_dir", str(tiny / "tok"), "--hidden_size", "32",
                     "--num_layers", "1", "--num_heads", "2", "--intermediate_size", "64"],
        "draft": ["--hidden_size", "16", "--num_layers", "1", "--num_heads", "2", "--intermediate_size", "32"],
        "medusa": ["--num_heads", "2", "--eval_top_k", "3", "--tree_size", "4"],
        "eagle": ["--eval_tau_prompts", "0"],
    }[name]
    if name != "pretrain":
        own = ["--target", str(tiny / "target"), "--corpus", str(tiny / "corpus.txt"), *own]
    return [*own, *COMMON, "--output_dir", str(out), *extra]


def run_recipe(name, argv):
    return importlib.import_module(f"draftkit.train.{name}").main(argv)


@pytest.mark.parametrize("name", ["pretrain", "draft", "medusa", "eagle"])
def test_recipe_lowers_the_loss_and_resumes_exactly(name, tiny, tmp_path):
    steps = ["--max_steps", "10", "--checkpoint_every", "4"]
    straight = run_recipe(name, recipe_argv(name, tiny, tmp_path / "a", *steps))
    losses = [h["loss"] for h in straight["history"]]
    assert len(losses) == 10 and sum(losses[-3:]) < sum(losses[:3]) - 0.05, losses
    cut = run_recipe(name, recipe_argv(name, tiny, tmp_path / "b", *steps, "--stop_at_step", "6"))
    assert cut["stopped_at"] == 6 and not (tmp_path / "b" / "final").exists()
    resumed = run_recipe(name, recipe_argv(name, tiny, tmp_path / "b", *steps))
    assert resumed["resumed_from"] == 4  # lost at most one checkpoint interval
    assert [h["loss"] for h in resumed["history"]] == pytest.approx(losses[4:], rel=1e-5, abs=1e-6)
    assert (tmp_path / "b" / "final" / "train_report.json").exists()


def gpt2_target(tiny, folder) -> str:
    """A 4-layer GPT-2-style target (Conv1D layers, no `.layers` list) with the tiny tokenizer, saved."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(str(tiny / "target"))
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=4, n_head=4, n_positions=128,
                               bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def test_medusa2_adapters_fit_the_targets_own_layer_names(tiny, tmp_path):
    """The recipe's LoRA modules (q_proj ...) are not GPT-2's: one line naming its own, before any data is made;
    `--lora_targets auto` takes peft's default for the architecture (c_attn)."""
    argv = recipe_argv("medusa", tiny, tmp_path / "m2", "--mode", "medusa2", "--data_mode", "online",
                       "--max_steps", "2", "--lora_targets", "q_proj", "v_proj")
    argv[argv.index("--target") + 1] = gpt2_target(tiny, tmp_path / "gpt2")
    with pytest.raises(TrainError, match=r"lora_targets: \['q_proj', 'v_proj'\] match no module of it; "
                                         "GPT2LMHeadModel's linear layers are c_attn, c_fc, c_proj"):
        run_recipe("medusa", argv)
    assert not (tmp_path / "m2" / "final").exists()
    assert run_recipe("medusa", argv + ["--lora_targets", "auto"])["mode"] == "medusa2"


def test_auto_layers_fit_the_recipes_to_any_target_depth(tiny, tmp_path):
    """`feature_layers: auto` (the EAGLE-3 recipes) is (2, L//2, L-3) of the target's config: the shipped 24-layer
    target's [2, 12, 21], SmolLM2's [2, 15, 27]; shallow targets get three distinct layers, one too shallow a
    one-line error. The recipes then train on a 4-layer GPT-2-style target they were not written for."""
    from draftkit.drafters.reference_config import three_layers

    assert three_layers(24) == [2, 12, 21] and three_layers(30) == [2, 15, 27] and three_layers(7) == [2, 3, 4]
    assert [three_layers(n) for n in (4, 5, 6)] == [[1, 2, 3], [1, 2, 4], [1, 3, 5]]
    with pytest.raises(ValueError, match="4 or more layers"):
        three_layers(3)
    gpt2 = gpt2_target(tiny, tmp_path / "gpt2")
    for recipe, want in (("eagle3_reference", [1, 2, 3]), ("eagle3", [1, 2, 4])):
        argv = recipe_argv("eagle", tiny, tmp_path / recipe, "--config", f"recipes/eagle/{recipe}.yaml",
                           "--max_steps", "2", "--ttt_steps", "1", "--regenerate", "false")
        argv[argv.index("--target") + 1] = gpt2
        assert run_recipe("eagle", argv)["feature_layers"] == want, recipe
    with pytest.raises(TrainError, match="layers auto: three fused layers need a target of 4 or more layers"):
        run_recipe("eagle", recipe_argv("eagle", tiny, tmp_path / "shallow", "--feature_layers", "auto",
                                        "--max_steps", "2"))


def test_gradient_accumulation_and_a_transformers_schedule(tiny, tmp_path):
    report = run_recipe("pretrain", recipe_argv("pretrain", tiny, tmp_path / "acc", "--max_steps", "4",
                                                "--gradient_accumulation_steps", "2", "--lr_scheduler_type", "linear"))
    lrs = [h["lr"] for h in report["history"]]
    assert len(lrs) == 4 and lrs[1] == pytest.approx(0.01) and lrs[-1] == pytest.approx(0.0)  # warmup 2, linear to 0


def files_under(root: Path) -> dict:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()}


def test_a_finished_run_continues_into_the_same_wandb_run(tiny, tmp_path, monkeypatch):
    """A run shorter than checkpoint_every still ends with a checkpoint; raising --max_steps continues it
    (no restart), logs to the same W&B run, and nothing is written outside --output_dir."""
    from draftkit.train.pretrain import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    before = files_under(tiny)
    out = tmp_path / "out"
    args = ["--corpus", str(tiny / "corpus.txt"), "--tokenizer_dir", str(tiny / "tok"), "--hidden_size", "32",
            "--num_layers", "1", "--num_heads", "2", "--intermediate_size", "64", "--seq_len", "32",
            "--batch_size", "4", "--eval_blocks", "4", "--output_dir", str(out)]  # W&B on, the default cache_dir
    first = main(args + ["--max_steps", "3"])
    assert first["resumed_from"] == 0 and len(first["history"]) == 3
    ckpts = sorted((out / "checkpoints").glob("checkpoint*"))
    assert [p.name for p in ckpts] == ["checkpoint-3"]  # named by its step; 3 < checkpoint_every: the last step
    assert json.loads((ckpts[0] / STATE_FILE).read_text())["step"] == 3
    second = main(args + ["--max_steps", "5"])
    assert second["resumed_from"] == 3 and second["steps"] == 5 and len(second["history"]) == 2
    assert json.loads((out / "final" / "train_report.json").read_text())["steps"] == 5
    run_id = (out / "wandb_run_id").read_text().strip()
    runs = sorted(glob.glob(str(out / "wandb" / "offline-run-*")))
    # W&B names an offline run "offline-run-<time>-<id>" and appends "-1" when both start in the same second
    assert len(runs) == 2 and all(re.search(rf"-{run_id}(-\d+)?$", r) for r in runs), (run_id, runs)
    assert all(b"train/loss" in open(glob.glob(r + "/*.wandb")[0], "rb").read() for r in runs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], "written outside --output_dir"
    assert files_under(tiny) == before
    assert (out / "cache").is_dir() and (out / "final" / "model.safetensors").exists()


def test_interrupted_and_corrupt_checkpoints(tiny, tmp_path):
    from draftkit.train.config import TrainError
    from draftkit.train.pretrain import main

    out = tmp_path / "c"
    common = ["--max_steps", "4", "--checkpoint_every", "2"]
    main(recipe_argv("pretrain", tiny, out, *common, "--stop_at_step", "2"))
    (out / "checkpoints" / "checkpoint-7").mkdir()  # a save killed half-way: no trainer_state.json
    weights = glob.glob(str(out / "checkpoints" / "checkpoint-2" / "*.safetensors"))[0]
    shutil.copy(weights, tmp_path / "good.safetensors")
    with open(weights, "wb") as fh:
        fh.write(b"not a checkpoint")
    with pytest.raises(TrainError, match="corrupt or incompatible"):
        main(recipe_argv("pretrain", tiny, out, *common))
    assert not (out / "checkpoints" / "checkpoint-7").exists()
    shutil.copy(tmp_path / "good.safetensors", weights)
    # a folder of an older version, named by its index rather than its step, resumes as well
    (out / "checkpoints" / "checkpoint-2").rename(out / "checkpoints" / "checkpoint_0")
    assert main(recipe_argv("pretrain", tiny, out, *common))["resumed_from"] == 2
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["checkpoint-4", "checkpoint_0"]


# ----------------------------------------------------------------------------- the zoo build and the README


def readme_training_commands(readme: Path) -> list[str]:
    """The training commands of the "Training the drafters" code block (docs/training.md)."""
    text = readme.read_text()
    block = re.search(r"# Training the drafters.*?```bash\n(.*?)```", text, re.S).group(1)
    lines = [line.split("#")[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith(("accelerate launch", "python train/"))]


def fresh_clone(dest: Path) -> Path:
    """A git clone of the repository with the working tree's uncommitted changes on top (what the next
    commit holds): no runs/, no caches, nothing but what a newcomer gets."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=ROOT, capture_output=True, check=True).stdout
    if diff:
        subprocess.run(["git", "apply", "--whitespace=nowarn"], cwd=dest, input=diff, check=True)
    untracked = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                               capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, untracked):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    return dest


# a few steps of each command, small batches; everything goes to a folder outside the clone
FEW_STEPS = ["--max_steps", "2", "--eval_blocks", "1", "--batch_size", "2", "--seq_len", "64"]
FEW_ROWS = ["--train_rows", "4", "--shard_rows", "2", "--regen_prompt_len", "16"]  # the drafters' data path
SCRIPT_EXTRA = {"medusa": [*FEW_ROWS, "--eval_top_k", "3", "--tree_size", "4"],
                "eagle": [*FEW_ROWS, "--eval_tau_prompts", "1", "--eval_new_tokens", "4"],
                "dflash": [*FEW_ROWS, "--eval_tau_prompts", "1", "--eval_new_tokens", "4"],
                "draft": FEW_ROWS}


@pytest.mark.slow
def test_readme_training_commands_run_in_a_fresh_clone(tmp_path):
    clone = fresh_clone(tmp_path / "clone")
    git_status = ["git", "status", "--porcelain", "--ignored"]
    clean = subprocess.run(git_status, cwd=clone, capture_output=True, text=True, check=True).stdout
    commands = readme_training_commands(clone / "docs" / "training.md")
    assert len(commands) >= 6, commands
    out = tmp_path / "out"
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONDONTWRITEBYTECODE": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    env.pop("DRAFTKIT_ZOO", None)
    for i, command in enumerate(commands):
        script = re.findall(r"train/(\w+)\.py", command)[-1]  # the training script, after train/launch.py
        run_dir = out / f"{i}-{script}"
        argv = shlex.split(command) + FEW_STEPS + SCRIPT_EXTRA.get(script, []) + [
            "--output_dir", str(run_dir), "--cache_dir", str(out / "cache")]
        res = subprocess.run(argv, cwd=clone, env=env, capture_output=True, text=True, timeout=900)
        assert res.returncode == 0, f"{command}\n{res.stderr[-3000:]}"
        assert "--num_processes" not in res.stderr, f"{command}: accelerate warned\n{res.stderr[-2000:]}"
        report = json.loads((run_dir / "final" / "train_report.json").read_text())
        assert report["steps"] == 2
        shutil.rmtree(run_dir / "checkpoints")  # optimizer states no later command reads: keep the run's disk small
    status = subprocess.run(git_status, cwd=clone, capture_output=True, text=True, check=True).stdout
    assert status == clean, f"the README commands wrote into the clone:\n{status}"


def test_own_text_top1_is_the_one_node_drafts_the_target_kept():
    """decode_eval's own_text_top1: a draft that is the target itself agrees every step, a draft that is always
    wrong never; tau comes from the drafter's own cap."""
    from draftkit.drafters.standalone import StandaloneDrafter
    from draftkit.train.decode_eval import measure_tau
    from tests.models import tiny_model
    from tests.test_controller import WrongDrafter

    target = tiny_model("llama")
    stream = torch.arange(1, 60) % 50
    right = measure_tau(target, StandaloneDrafter(target, max_depth=3), stream, prompts=2, new_tokens=12,
                        prompt_len=8)
    assert right["own_text_top1"] == 1.0 and right["tau"] > 2
    wrong = measure_tau(target, WrongDrafter(target), stream, prompts=2, new_tokens=12, prompt_len=8)
    assert wrong["own_text_top1"] == 0.0 and wrong["tau"] == 1.0
