"""Every training recipe under bf16 autocast (`--mixed_precision bf16`, what the GPU builds and CPUs with native
bf16 products train in) runs and follows its fp32 run: each step's loss within a few percent of fp32's. An fp32
buffer filled from a bf16 product (the soft targets of EAGLE's loss) stopped the first bf16 EAGLE run at its
first step."""
import importlib

import pytest
import torch

from tests.parallel_common import make_tiny_run, train_argv

RECIPES = {  # name: (training script, its flags)
    "eagle2": ("eagle", []),
    "eagle3": ("eagle", ["--layout", "reference", "--feature_layers", "[1, 2, 3]",
                         "--ttt_steps", "2", "--draft_vocab_size", "64"]),
    "peagle": ("eagle", ["--layout", "reference", "--feature_layers", "[1, 2, 3]",
                         "--parallel_depths", "3", "--draft_vocab_size", "-1", "--feature_loss_weight", "0"]),
    "dflash": ("dflash", ["--block_size", "4", "--draft_layers", "1", "--anchors", "8"]),
    "medusa": ("medusa", ["--num_heads", "2", "--eval_top_k", "3", "--tree_size", "4"]),
    "draft": ("draft", ["--hidden_size", "16", "--num_layers", "1", "--num_heads", "2", "--intermediate_size", "32"]),
    "pretrain": ("pretrain", ["--hidden_size", "32", "--num_layers", "1", "--num_heads", "2",
                              "--intermediate_size", "64"]),
}
STEPS = 4


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    return make_tiny_run(tmp_path_factory.mktemp("precision"), layers=4)


def losses(tiny_run, out, script, flags, precision) -> list[float]:
    main = importlib.import_module(f"draftkit.train.{script}").main
    argv = train_argv(tiny_run, out, STEPS, *flags, "--mixed_precision", precision)
    if script in ("medusa", "draft", "pretrain"):  # no tau measurement at the end of these recipes
        at = argv.index("--eval_tau_prompts")
        del argv[at:at + 4]  # --eval_tau_prompts N --eval_new_tokens N
    if script == "pretrain":  # its own target, on the tiny run's tokenizer; none of the drafters' data flags
        for flag in ("--target", "--cache_dir", "--train_rows", "--shard_rows"):
            at = argv.index(flag)
            del argv[at:at + 2]
        argv += ["--tokenizer_dir", str(tiny_run / "target")]
    report = main(argv)
    assert report["mixed_precision"] == precision  # said in the report (and printed when the run starts)
    return [h["loss"] for h in report["history"]]


@pytest.mark.parametrize("name", RECIPES)
def test_bf16_autocast_trains_as_fp32_does(name, tiny_run, tmp_path):
    script, flags = RECIPES[name]
    fp32 = losses(tiny_run, tmp_path / "fp32", script, flags, "no")
    bf16 = losses(tiny_run, tmp_path / "bf16", script, flags, "bf16")
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
