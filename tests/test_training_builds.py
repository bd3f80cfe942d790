"""The build scripts (recipes/zoo/build.sh, recipes/smollm2/build.sh: dry runs whose commands each script parses)
and training in several processes (ranks read disjoint rows; two processes match one)."""
import glob
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from draftkit.drafters.reference_config import three_layers
from draftkit.train.config import parse_config
from tests.test_training import ROOT, config_class, recipe_argv, run_recipe, tiny  # noqa: F401 (tiny: a fixture)


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_zoo_build_commands_parse_and_finished_stages_are_skipped(tmp_path, mode):
    tmp_path = tmp_path / "runs with spaces"  # every path is quoted
    done = tmp_path / "target" / "final"
    done.mkdir(parents=True)
    (done / "train_report.json").write_text("{}")
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path), "CORPUS": "python"}
    argv = ["bash", "recipes/zoo/build.sh"] + (["--gpu"] if mode == "gpu" else [])
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    assert f"= target: done ({done})" in out
    stages = [line[2:].split(" > ")[0] for line in out.splitlines() if line.startswith("+ python train/")
              and "ship.py" not in line]
    # prepare (the drafters' data), draft, eagle2, medusa1, medusa2, eagle3, peagle, dflash
    assert len(stages) == 8
    assert any("recipes/eagle/peagle.yaml" in c and shlex.split(c)[shlex.split(c).index("--init_from") + 1]
               == f"{tmp_path}/eagle3/final" for c in stages)
    for command in stages:
        words = shlex.split(command)
        if "train/prepare_data.py" in words:  # (2, L//2, L-3) and the last, from the target's config when it loads
            assert words[words.index("--layers") + 1] == "auto"
        script = Path(words[1]).stem
        cls = config_class(importlib.import_module("draftkit.train." + script))
        cfg = parse_config(cls, words[2:])  # prepare_data reads a recipe's data keys (reads_other_recipes)
        assert cfg.corpus == "python" and cfg.target == str(done) and cfg.output_dir.startswith(str(tmp_path))
        assert cfg.regenerate and cfg.cache_dir == str(tmp_path / "cache")  # one regenerated data set for all
        if mode == "gpu":  # the trainings in bf16; prepare_data keeps the target's own dtype
            assert cfg.train_rows == 16384 and (script == "prepare_data"
                                                or cfg.mixed_precision == "bf16" and not cfg.wandb)


