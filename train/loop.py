"""The one training loop every recipe runs (pretrain, draft, medusa, eagle).

A recipe script builds its models and says what a step computes; the loop does the rest:

    with Loop(cfg, "draftkit-draft") as loop:
        (draft,) = loop.prepare(draft)                 # AdamW, a transformers scheduler, accelerate, resume
        result = loop.run(step_loss, evaluate)         # accumulation, clipping, eval, W&B, checkpoints, tqdm
        ...save the model under loop.final_dir; loop.write_report(...)

- step_loss(i) -> (loss, {metric: value}) is called for micro-batch i = step * gradient_accumulation_steps + k:
  the data a step sees depends only on its number, so a resumed run draws what the killed one would have.
- evaluate() -> {metric: value} is the held-out hook: every eval_every steps and once at the end; its last
  result is result.final. Numbers are logged as heldout/<metric>; other values are only returned.
- Devices, DDP / FSDP / DeepSpeed and mixed precision come from accelerate; mixed_precision "auto" keeps the
  accelerate config's fp16 / bf16, else takes bf16 on a GPU that has it, else fp32.
- Checkpoints: accelerate's save_state under output_dir/checkpoints/checkpoint-<step> (named by the optimizer
  step it holds; the newest checkpoint_total_limit kept) every checkpoint_every steps and always at the last
  step, each closed by a trainer_state.json (step, parameter shapes) written last: a folder without it is an
  interrupted save. Started again, a run resumes from the complete one of the highest step (folders of older
  runs, named checkpoint_<index>, count too); with a larger max_steps a finished run goes on.
- Every held-out evaluation is also appended to output_dir/heldout_history.jsonl with its step and the tokens
  trained on so far (`tokens_per_row` x rows seen; a recipe sets loop.tokens_per_row to the trained tokens of its
  rows): the scaling curve of the run, kept across resumes. A run that continues a trained model counts from
  what that model had seen (the recipe calls loop.continue_from(its folder)): tokens_seen is always the model's
  total, tokens_seen_before the part its starting model brought (loop.token_counts, in every report).
- W&B through accelerate's trackers, offline unless WANDB_MODE says otherwise, under output_dir/wandb; the
  run id is kept in output_dir/wandb_run_id, so a resumed run logs to the same W&B run.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

import torch

from draftkit.drafters import draft_dtype
from draftkit.runlog import append_history, read_history
from draftkit.zoo import tokens_seen_by
from draftkit.train.config import TrainError

STATE_FILE = "trainer_state.json"
RUN_ID_FILE = "wandb_run_id"


@dataclasses.dataclass
class RunResult:
    start_step: int  # the step this process started from (0, or a resumed checkpoint's)
    step: int  # the step it reached
    history: list[dict]  # per step run here: train metrics (mean over micro-batches) and lr
    final: dict  # the last evaluate() result (empty when stopped early)
    stopped: bool  # stopped at stop_at_step, as if killed
    seconds: float


def _mixed_precision(value: str) -> str | None:
    """auto: the accelerate config's fp16 / bf16 if it sets one, else bf16 where bf16 products run natively (a GPU
    that has them; a CPU with AMX or AVX512-BF16: SmolLM2's EAGLE-3 recipe trained 1.8x faster there, each step's
    loss within 0.1% of fp32's), else fp32 (bf16 emulated on a CPU without bf16 units is far slower)."""
    if value != "auto":
        return value
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "no") != "no":
        return None  # the accelerate config's choice
    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "no"
    return "bf16" if draft_dtype.native_bf16(torch.device("cpu")) else "no"


def _step(path: Path) -> int:
    """The optimizer step a complete checkpoint holds (its trainer_state.json: names changed with versions)."""
    return json.loads((path / STATE_FILE).read_text())["step"]


def _shapes(modules) -> dict[str, list[int]]:
    """Every tensor's shape in the modules' state dicts (what a checkpoint can be loaded into)."""
    return {f"{type(m).__name__}.{name}": list(t.shape) for m in modules for name, t in m.state_dict().items()}


