"""`ppd train`: learn prompt tokens by self-distillation, with a status file the chat page follows."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.commands.loading import ProgressBars, load_engine
from app.commands.options import add_model_options, model_threads
from app.questions import DEFAULT_QUESTIONS, read_questions
from app.train_options import add_training_options
from ppd_core.errors import PpdError


def register(commands) -> None:
    """Add `ppd train`'s sub-parser to ``commands``."""
    train = commands.add_parser("train", help="learn prompt tokens by self-distillation")
    add_training_options(train)
    add_model_options(train)


def run(args: argparse.Namespace) -> int:
    from ppd_core.drafters.prompt_tokens import PromptTokens

    for option in ("samples", "epochs", "cuts", "accumulate", "ensemble", "lr", "max_prompt_tokens", "max_new_tokens", "generation_batch"):
        if not getattr(args, option) > 0:
            raise PpdError(f"--{option.replace('_', '-')} must be positive, got {getattr(args, option)}")
    if args.eval_limit < 0:
        raise PpdError(f"--eval-limit must be 0 (no evaluation) or positive, got {args.eval_limit}")
    if not 0 <= args.curriculum < 1:
        raise PpdError(f"--curriculum must be a fraction of the steps, at least 0 and below 1, got {args.curriculum}")
    if not 0 <= args.acceptance_prompts <= 40:  # the calibration conversations shipped
        raise PpdError(f"--acceptance-prompts must be between 0 (skip) and 40, got {args.acceptance_prompts}")
    # user files fail here, in one line, before the model loads and answers are generated
    if args.data is not None and not args.data.is_file():
        raise PpdError(f"conversation file not found: {args.data}")
    eval_questions = (args.eval_questions or DEFAULT_QUESTIONS) if args.eval_limit > 0 else None
    if eval_questions is not None:
        read_questions(eval_questions, args.eval_limit)
    if args.init is not None:
        PromptTokens.load(args.init).with_ensemble_size(args.ensemble)  # a file or a size it cannot become: one line, now
    from app.trainer_lock import WorkDirLock

    held: list[WorkDirLock] = []

    def claim(folder: Path) -> None:
        """One training per work directory, held until this run ends; a busy folder is one line (exit 2)."""
        if not held:
            held.append(WorkDirLock(folder).acquire())

    try:
        from app.signals import sigterm_interrupts

        with sigterm_interrupts():  # the chat app's Stop: the run stops where it is, resumable, and lets the folder go
            if args.work_dir is not None:
                claim(args.work_dir)  # before the model loads (else once loaded: the default folder is named after it)
            # the first stage is on the page at once (a folder held by another trainer is refused above, its status kept)
            status = StatusFile(args.status, training_stages(eval_questions is not None, args.acceptance_prompts > 0))
            status.write("load", 0, 0)
            return train_model(args, eval_questions, claim, status)
    finally:
        for lock in held:
            lock.release()


def training_stages(evaluates: bool, measures_acceptance: bool) -> tuple[str, ...]:
    """The phases a `ppd train` run goes through, in order (``StatusFile`` numbers them for the page)."""
    return ("load", "data", "network", "answers", *(("held-out answers",) if evaluates else ()), "train",
            *(("evaluate",) if evaluates else ()), *(("acceptance",) if measures_acceptance else ()))


def train_model(args: argparse.Namespace, eval_questions: Path | None, claim, status: StatusFile) -> int:
    """`ppd train` once its input is checked: load, answer, train, evaluate, save, measure the acceptance."""
    from tqdm import tqdm

    from ppd_core.engine_calibration import record_acceptance
    from ppd_core.engine_load import model_signature, user_prompt_tokens_path
    from ppd_core.loading import load_model
    from ppd_core.training.pipeline import TrainRun, run_training
    from ppd_core.training.trainer import TrainConfig

    if model_threads(args):
        import torch

        torch.set_num_threads(model_threads(args))
    # training differentiates through the transformers model: auto means its own weights here
    loaded = load_model(args.model, "none" if args.quant == "auto" else args.quant, args.device, args.dtype)
    config = TrainConfig(
        samples=args.samples, epochs=args.epochs, cuts=args.cuts, accumulate=args.accumulate,
        ensemble_size=args.ensemble, lr=args.lr, max_prompt_tokens=args.max_prompt_tokens,
        max_new_tokens=args.max_new_tokens, generation_batch=args.generation_batch, seed=args.seed, loss=args.loss,
        curriculum=args.curriculum,
    )
    out = args.out or user_prompt_tokens_path(loaded.name, model_signature(loaded))  # where the engine looks first
    run = TrainRun(out=out, data=args.data, eval_questions=eval_questions, eval_limit=args.eval_limit, work_dir=args.work_dir,
                   init=args.init, claim=claim)
    bars: dict[str, tqdm] = {}

    def progress(phase: str, done: int, total: int, numbers: dict) -> None:
        status.write(phase, done, total, loss=numbers.get("loss"))
        if not total:  # a stage with no count (reading the data, building the training model): the status says it
            return
        bar = bars.get(phase) or bars.setdefault(phase, tqdm(total=total, desc=phase, unit="step" if phase == "train" else "item"))
        bar.n = done
        if "loss" in numbers:
            bar.set_postfix(loss=f"{numbers['loss']:.3f}")
        bar.refresh()
        if done >= total:
            bar.close()

    trained = run_training(loaded, config, run, progress)
    print(json.dumps(trained.training, indent=2))
    print(f"prompt tokens written to {out}")
    if args.acceptance_prompts:
        status.write("acceptance", 0, 0)
        del loaded  # the training model; decoding loads its own
        args.prompt_tokens, args.tree = str(out), "medium"
        engine = load_engine(args, auto_calibrate=False)
        record = record_acceptance(engine, ProgressBars(lambda _, done, total: status.write("acceptance", done, total)),
                                   prompts=args.acceptance_prompts)
        print(f"acceptance record ({engine.loaded.info.name}, {engine.loaded.quant}) written to {record}")
    status.write("done", 1, 1, force=True)
    return 0


class StatusFile:
    """`ppd train --status FILE`: the stage (its number among ``stages``), its progress, the seconds it has run and the
    latest loss, rewritten at most once a second (atomically: a reader never sees half of it); no file, nothing written.
    A stage's clock and ``first`` count start at its first report (a resumed stage's rate is this run's alone)."""

    def __init__(self, path: Path | None, stages: tuple[str, ...] = ()):
        import time

        self.path, self.stages, self.clock, self.written = path, stages, time.monotonic, 0.0
        self.phase, self.total, self.first, self.phase_started = None, 0, 0, 0.0

    def write(self, phase: str, done: int, total: int, force: bool = False, loss: float | None = None) -> None:
        if self.path is None:
            return
        now = self.clock()
        if (phase, total) != (self.phase, self.total):  # a new stage (or a new count within it: acceptance's parts)
            self.phase, self.total, self.first, self.phase_started, force = phase, total, done, now, True
        if not force and now - self.written < 1.0 and done < total:
            return
        from ppd_core.atomic_files import atomic_write

        self.written = now
        record = {"phase": phase, "done": done, "total": total, "first": self.first,
                  "phase_seconds": round(now - self.phase_started, 1)}
        if phase in self.stages:
            record.update(stage=self.stages.index(phase) + 1, stages=len(self.stages))
        if loss is not None:
            record["loss"] = round(float(loss), 4)
        atomic_write(self.path, json.dumps(record) + "\n")
