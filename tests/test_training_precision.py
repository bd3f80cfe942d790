"""Every training recipe under bf16 autocast (`--mixed_precision bf16`, what the GPU builds and CPUs with native
bf16 products train in) runs and follows its fp32 run: each step's loss within a few percent of fp32's. An fp32
buffer filled from a bf16 product (the soft targets of EAGLE's loss) stopped the first bf16 EAGLE run at its
first step."""
import importlib

import pytest
import torch

from tests.parallel_common import make_tiny_run, train_argv
from tests.test_training import recipe_argv, tiny  # noqa: F401  (tiny: the fixture recipe_argv's runs read)

RECIPES = {  # name: (training script, its flags); the drafters of hidden states on a 4-layer target (tiny_run)
    "eagle2": ("eagle", ["--layout", "draftkit"]),
    "eagle3": ("eagle", ["--layout", "reference", "--feature_layers", "[1, 2, 3]",
                         "--ttt_steps", "2", "--draft_vocab_size", "64"]),
    "peagle": ("eagle", ["--layout", "reference", "--feature_layers", "[1, 2, 3]",
                         "--parallel_depths", "3", "--draft_vocab_size", "-1", "--feature_loss_weight", "0"]),
    "dflash": ("dflash", ["--block_size", "4", "--draft_layers", "1", "--anchors", "8"]),
    "medusa": ("medusa", []),  # the rest as tests/test_training.py runs them (recipe_argv)
    "draft": ("draft", []),
    "pretrain": ("pretrain", []),
}
STEPS = 4


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("precision"), layers=4)


def losses(argv: list[str], script: str, precision: str) -> list[float]:
    report = importlib.import_module(f"draftkit.train.{script}").main([*argv, "--mixed_precision", precision])
    assert report["mixed_precision"] == precision  # said in the report (and printed when the run starts)
    return [h["loss"] for h in report["history"]]


def argv_of(name: str, tiny_run, tiny, out) -> list[str]:
    script, flags = RECIPES[name]
    if flags:
        return train_argv(tiny_run, out, STEPS, *flags)
    return recipe_argv(script, tiny, out, "--max_steps", str(STEPS))


@pytest.mark.parametrize("name", RECIPES)
def test_bf16_autocast_trains_as_fp32_does(name, tiny_run, tiny, tmp_path):
    script = RECIPES[name][0]
    fp32 = losses(argv_of(name, tiny_run, tiny, tmp_path / "fp32"), script, "no")
    bf16 = losses(argv_of(name, tiny_run, tiny, tmp_path / "bf16"), script, "bf16")
    assert len(bf16) == STEPS and all(torch.isfinite(torch.tensor(bf16)))
    assert bf16 == pytest.approx(fp32, rel=0.05), (fp32, bf16)


@pytest.mark.parametrize("native, expected", [(True, "bf16"), (False, "no")])
def test_auto_takes_bf16_on_a_cpu_with_native_bf16_products(native, expected, monkeypatch):
    from draftkit.train import loop

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("draftkit.drafters.draft_dtype.native_bf16", lambda device: native)
    assert loop._mixed_precision("auto") == expected
    assert loop._mixed_precision("no") == "no"  # an explicit choice always wins