def _shape_change(folder: str, old: dict, new: dict) -> str | None:
    """One line naming the folder and both shapes when `old` (a checkpoint's) and `new` differ."""
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if not differ:
        return None
    name = differ[0]

    def shape(s):
        return "absent" if s.get(name) is None else "(" + ", ".join(map(str, s[name])) + ")"

    def count(s):
        return sum(math.prod(v) for v in s.values())

    return (f"{folder} holds checkpoints of another model shape: {name} is {shape(old)} there and {shape(new)} "
            f"in this run ({len(differ)} tensors differ; {count(old):,} vs {count(new):,} parameters); use a new "
            f"--output_dir, or delete {folder}/checkpoints to start over")


class RunFinished(Exception):
    """A finished run started again with the same max_steps: said in one line, nothing rewritten (exit code 0)."""


# settings a resumed run may change: where things go, how often it evaluates or checkpoints, tracking, and what only
# the first start reads (its initial weights); every other one shapes the run, so a resume must keep it
FREE_ON_RESUME = {"max_steps", "output_dir", "export_dir", "cache_dir", "checkpoint_every", "checkpoint_total_limit",
                  "wandb", "wandb_project", "stop_at_step", "init_from", "init_heads", "init_from_target", "data_mode",
                  "tree_size"}


def _settings(cfg) -> dict:
    """The settings that shape a run's trajectory (JSON values), saved with each checkpoint."""
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(cfg), default=str)).items()
            if k not in FREE_ON_RESUME and not k.startswith("eval_")}


def _settings_change(old: dict | None, new: dict) -> str:
    """'lr 0.001 -> 0.1, seed 0 -> 7' for the settings a checkpoint was made with that differ now ('' if none, or
    for a checkpoint that saved none)."""
    if not old:
        return ""
    return ", ".join(f"{k} {old[k]!r} -> {new[k]!r}" for k in sorted(old) if k in new and old[k] != new[k])


