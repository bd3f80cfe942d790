"""A training run's settings as a user meets them: bad loop settings, YAML types and typos, output folders and
too small a corpus refused in one line before anything loads; a resume that keeps its checkpoint's settings and
shape; a finished run left as it is."""
import pytest

from draftkit.train.loop import cli
from tests.test_training import recipe_argv, tiny  # noqa: F401 (tiny: the module's fixture)


def test_changed_model_shape_is_a_one_line_error(tiny, tmp_path, capsys):
    from draftkit.train.pretrain import main

    out = tmp_path / "shape"
    main(recipe_argv("pretrain", tiny, out, "--max_steps", "2"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli(main, recipe_argv("pretrain", tiny, out, "--max_steps", "4", "--hidden_size", "48"))
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert str(out) in err and "(300, 32)" in err and "(300, 48)" in err, err
    with pytest.raises(SystemExit):
        cli(main, recipe_argv("pretrain", tiny, out, "--max_steps", "1"))
    assert "past --max_steps 1" in capsys.readouterr().err


def test_a_resume_keeps_the_runs_settings_and_a_finished_run_is_left_as_it_is(tiny, tmp_path, capsys):
    """Started again with another learning rate, a run refuses in one line naming the change (it would have trained
    on with the checkpoint's); started again as it was after it finished, it says so and rewrites nothing."""
    from draftkit.train.pretrain import main

    out = tmp_path / "settings"
    main(recipe_argv("pretrain", tiny, out, "--max_steps", "3", "--stop_at_step", "2", "--checkpoint_every", "1"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli(main, recipe_argv("pretrain", tiny, out, "--max_steps", "3", "--lr", "0.1"))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and "lr 0.01 -> 0.1" in err, err
    assert main(recipe_argv("pretrain", tiny, out, "--max_steps", "3"))["resumed_from"] == 2
    report = out / "final" / "train_report.json"
    before = report.read_text()
    cli(main, recipe_argv("pretrain", tiny, out, "--max_steps", "3"))  # exits 0: nothing to do
    assert "finished at step 3" in capsys.readouterr().err and report.read_text() == before


@pytest.mark.parametrize("flags, says", [
    (["--batch_size", "0"], "batch_size must be >= 1, got 0"),
    (["--lr", "0"], "lr must be > 0"),
    (["--eval_every", "0"], "eval_every must be >= 1"),
    (["--lr_scheduler_type", "bogus"], "lr_scheduler_type 'bogus' is not one of"),
    (["--mixed_precision", "fp8"], "mixed_precision 'fp8' is not one of"),
    (["--seq_len", "1"], "seq_len must be >= 2"),
])
def test_bad_loop_settings_are_one_line_errors_before_anything_loads(flags, says, capsys):
    from draftkit.train.config import parse_config
    from draftkit.train.eagle import EagleTrainConfig

    with pytest.raises(SystemExit) as exit_:
        parse_config(EagleTrainConfig, flags)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and says in err, err


def test_recipe_values_of_the_wrong_type_and_typos_name_the_file(tmp_path, capsys):
    """A YAML value of the wrong type names its file and key; prepare_data reads any recipe's keys, yet a key no
    recipe has (a typo) is still an error, not a silent default."""
    from draftkit.train.config import parse_config
    from draftkit.train.eagle import EagleTrainConfig
    from draftkit.train.prepare_data import PrepareConfig

    cases = [(EagleTrainConfig, "max_steps: 2.5\n", "max_steps must be an integer, got 2.5"),
             (EagleTrainConfig, "feature_layers: [1, x]\n", "feature_layers must be a list of integers or auto"),
             (PrepareConfig, "train_rowz: 8\nlr: 0.1\n", "unknown key 'train_rowz' (did you mean 'train_rows'?)")]
    for i, (cls, text, says) in enumerate(cases):
        recipe = tmp_path / f"r{i}.yaml"
        recipe.write_text(text)
        with pytest.raises(SystemExit):
            parse_config(cls, ["--config", str(recipe)])
        err = capsys.readouterr().err
        assert str(recipe) in err and says in err, err
    (tmp_path / "ok.yaml").write_text("train_rows: 8\nlr: 0.1\nttt_steps: 2\n")  # other recipes' keys: fine
    assert parse_config(PrepareConfig, ["--config", str(tmp_path / "ok.yaml")]).train_rows == 8


def test_prepare_data_help_lists_the_data_flags_only_yet_takes_the_training_ones(capsys):
    """prepare_data's --help lists what shapes the data (corpus, seq_len, regen_*, layers) and not the training loop's
    settings, which it still takes (a shared recipe or a copied command line sets them) and ignores."""
    from draftkit.train.config import parse_config
    from draftkit.train.prepare_data import PrepareConfig

    with pytest.raises(SystemExit):
        parse_config(PrepareConfig, ["--help"])
    listed = capsys.readouterr().out
    assert all(f"--{k}" in listed for k in ("corpus", "seq_len", "regen_max_new_tokens", "layers", "cache_dir"))
    assert not any(f"--{k} " in listed for k in ("lr", "max_steps", "batch_size", "wandb", "eval_every", "seed"))
    assert parse_config(PrepareConfig, ["--lr", "0.5", "--max_steps", "3", "--seq_len", "64"]).seq_len == 64


def test_output_folders_that_are_not_a_runs_are_refused(tmp_path, capsys):
    from draftkit.train.config import parse_config
    from draftkit.train.draft import DraftConfig

    (tmp_path / "afile").write_text("")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text("{}")
    for flags, says in ((["--output_dir", str(tmp_path / "afile")], "is a file, not a folder"),
                        (["--export_dir", str(tmp_path / "other")], "holds files no training run wrote"),
                        (["--lora_r", "8"], "lora_r 8: LoRA adapters train on a model given by --init_from")):
        with pytest.raises(SystemExit):
            parse_config(DraftConfig, flags)
        assert says in capsys.readouterr().err


def test_a_corpus_too_small_for_a_held_out_block_stops_before_training(tiny, tmp_path, capsys):
    from draftkit.train.pretrain import main

    small = tmp_path / "small.txt"
    small.write_text("\n".join((tiny / "corpus.txt").read_text().splitlines()[:3]))
    with pytest.raises(SystemExit) as exit_:
        cli(main, recipe_argv("pretrain", tiny, tmp_path / "out", "--corpus", str(small)))
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "less than one block of --seq_len" in err and not (tmp_path / "out" / "final").exists()
