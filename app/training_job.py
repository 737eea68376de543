"""`ppd train` for the loaded model, run by the chat app in a background process: the chat stays usable, the page
shows the phase, its progress and the time left, and a training stopped by a restart resumes from its work directory.
A trainer still running from an earlier app (or started by hand on the same folder) is adopted: followed and stoppable.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from app.readout import duration
from app.train_options import add_training_options
from app.trainer_lock import Trainer, describe, live_trainer
from ppd_core.training.cost import TrainSize
from ppd_core.atomic_files import atomic_write
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)

INTERRUPTED = 130  # `ppd train`'s exit code when interrupted (Ctrl+C, SIGTERM): stopped where it was, resumable
# short: the line has two lines of the page's side column (about 80 characters) for its stage, count, loss and time left
PHASES = {"load": "loading the model", "data": "reading conversations", "network": "building the training model",
          "answers": "answering", "held-out answers": "held-out answers", "train": "step", "evaluate": "evaluating",
          "acceptance": "measuring acceptance"}
ERROR_CHARACTERS = 60  # of the log's last line shown on the page (the whole of it is in train.log)
QUICK_SAMPLES = 200  # the smaller run the page offers: a tenth of the full run's conversations, at most this many


@dataclass
class TrainingStatus:
    state: str  # "none" (never started), "running", "stopping", "stopped" (resumable), "done", "failed"
    line: str  # for the page


def work_dir(name: str) -> Path:
    """Where a model's training keeps its answers, checkpoints, status and log (resumed from there)."""
    return Path(platformdirs.user_data_dir("ppd")) / "train" / name


