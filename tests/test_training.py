"""Recipes: every YAML loads against its script; few-step runs lower the loss, log to an
offline W&B run, resume exactly where they stopped, and refuse corrupt checkpoints."""
import glob
import importlib
import math
import os
import random

import pytest
import yaml

from train.common import load_recipe
from train.data import train_tokenizer

RECIPE_SCRIPTS = {"zoo": "train.pretrain", "draft": "train.draft", "medusa": "train.medusa", "eagle": "train.eagle"}


def config_class(module):
    return next(v for k, v in vars(module).items() if k.endswith("Config") and isinstance(v, type)
                and v.__module__ == module.__name__)


@pytest.mark.parametrize("path", sorted(glob.glob("recipes/*/*.yaml")))
def test_every_recipe_loads_against_its_script(path):
    folder = path.split(os.sep)[-2]
    if folder == "accelerate":
        cfg = yaml.safe_load(open(path))
        assert "distributed_type" in cfg and "num_processes" in cfg
        return
    first = open(path).readline()
    assert first.startswith("# accelerate launch train/") and path in first, "the launch command comes first"
    module = importlib.import_module(RECIPE_SCRIPTS[folder])
    cls = config_class(module)
    cls(**load_recipe(path, cls))  # unknown keys or wrong names raise


def test_unknown_recipe_key_is_an_error(tmp_path):
    from train.pretrain import PretrainConfig

    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden_sise: 12\n")
    with pytest.raises(ValueError, match="unknown keys.*hidden_sise"):
        load_recipe(str(bad), PretrainConfig)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """A small text corpus and a 300-token BPE tokenizer trained on it."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    names = ["alpha", "beta", "gamma", "delta", "value", "items", "result"]
    lines = []
    for i in range(1500):
        a, b = rng.choice(names), rng.choice(names)
        lines.append(f"def {a}_{i % 7}({b}): return {b} + {i % 10}")
    text = root / "corpus.txt"
    text.write_text("\n".join(lines))
    train_tokenizer(lines, vocab_size=300, save_dir=str(root / "tok"))
    return str(text), str(root / "tok")


def pretrain_args(corpus, tok, out, *extra):
    return ["--corpus", corpus, "--tokenizer_dir", tok, "--hidden_size", "32", "--num_layers", "1",
            "--num_heads", "2", "--intermediate_size", "64", "--seq_len", "32", "--batch_size", "4",
            "--lr", "0.01", "--warmup_steps", "2", "--eval_blocks", "4", "--eval_every", "100",
            "--cache_dir", "", "--output_dir", str(out), *extra]


def test_pretrain_lowers_the_loss_and_logs_to_wandb(tiny_corpus, tmp_path):
    from train.pretrain import main

    corpus, tok = tiny_corpus
    report = main(pretrain_args(corpus, tok, tmp_path / "run", "--max_steps", "30"))
    assert report["heldout_loss"] < math.log(300) - 1.0  # well below a uniform guess
    runs = glob.glob(str(tmp_path / "run" / "wandb" / "offline-run-*" / "*.wandb"))
    assert runs, "no offline W&B run was written"
    assert b"train/loss" in open(runs[0], "rb").read()
    assert os.path.exists(tmp_path / "run" / "final" / "model.safetensors")


def test_resumed_run_matches_an_uninterrupted_one(tiny_corpus, tmp_path):
    from train.pretrain import main

    corpus, tok = tiny_corpus
    common = ["--max_steps", "6", "--checkpoint_every", "2"]
    stopped = main(pretrain_args(corpus, tok, tmp_path / "a", *common, "--stop_at_step", "3"))
    assert stopped == {"start_step": 0, "stopped_at": 3}
    resumed = main(pretrain_args(corpus, tok, tmp_path / "a", *common))
    assert resumed["start_step"] == 2  # lost at most one checkpoint interval
    straight = main(pretrain_args(corpus, tok, tmp_path / "b", *common))
    assert resumed["heldout_loss"] == pytest.approx(straight["heldout_loss"], abs=1e-5)


def test_corrupt_checkpoint_is_a_clear_error(tiny_corpus, tmp_path):
    from train.pretrain import main

    corpus, tok = tiny_corpus
    common = ["--max_steps", "4", "--checkpoint_every", "2"]
    main(pretrain_args(corpus, tok, tmp_path / "c", *common, "--stop_at_step", "2"))
    weights = glob.glob(str(tmp_path / "c" / "checkpoints" / "step_2" / "*.safetensors"))[0]
    with open(weights, "wb") as fh:
        fh.write(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="corrupt or incompatible"):
        main(pretrain_args(corpus, tok, tmp_path / "c", *common))


def test_draft_distillation_lowers_the_kl(tiny_corpus, tmp_path):
    from train.draft import main as distil
    from train.pretrain import main as pretrain

    corpus, tok = tiny_corpus
    pretrain(pretrain_args(corpus, tok, tmp_path / "t", "--max_steps", "20", "--wandb", "false"))
    args = ["--target", str(tmp_path / "t" / "final"), "--corpus", corpus, "--hidden_size", "16",
            "--num_layers", "1", "--num_heads", "2", "--intermediate_size", "32", "--seq_len", "32",
            "--batch_size", "4", "--lr", "0.01", "--warmup_steps", "2", "--eval_blocks", "4", "--cache_dir", "",
            "--output_dir", str(tmp_path / "d")]
    short = distil(args + ["--max_steps", "1", "--wandb", "false", "--output_dir", str(tmp_path / "d0")])
    longer = distil(args + ["--max_steps", "25"])
    assert longer["heldout_loss"] < short["heldout_loss"]
    assert longer["top1_agreement"] > short["top1_agreement"]
    assert glob.glob(str(tmp_path / "d" / "wandb" / "offline-run-*" / "*.wandb"))