class Loop:
    def __init__(self, cfg, project: str):
        from accelerate import Accelerator
        from accelerate.state import AcceleratorState
        from accelerate.utils import ProjectConfiguration, set_seed

        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        self.cfg, self.project = cfg, cfg.wandb_project or project
        os.makedirs(cfg.output_dir, exist_ok=True)
        # accelerate keeps one state per process: a second run in the same process (a notebook, a test) with
        # another precision would be refused. The processes' own state (PartialState: ranks, process group) stays
        reset = getattr(AcceleratorState, "_reset_state", None)  # (accelerate's own, not public: kept optional)
        if reset is not None:
            reset(reset_partial_state=False)
        self.acc = Accelerator(
            # without a GPU, cpu=True is what makes accelerate join the processes torchrun started (gloo, MULTI_CPU)
            # instead of each running alone
            cpu=not torch.cuda.is_available(),
            mixed_precision=_mixed_precision(cfg.mixed_precision),
            gradient_accumulation_steps=cfg.gradient_accumulation_steps,
            log_with=["wandb"] if cfg.wandb else None,
            project_config=ProjectConfiguration(project_dir=cfg.output_dir))
        set_seed(cfg.seed)
        self.final_dir = cfg.export_dir or os.path.join(cfg.output_dir, "final")
        self.checkpoints = Path(cfg.output_dir) / "checkpoints"
        # a rank's own seed, for recipes that sample windows at random (pretrain); recipes on TargetData share cfg.seed
        # and read disjoint slices of each global batch (train/targetdata.py)
        self.data_seed = cfg.seed + self.acc.process_index
        self.start_step = 0
        self.models: tuple = ()
        self.tokens_per_row = float(getattr(cfg, "seq_len", 0))  # trained tokens per row (recipes refine it)
        self.tokens_before = 0  # tokens the starting model had already trained on (continue_from)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()

    # ------------------------------------------------------------------------------------------ setup

    def prepare(self, *modules, param_groups: list[dict] | None = None) -> tuple:
        """AdamW over the trainable parameters (or param_groups), the configured scheduler, accelerate's
        prepare, then resume from the newest complete checkpoint. Returns the prepared modules."""
        cfg, acc = self.cfg, self.acc
        groups = param_groups or [{"params": [p for m in modules for p in m.parameters() if p.requires_grad]}]
        opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)
        sched = self._scheduler(opt)
        shapes = _shapes(modules)
        *self.models, self.opt, self.sched = acc.prepare(*modules, opt, sched)
        self.start_step = self._resume(shapes)
        self.shapes = shapes
        acc.print(f"precision: {acc.mixed_precision} autocast" if acc.mixed_precision != "no" else "precision: fp32")
        self._start_tracking()
        return tuple(self.models)

    def _scheduler(self, opt):
        from transformers import get_scheduler

        cfg, n = self.cfg, self.acc.num_processes  # accelerate steps a prepared scheduler once per process
        warmup = cfg.warmup_steps or int(cfg.warmup_ratio * cfg.max_steps)
        if warmup * 2 > cfg.max_steps:  # a recipe's warmup on a shortened run: said, not silently a near-zero lr
            self.acc.print(f"warning: warmup of {warmup} steps in a run of {cfg.max_steps}: the learning rate stays "
                           f"below its peak for most of it (--warmup_steps sets it)")
        extra = {"min_lr_rate": cfg.min_lr_ratio} if cfg.lr_scheduler_type == "cosine_with_min_lr" else None
        try:
            return get_scheduler(cfg.lr_scheduler_type, opt, num_warmup_steps=warmup * n,
                                 num_training_steps=cfg.max_steps * n, scheduler_specific_kwargs=extra)
        except ValueError as err:
            raise TrainError(f"lr_scheduler_type {cfg.lr_scheduler_type!r}: {err}") from None

    def _resume(self, shapes: dict) -> int:
        acc, folder = self.acc, self.cfg.output_dir
        found = list(self.checkpoints.glob("checkpoint[-_]*")) if self.checkpoints.is_dir() else []
        done = sorted((p for p in found if (p / STATE_FILE).exists()), key=_step)
        legacy = sorted(self.checkpoints.glob("step_*")) if self.checkpoints.is_dir() else []
        if legacy and not done:  # would otherwise start over silently
            raise TrainError(f"{self.checkpoints} holds checkpoints of an older draftkit ({legacy[-1].name}, ...); "
                             f"finish that run with the version that wrote it, or move them away to start over")
        if acc.is_main_process:  # interrupted saves: nothing to resume from, and in the way of a new save
            for p in found:
                if not (p / STATE_FILE).exists():
                    shutil.rmtree(p, ignore_errors=True)
        acc.wait_for_everyone()
        if not done:
            return 0
        last = done[-1]
        state = json.loads((last / STATE_FILE).read_text())
        change = _shape_change(folder, state.get("shapes", {}), shapes)
        if change:
            raise TrainError(change)
        changed = _settings_change(state.get("settings"), _settings(self.cfg))
        if changed:
            raise TrainError(f"{folder} holds a run at step {state['step']} made with other settings ({changed}); "
                             f"resume it with its own, or use a new --output_dir")
        self._finished(state["step"])
        if state["step"] > self.cfg.max_steps:
            raise TrainError(f"{folder} holds a run at step {state['step']}, past --max_steps {self.cfg.max_steps}; "
                             f"raise --max_steps or use a new --output_dir")
        try:
            acc.load_state(str(last))
        except Exception as err:  # a truncated or foreign file: say which and how to recover
            msg = " ".join(str(err).split())[:300]
            raise TrainError(f"checkpoint {last} is corrupt or incompatible ({type(err).__name__}: {msg}); delete it "
                             f"to resume from an older one, or start over with a new --output_dir") from None
        acc.print(f"resumed from {last} at step {state['step']}")
        return state["step"]

    def _finished(self, step: int) -> None:
        """RunFinished when the run already reached max_steps and wrote its report: nothing is trained or rewritten."""
        report = Path(self.final_dir) / "train_report.json"
        if step != self.cfg.max_steps or not report.exists():
            return
        try:
            steps = json.loads(report.read_text()).get("steps")
        except (OSError, ValueError):
            return
        if steps == step:
            raise RunFinished(f"{self.cfg.output_dir} finished at step {step} and {report} holds its report: nothing "
                              f"to do (raise --max_steps to train on from there, or use a new --output_dir)")

    def _start_tracking(self) -> None:
        cfg = self.cfg
        if not cfg.wandb:
            return
        id_file = Path(cfg.output_dir) / RUN_ID_FILE
        if self.acc.is_main_process and not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:8])
        self.acc.wait_for_everyone()
        run_id = id_file.read_text().strip()
        self.acc.init_trackers(self.project, config=dataclasses.asdict(cfg), init_kwargs={"wandb": {
            "dir": cfg.output_dir, "name": Path(cfg.output_dir).name, "id": run_id, "resume": "allow"}})

    # ------------------------------------------------------------------------------------------ the loop

    def run(self, step_loss: Callable[[int], tuple], evaluate: Callable[[], dict] | None = None,
            desc: str = "train", show: tuple[str, ...] = ()) -> RunResult:
        """Train from start_step to max_steps (see the module docstring)."""
        from tqdm import tqdm

        cfg, acc = self.cfg, self.acc
        accum = cfg.gradient_accumulation_steps
        params = [p for m in self.models for p in m.parameters() if p.requires_grad]
        history: list[dict] = []
        t0 = time.perf_counter()
        bar = tqdm(range(self.start_step, cfg.max_steps), initial=self.start_step, total=cfg.max_steps, desc=desc,
                   disable=not acc.is_local_main_process)
        for step in bar:
            sums: dict[str, float] = {}
            for k in range(accum):
                with acc.accumulate(*self.models):
                    with acc.autocast():
                        loss, metrics = step_loss(step * accum + k)
                    acc.backward(loss)
                    if acc.sync_gradients and cfg.grad_clip > 0:
                        acc.clip_grad_norm_(params, cfg.grad_clip)
                    self.opt.step()
                    self.sched.step()
                    self.opt.zero_grad(set_to_none=True)
                for name, v in {"loss": loss, **metrics}.items():
                    sums[name] = sums.get(name, 0.0) + float(v.detach() if torch.is_tensor(v) else v) / accum
            if acc.num_processes > 1:  # the global batch's figures: every rank's mean, averaged (one all-reduce)
                names = sorted(sums)
                means = acc.reduce(torch.tensor([sums[k] for k in names], device=acc.device), "mean").tolist()
                sums = dict(zip(names, means))
            metrics = {**sums, "lr": self.sched.get_last_lr()[0]}
            history.append(metrics)
            logged = {f"train/{k}": v for k, v in metrics.items()}
            if evaluate and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.max_steps:
                logged.update(self._evaluate(evaluate, step + 1)[1])
            acc.log(logged, step=step + 1)
            bar.set_postfix({k: f"{metrics[k]:.3f}" for k in ("loss", *show) if k in metrics})
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.max_steps:
                self.save(step + 1)
            if step + 1 == cfg.stop_at_step and step + 1 < cfg.max_steps:
                return RunResult(self.start_step, step + 1, history, {}, True, time.perf_counter() - t0)
        seconds = time.perf_counter() - t0
        if evaluate:
            acc.print(f"{desc}: the final held-out evaluation at step {cfg.max_steps} (the model is saved after it)")
        final, logged = self._evaluate(evaluate, cfg.max_steps) if evaluate else ({}, {})
        if logged:
            acc.log(logged, step=cfg.max_steps)
        return RunResult(self.start_step, cfg.max_steps, history, final, False, seconds)

    def tokens_seen(self, step: int) -> int:
        """Tokens the model has trained on after `step` steps of this run, its starting model's included."""
        cfg = self.cfg
        rows = step * getattr(cfg, "batch_size", 1) * cfg.gradient_accumulation_steps * self.acc.num_processes
        return self.tokens_before + int(rows * self.tokens_per_row)

    def continue_from(self, folder) -> None:
        """This run continues the trained model in `folder`: its tokens count from what that model had seen."""
        self.tokens_before = tokens_seen_by(folder)

    def token_counts(self, step: int) -> dict:
        """The report's token counts after `step` steps: the model's total and its starting model's part."""
        return {"tokens_seen": self.tokens_seen(step), "tokens_seen_before": self.tokens_before}

    def _evaluate(self, evaluate, step: int) -> tuple[dict, dict]:
        with torch.no_grad(), self.acc.autocast():
            res = evaluate()
        scalars = {k: v for k, v in res.items() if isinstance(v, (int, float))}
        if self.acc.is_main_process:
            append_history(self.cfg.output_dir, {"step": step, "tokens_seen": self.tokens_seen(step), **scalars})
        return res, {f"heldout/{k}": v for k, v in scalars.items()} | {"heldout/tokens_seen": self.tokens_seen(step)}

    def heldout_history(self) -> list[dict]:
        """The run's evaluations, one per step (a resumed run's repeats replaced by the newest)."""
        return read_history(self.cfg.output_dir)

    def save(self, step: int) -> None:
        """A checkpoint of everything prepared (accelerate's save_state), closed by its trainer_state.json."""
        acc = self.acc
        acc.wait_for_everyone()
        folder = self.checkpoints / f"checkpoint-{step}"
        acc.save_state(str(folder))
        if acc.is_main_process:  # written last: a folder without it is an interrupted save
            (folder / STATE_FILE).write_text(json.dumps({"step": step, "max_steps": self.cfg.max_steps,
                                                         "shapes": self.shapes, "settings": _settings(self.cfg)}))
            done = sorted((p for p in self.checkpoints.glob("checkpoint[-_]*") if (p / STATE_FILE).exists()),
                          key=_step)
            for old in done[:-max(1, self.cfg.checkpoint_total_limit)]:
                shutil.rmtree(old, ignore_errors=True)
        acc.wait_for_everyone()

    # ------------------------------------------------------------------------------------------ the end

    def log(self, metrics: dict, step: int) -> None:
        self.acc.log(metrics, step=step)

    def unwrap(self, module):
        return self.acc.unwrap_model(module)

    def write_report(self, report: dict, folder: str | None = None) -> None:
        """train_report.json in the final folder (the manifest reads it), and the report on stdout."""
        report["mixed_precision"] = self.acc.mixed_precision  # (the caller's report: what main() returns says it too)
        if self.acc.is_main_process:
            os.makedirs(folder or self.final_dir, exist_ok=True)
            with open(os.path.join(folder or self.final_dir, "train_report.json"), "w") as fh:
                json.dump(report, fh, indent=2)
            self.acc.print(json.dumps(report))

    def finish(self) -> None:
        """End tracking; also stop W&B's background service so that a later run in the same process
        (tests, notebooks) starts a fresh one and writes its own run file."""
        self.acc.end_training()
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank leaves together: a process that exits with its group alive aborts (gloo's threads)
            torch.distributed.barrier()
            torch.distributed.destroy_process_group()


def save_hf(model, tokenizer, out_dir: str, dtype=torch.float16) -> None:
    """Save a Hugging Face model (+ tokenizer) in half precision safetensors."""
    os.makedirs(out_dir, exist_ok=True)
    model = model.to(dtype)
    model.save_pretrained(out_dir, safe_serialization=True)
    model.to(torch.float32)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def cli(main, argv=None) -> None:
    """Run a recipe's main(argv); a TrainError (or a corpus that cannot be read) ends it with one line on stderr
    and exit code 2."""
    from draftkit.corpus import CorpusError

    name = os.path.basename(sys.argv[0])
    try:
        main(argv)
    except (TrainError, CorpusError) as err:
        print(f"{name}: error: {err}", file=sys.stderr)
        sys.exit(2)
    except RunFinished as done:
        print(f"{name}: {done}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"{name}: interrupted; the same command resumes where it stopped (its last complete checkpoint or "
              f"data shard)", file=sys.stderr)
        sys.exit(130)