class TrainingJob:
    """One model's training process; ``options`` are more `ppd train` arguments (tests make it small)."""

    def __init__(self, spec: str, name: str, options: list[str] | None = None):
        self.spec, self.name, self.options = spec, name, list(options or [])
        self.folder = work_dir(name)
        self.process: subprocess.Popen | None = None
        self.applied = False  # the chat has loaded what it trained
        self.stopped = False  # stopped on purpose (resumable), not failed
        self.stopping = False  # a Stop is waiting for the trainer to end (it may have let the folder go already)
        self._adopted_seen = False  # a trainer this app did not start was seen working in the folder

    @property
    def status_file(self) -> Path:
        return self.folder / "status.json"

    @property
    def size_file(self) -> Path:
        """The conversations asked for when the training started: a resume keeps them."""
        return self.folder / "size.json"

    def size(self, samples: int | None = None) -> TrainSize:
        """The run's size: ``ppd train``'s defaults and this job's options, with ``samples`` conversations if given."""
        return train_size([*self.options, *(["--samples", str(samples)] if samples else [])])

    def choices(self) -> tuple[int, int]:
        """(quick, full): the conversations of the smaller run the page offers, and of the full one."""
        full = self.size().samples
        return max(1, min(QUICK_SAMPLES, full // 10)), full

    def _chosen_samples(self, samples: int | None) -> list[str]:
        """``--samples`` for a start: ``samples``, kept in the folder; on a resume, those kept."""
        if samples is not None:
            atomic_write(self.size_file, json.dumps({"samples": samples}) + "\n")
            return ["--samples", str(samples)]
        try:
            kept = int(json.loads(self.size_file.read_text())["samples"])
        except (OSError, ValueError, TypeError, KeyError):
            return []
        return ["--samples", str(kept)] if kept > 0 else []

    @property
    def log_file(self) -> Path:
        return self.folder / "train.log"

    def start(self, samples: int | None = None) -> None:
        """Start (or resume: the work directory keeps what was done) `ppd train` for the model, on ``samples``
        conversations (None: as many as when it started, else the options' or ``ppd train``'s); PpdError (one line)
        where another trainer works in the folder (it goes on, and ``status`` follows it)."""
        if self._own_running:
            return
        if (other := live_trainer(self.folder)) is not None:
            raise PpdError(f"A training of PPD tokens for this model already runs ({describe(other)}): its progress "
                           "shows here.")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.status_file.unlink(missing_ok=True)
        self.stopped = False
        command = [sys.executable, "-m", "app.cli", "train", "--model", self.spec, "--work-dir", str(self.folder),
                   "--status", str(self.status_file), *self.options, *self._chosen_samples(samples)]
        with self.log_file.open("a") as log:  # a resume keeps the earlier runs' lines, after a separator line
            resumed = log.tell() > 0
            if resumed:
                log.write("\n")
            log.write(f"----- {time.strftime('%Y-%m-%d %H:%M:%S')}: {'resumed' if resumed else 'started'} `ppd train` -----\n")
            log.flush()
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent)

    @property
    def _own_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def adopted(self) -> Trainer | None:
        """A trainer this app did not start, working in the folder now (one that outlived an earlier app)."""
        trainer = None if self._own_running else live_trainer(self.folder)
        self._adopted_seen = self._adopted_seen or trainer is not None
        return trainer

    @property
    def ran(self) -> bool:
        """A trainer ran under this app: started here or adopted; once done, its tokens are new to the loaded model."""
        return self.process is not None or self._adopted_seen

    @property
    def running(self) -> bool:
        return self._own_running or self.adopted() is not None

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the training where it is (resumable): SIGTERM, then a kill if it has not ended within ``timeout``.
        Until it has ended, ``status`` says it is stopping (no Resume offered before the trainer is gone)."""
        self.stopping = True
        try:
            self._stop(timeout)
        finally:
            self.stopping = False

    def _stop(self, timeout: float) -> None:
        if self._own_running:
            self.stopped = True
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        elif (other := self.adopted()) is not None:
            self.stopped = True
            other.stop(timeout)

    def terminate(self) -> None:
        """Ask the training to stop where it is (resumable) without waiting: ppd is quitting (``wait`` after)."""
        if self._own_running:
            self.stopped = True
            self.process.terminate()
        elif (other := self.adopted()) is not None:
            self.stopped = True
            other.terminate()

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a terminated training to end; it ends by itself after that."""
        if self.process is not None:
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("the training is still stopping; it resumes where it stopped")

    def status(self) -> TrainingStatus:
        reported = self._reported()
        if self.stopping:
            return TrainingStatus("stopping", "Stopping the training where it is (it resumes from there)…")
        if self.running:
            return TrainingStatus("running", progress_line(reported))
        if self.process is not None and self.process.returncode not in (0, None, INTERRUPTED) and not self.stopped:
            error = self._last_log_line()
            error = error if len(error) <= ERROR_CHARACTERS else error[:ERROR_CHARACTERS - 1] + "…"
            return TrainingStatus("failed", f"Training stopped with an error: {error}")
        if reported.get("phase") == "done":
            return TrainingStatus("done", "Training finished.")
        if self.folder.is_dir() and any(self.folder.iterdir()):
            return TrainingStatus("stopped", "A training of PPD tokens for this model was stopped: it resumes where it was.")
        return TrainingStatus("none", "")

    def _reported(self) -> dict:
        """The trainer's status file, with its ``age``: how long ago it was written (a stage with no count is
        written once, as it begins)."""
        try:
            reported = json.loads(self.status_file.read_text())
            reported["age"] = max(0.0, time.time() - self.status_file.stat().st_mtime)
            return reported
        except (OSError, ValueError, TypeError):
            return {}

    def _last_log_line(self) -> str:
        try:
            lines = [line.strip() for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "no log"
        return lines[-1][-200:] if lines else "no log"


def progress_line(reported: dict) -> str:
    """'Training PPD tokens (6/7): step 12/40, loss 2.314, ~3 min left…' from a status file's record
    (``StatusFile``): the stage's number, its count, the latest loss and the time left in the stage at its rate so
    far; a stage with no count says how long it has run. Short: at most two lines in the page's side column."""
    if not reported:
        return "Training PPD tokens: starting the trainer…"
    phase, done, total = reported.get("phase", ""), int(reported.get("done", 0)), int(reported.get("total", 0))
    stage = f" ({reported['stage']}/{reported['stages']})" if reported.get("stages") else ""
    seconds = float(reported.get("phase_seconds", 0.0))
    parts = [PHASES.get(phase, phase)]
    if not total:
        parts[0] += f", {duration(seconds + float(reported.get('age', 0.0)))}"
    else:
        parts[0] += f" {done}/{total}"
        if "loss" in reported:
            parts.append(f"loss {float(reported['loss']):.3f}")
        counted = done - int(reported.get("first", 0))  # done in this stage since its clock started
        if counted > 0 and done < total:
            parts.append(f"~{duration(seconds / counted * (total - done))} left")
    return f"Training PPD tokens{stage}: {', '.join(parts)}…"




def train_size(options: list[str]) -> TrainSize:
    """The size of a `ppd train` run given ``options``, read by ``ppd train``'s own parser (its defaults included)."""
    parser = argparse.ArgumentParser(add_help=False)
    add_training_options(parser)
    try:
        args = parser.parse_known_args(options)[0]
    except SystemExit:  # an option ``ppd train`` refuses: it says so when it runs
        args = parser.parse_known_args([])[0]
    return TrainSize(samples=args.samples, epochs=args.epochs, cuts=args.cuts, ensemble=args.ensemble,
                     max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                     generation_batch=args.generation_batch, eval_limit=args.eval_limit,
                     acceptance_prompts=args.acceptance_prompts)