def launch_two(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """train/eagle.py in two CPU processes (gloo) through the README's launcher and recipes/accelerate/cpu_ddp.yaml."""
    cmd = [sys.executable, "train/launch.py", "--config_file", "recipes/accelerate/cpu_ddp.yaml", "train/eagle.py",
           *argv]
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


@pytest.mark.slow
def test_two_processes_read_disjoint_rows_match_one_process_and_resume(tiny, tmp_path):
    """Two ranks of batch 4 train what one process of batch 8 does (ranks read disjoint halves of each global
    batch; the logged loss is the global batch's); a two-rank run stopped at step 2 resumes with both ranks to the
    same losses; only the main process writes the final model and logs to W&B."""
    # no feature noise: each rank draws its own, which the comparison with one process would read as a difference
    steps = ["--max_steps", "4", "--checkpoint_every", "2", "--lr", "0.003", "--feature_noise", "0"]
    one = run_recipe("eagle", recipe_argv("eagle", tiny, tmp_path / "one", *steps, "--batch_size", "8"))
    two_dir = tmp_path / "two"
    argv = recipe_argv("eagle", tiny, two_dir, *steps, "--batch_size", "4", "--wandb", "true")
    launch_two(argv + ["--stop_at_step", "2"], tmp_path)
    assert not (two_dir / "final").exists()
    launch_two(argv, tmp_path)
    report = json.loads((two_dir / "final" / "train_report.json").read_text())
    assert report["resumed_from"] == 2
    assert report["first_train"]["loss"] == pytest.approx(one["history"][2]["loss"], rel=2e-3)  # step 3: resumed
    assert report["last_train"]["loss"] == pytest.approx(one["history"][-1]["loss"], rel=2e-3)
    assert report["tokens_seen"] == one["tokens_seen"]
    run_id = (two_dir / "wandb_run_id").read_text().strip()
    runs = sorted(glob.glob(str(two_dir / "wandb" / "offline-run-*")))
    # the two launches (stopped, resumed) log to one W&B run, and only the main process logs: one folder each
    assert len(runs) == 2 and all(re.search(rf"-{run_id}(-\d+)?$", r) for r in runs), (run_id, runs)


def test_ranks_read_disjoint_rows_of_each_global_batch(tiny):
    """TargetData's row order: rank r of N reads the r-th slice of the batch one process of N x B reads."""
    from accelerate import Accelerator

    from draftkit.train.targetdata import TargetData

    class Rank:
        def __init__(self, index, count):
            self.process_index, self.num_processes = index, count

    def order(index, count, batch, rows):
        data = TargetData.__new__(TargetData)
        data.cfg = type("C", (), {"batch_size": batch})()
        data.rows, data.seed, data.acc = torch.zeros(rows, 4), 0, Rank(index, count)
        return [data.indices(s).tolist() for s in range(6)]
    for rows in (37, 48):  # an epoch that ends inside a global batch, and one that does not
        whole = order(0, 1, 8, rows)
        halves = [order(r, 2, 4, rows) for r in range(2)]
        assert [a + b for a, b in zip(*halves)] == whole
    assert all(not set(a) & set(b) for a, b in zip(*halves))  # 48 rows: within an epoch no row is read twice
    assert Accelerator  # imported: the class the real ranks come from


@pytest.mark.parametrize("mode", ["cpu", "gpu"])
def test_real_target_build_commands_parse(tmp_path, mode):
    """recipes/smollm2/build.sh (dry run): prompts, data, EAGLE-3 (on a CPU: then continued on further conversations
    and on two, then three more corpora read as one), EAGLE-2 (on a CPU: continued alike, then on two corpora more),
    the standalone draft,
    Medusa-1, DFlash, P-EAGLE (from the EAGLE-3 draft), the evaluation of all of them and one export each, loaded
    back and checked; every command parsed by its script as the real run would, every path quoted."""
    out = tmp_path / "runs with spaces"
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out)}
    argv = ["bash", "recipes/smollm2/build.sh"] + (["--gpu"] if mode == "gpu" else [])
    printed = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    commands = [shlex.split(line[2:].split(" > ")[0]) for line in printed.splitlines() if line.startswith("+ python")]
    cpu = mode == "cpu"
    stages = ["chat_prompts"] + (["self_instruct"] if mode == "gpu" else []) + ["prepare_data", "eagle"] \
        + (["eagle", "chat_prompts", "eagle", "chat_prompts", "self_instruct", "eagle", "self_instruct", "eagle"]
           if cpu else []) \
        + ["eagle"] + (["eagle", "eagle", "eagle", "chat_prompts", "self_instruct", "eagle"] if cpu else []) \
        + ["draft", "medusa", "dflash", "eagle", "compare"] \
        + ["export"] * 6
    assert [Path(c[1]).stem for c in commands] == stages
    from draftkit.train.self_instruct import parse_args as self_instruct_args

    (out / "prompts.jsonl").write_text("")
    if mode == "gpu":  # the target's own chat requests spread among the templated ones: the data's corpus
        si = self_instruct_args(commands.pop(1)[2:])
        assert si.mix_into == si.exclude[0] == str(out / "prompts.jsonl") and si.target == "smollm2-135m"
        corpus = out / "prompts_self.mixed.jsonl"
    else:
        corpus = out / "prompts.jsonl"
    more = [c for c in commands[2:] if Path(c[1]).stem in ("chat_prompts", "self_instruct")]  # CPU: further prompts
    data, evaluate, exports = commands[1], commands[-7], commands[-6:]
    trains = [c for c in commands[2:-7] if c not in more]
    written = [c[c.index("--out") + 1] for c in more]
    for path in [corpus] + written:  # what the prompt stages write: the recipes check that their corpus exists
        Path(path).write_text("")
    cfg = parse_config(config_class(importlib.import_module("draftkit.train.prepare_data")), data[2:])
    runs = [parse_config(config_class(importlib.import_module(f"draftkit.train.{Path(c[1]).stem}")), c[2:])
            for c in trains]
    from draftkit.train.targetdata import corpus_parts

    for c in [cfg] + runs:  # every stage reads shards a prompt stage's file was answered into: the same data settings
        assert {source for source, _ in corpus_parts(c.corpus, c.train_rows)} <= {str(corpus)} | set(written)
        assert c.cache_dir == str(out / "cache") and c.regenerate and c.regen_dtype == cfg.regen_dtype
        assert (c.seq_len, c.messages_column, c.shard_rows, c.regen_max_new_tokens) == \
            (cfg.seq_len, "messages", cfg.shard_rows, cfg.regen_max_new_tokens)
        assert c.train_rows <= cfg.train_rows
    eagle3s, eagle2s = (runs[:5], runs[5:10]) if cpu else (runs[:1], runs[1:2])  # each with its continuations
    draft, medusa, dflash, peagle = runs[-4:]
    eagle3, eagle2 = eagle3s[-1], eagle2s[-1]
    assert eagle3.train_rows == eagle2s[-2 if cpu else -1].train_rows == cfg.train_rows  # whole first corpora
    for train in eagle3s + [peagle]:  # EAGLE-3 (and its continuations) and P-EAGLE read (2, L//2, L-3) of 30
        assert train.layout == "reference" and train.feature_layers == "auto"
    assert all(e.layout == "reference" and list(e.feature_layers) == [] for e in eagle2s)
    assert dflash.target_layers == "auto" and cfg.layers[:3] == three_layers(30)  # stored once, shared
    assert medusa.share_lm_head and peagle.parallel_depths > 1 and draft.hidden_size < 576
    final = out / "eagle3" / "final"
    if mode == "gpu":
        assert eagle3.mixed_precision == "bf16" and eagle3.train_rows == 8192
        assert all(r.mixed_precision == "bf16" and r.max_steps == 1000 for r in (draft, medusa, dflash, peagle))
    else:
        for runs_, name in ((eagle3s, "eagle3"), (eagle2s, "eagle2")):  # each continues the one before
            outs = [r.output_dir for r in runs_]
            assert outs == [str(out / name)] + [str(out / f"{name}-{i}") for i in range(2, len(runs_) + 1)]
            assert [r.init_from for r in runs_[1:]] == [o + "/final" for o in outs[:-1]]
        seed2, self_instruct = more[1], self_instruct_args(more[2][2:])
        # each prompt file leaves out the user texts of every file before it
        assert more[0][more[0].index("--exclude") + 1:] == [str(out / "prompts.jsonl")]
        assert seed2[seed2.index("--exclude") + 1:] == [str(out / "prompts.jsonl"), written[0]]
        assert self_instruct.exclude == [str(out / "prompts.jsonl"), written[0], written[1]]
        assert self_instruct.target == "smollm2-135m"
        assert self_instruct_args(more[3][2:]).exclude == [str(out / "prompts.jsonl"), *written[:3]]
        two, three = [(written[1], eagle3.train_rows), (written[2], 960)], [(written[3], 960)]
        for runs_ in (eagle3s, eagle2s[:-1]):  # each reads the two corpora as one, then a third too
            assert corpus_parts(runs_[-2].corpus, eagle3.train_rows) == two
            assert corpus_parts(runs_[-1].corpus, eagle3.train_rows) == two + three
        # EAGLE-2 then continues on two corpora no stage before read: 384 more conversations, 960 more requests
        seed3, self5 = more[4], self_instruct_args(more[5][2:])
        assert seed3[seed3.index("--exclude") + 1:] == [str(out / "prompts.jsonl"), written[0], written[1]]
        assert self5.exclude == [str(out / "prompts.jsonl"), written[0], written[1], written[4]]
        assert corpus_parts(eagle2.corpus, eagle2.train_rows) == [(written[4], 384), (written[5], 960)]
        final = out / "eagle3-5" / "final"
    assert peagle.init_from == str(final)
    from draftkit.eval.cli import parse_args

    flags = parse_args(evaluate[2:])
    finals = {k: r.output_dir + "/final" for k, r in
              [("eagle", eagle2), ("peagle", peagle), ("dflash", dflash), ("medusa", medusa), ("draft", draft)]}
    assert flags.eagle3 == str(final) == exports[0][2]
    assert {k: getattr(flags, k) for k in finals} == finals
    assert [e[2] for e in exports[1:]] == [finals[k] for k in ("eagle", "peagle", "dflash", "medusa", "draft")]
    from draftkit.train.export import build_parser

    for e in exports:  # each export names the real target (the standalone draft's vocabulary check) and checks
        args = build_parser().parse_args(e[2:])
        assert args.format == "vllm" and args.target == "smollm2-135m" and args.check
    assert set(flags.drafters.split(",")) >= {"eagle3", "eagle", "peagle", "dflash", "medusa", "standalone"}


def test_real_target_build_refuses_a_folder_with_a_comma(tmp_path):
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(tmp_path / "a,b")}
    done = subprocess.run(["bash", "recipes/smollm2/build.sh"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "comma" in done.stderr and not (tmp_path / "a,b").exists()


def test_tokens_seen_by_reads_a_runs_report_or_the_zoo_manifest(tmp_path):
    """A continued run counts from its starting model's total: a run folder's train_report.json, a shipped model's
    manifest entry (the zoo keeps no report), else 0."""
    from draftkit.zoo import tokens_seen_by
    from draftkit.zoo import ZOO, manifest

    (tmp_path / "train_report.json").write_text(json.dumps({"tokens_seen": 1234, "steps": 2}))
    assert tokens_seen_by(tmp_path) == 1234
    assert tokens_seen_by(tmp_path / "elsewhere") == 0
    entry = manifest()["models"]["smollm2-135m/eagle"]
    assert tokens_seen_by(ZOO / "smollm2-135m" / "eagle") == entry["tokens_seen"] > 0
