"""One training per work directory, and nothing lost when a training or the app stops: `ppd train` locks its folder
(a second start is one line), a restarted app adopts a trainer still running (progress, Stop), a lock left by a killed
trainer blocks nothing, quitting the chat stops its trainer resumably, a resume appends to train.log, and a kill
while the teacher-answer cache is rewritten loses no answer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import psutil
import pytest

from app.cli import main
from app.model_host import ModelHost
from app.trainer_lock import OWNER_NAME, Trainer, live_trainer
from app.training_job import TrainingJob, work_dir
from ppd_core import Engine, EngineConfig
from ppd_core.errors import PpdError
from ppd_core.training.answers import read_cache

ROOT = Path(__file__).resolve().parent.parent
SEPARATOR = "----- "  # how a run's lines begin in train.log


@pytest.fixture
def data_home(tmp_path, monkeypatch) -> Path:
    """The work directories (``work_dir``) of this test only; the trainers it starts inherit it."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def options(tmp_path) -> list[str]:
    """A training of the default model that answers 200 short conversations one at a time: it runs long enough to be
    found running, reports its progress from the first answer, and is stopped by the test."""
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say something about {n}."}]}) + "\n"
                            for n in range(200)))
    return ["--samples", "200", "--generation-batch", "1", "--max-new-tokens", "8", "--data", str(data),
            "--eval-limit", "0", "--acceptance-prompts", "0", "--device", "cpu", "--threads", "1"]


def wait_for(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def answering(folder: Path) -> bool:
    """The trainer has written its first answer (and its status file says so)."""
    try:
        return json.loads((folder / "status.json").read_text())["done"] >= 1
    except (OSError, ValueError, KeyError):
        return False


def kill_left_over(folder: Path) -> None:
    """A trainer a failed test left running."""
    try:
        pid = json.loads((folder / OWNER_NAME).read_text())["pid"]
        psutil.Process(pid).kill()
    except (OSError, ValueError, KeyError, psutil.Error):
        pass


def refuse_model_load(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("`ppd train` loaded a model although another trainer holds the folder")

    monkeypatch.setattr("ppd_core.loading.load_model", refuse)


OLD_APP = "import sys; from app.training_job import TrainingJob; TrainingJob('default', sys.argv[1], sys.argv[2:]).start()"


@pytest.mark.slow
def test_a_restarted_app_adopts_the_running_trainer_and_a_second_start_is_one_line(data_home, options, capsys,
                                                                                   monkeypatch):
    folder = work_dir("adopted")
    # an earlier chat app started the training, then quit without stopping it: the trainer outlives it
    subprocess.run([sys.executable, "-c", OLD_APP, "adopted", *options], cwd=ROOT, check=True, timeout=60)
    try:
        wait_for(lambda: answering(folder), 300, "the trainer did not start answering")
        trainer = live_trainer(folder)
        assert trainer is not None

        job = TrainingJob("default", "adopted", options)  # the restarted app's
        status = job.status()
        assert job.running and status.state == "running", status
        assert status.line.startswith("Training PPD tokens (4/5): answering "), status.line

        with pytest.raises(PpdError, match=f"already runs .*process {trainer.pid}") as refused:
            job.start()  # a second start from the page: one line, and the running one goes on
        assert "\n" not in str(refused.value) and live_trainer(folder) == trainer

        refuse_model_load(monkeypatch)  # by hand on the command line: one line, exit 2, before any model loads
        code = main(["train", "--model", "default", "--work-dir", str(folder), *options[:-2]])  # (not --threads here)
        out, err = capsys.readouterr()
        assert (code, out) == (2, "") and err.count("\n") == 1, err
        assert err.startswith(f"ppd: error: {folder} is already in use by another training, process {trainer.pid} ")

        job.stop()  # Stop on the restarted app's page
        assert trainer.process() is None and live_trainer(folder) is None
        assert not job.running and job.status().state == "stopped"
        assert "ppd: interrupted" in job.log_file.read_text()  # stopped where it was (SIGTERM), not killed
    finally:
        kill_left_over(folder)


@pytest.mark.slow
def test_after_a_crash_the_training_resumes_with_its_log_and_quitting_the_chat_stops_it(data_home, options):
    engine = Engine.load(EngineConfig(model="default", device="cpu", tree="medium", auto_calibrate=False))
    service = ModelHost(engine, spec="default", train_options=options)
    job = service.training()
    try:
        job.start()
        wait_for(lambda: live_trainer(job.folder) is not None, 120, "the trainer did not take the lock")
        job.process.send_signal(signal.SIGKILL)  # a crash: its lock's side file stays behind, naming a dead process
        job.process.wait(30)
        earlier = job.log_file.read_text()
        assert json.loads((job.folder / OWNER_NAME).read_text())["pid"] == job.process.pid
        assert live_trainer(job.folder) is None

        restarted = ModelHost(engine, spec="default", train_options=options)  # the chat, started again
        resumed = restarted.training()
        assert resumed.status().state == "stopped"  # resumable, not running
        resumed.start()
        wait_for(lambda: live_trainer(resumed.folder) is not None, 120, "the resumed trainer did not take the lock")
        assert live_trainer(resumed.folder).pid == resumed.process.pid  # the stale lock did not block it
        log = resumed.log_file.read_text()
        assert log.startswith(earlier) and log[len(earlier):].lstrip("\n").startswith(SEPARATOR), log[-2000:]

        restarted.shutdown()  # what quitting `ppd chat` runs: asks nothing, stops the trainer where it was
        assert resumed.process.returncode == 130 and live_trainer(resumed.folder) is None
        assert resumed.status().state == "stopped" and not (resumed.folder / OWNER_NAME).exists()
    finally:
        kill_left_over(job.folder)
        engine.close()


KILLED_HOLDER = ("import os, signal, sys; from app.trainer_lock import WorkDirLock; "
                 "lock = WorkDirLock(sys.argv[1]).acquire(); os.kill(os.getpid(), signal.SIGKILL)")


def test_a_lock_left_by_a_killed_trainer_blocks_no_new_one(tmp_path, options, capsys, monkeypatch):
    folder = tmp_path / "work"
    holder = subprocess.Popen([sys.executable, "-c", KILLED_HOLDER, str(folder)], cwd=ROOT)
    assert holder.wait(60) == -signal.SIGKILL  # killed while holding the lock
    assert json.loads((folder / OWNER_NAME).read_text())["pid"] == holder.pid

    def loaded(*args, **kwargs):  # the new run got past the lock: stopped here, before the model loads
        raise PpdError("got as far as loading the model")

    monkeypatch.setattr("ppd_core.loading.load_model", loaded)
    assert main(["train", "--model", "default", "--work-dir", str(folder), *options[:-2]]) == 2
    assert capsys.readouterr().err == "ppd: error: got as far as loading the model\n"
    assert not (folder / OWNER_NAME).exists()  # replaced by the new run's, removed when it ended


def test_a_side_file_naming_a_dead_or_reused_pid_is_no_trainer(tmp_path):
    me = psutil.Process()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    mine = Trainer.of(me)
    for trainer, alive in [(mine, True), (Trainer(dead.pid, time.time() - 5, mine.after_boot - 5), False),
                           (Trainer(me.pid, mine.started - 3600, mine.after_boot - 3600), False),  # a PID reused
                           # the clock was corrected since it started (the boot time psutil adds moved): still it
                           (Trainer(me.pid, mine.started + 2, mine.after_boot), True)]:
        (tmp_path / OWNER_NAME).write_text(json.dumps(asdict(trainer)))
        assert (live_trainer(tmp_path) is not None) == alive, trainer
    (tmp_path / OWNER_NAME).write_text('{"pid": 12')  # torn
    assert live_trainer(tmp_path) is None


def test_the_same_trainer_whatever_the_boot_time_reads(monkeypatch):
    """The kernel's boot time (psutil's ``boot_time``, added to every start time) stepped by a second between the
    trainer writing its side file and the app reading it: the trainer is still found (a chaos run lost it once)."""
    mine = Trainer.of(psutil.Process())
    booted = psutil.boot_time()
    monkeypatch.setattr(psutil, "boot_time", lambda: booted + 1.0)
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: booted + 1.0)
    moved = psutil.Process()
    assert abs(moved.create_time() - mine.started - 1.0) < 0.02  # every start time moved with it
    assert mine.process() is not None and mine.process().pid == mine.pid


KILL_MID_REWRITE = """
import json, os, signal, sys
from pathlib import Path
from types import SimpleNamespace
from ppd_core.training import answers

records = []
def dumps(record, **kwargs):
    if len(records) == 2:  # two records of the rewrite are out: killed here
        os.kill(os.getpid(), signal.SIGKILL)
    records.append(record)
    return json.dumps(record, **kwargs)

answers.json = SimpleNamespace(dumps=dumps, loads=json.loads, JSONDecodeError=json.JSONDecodeError)
answers.build_answer_cache(None, SimpleNamespace(pad_token_id=0), [], Path(sys.argv[1]), 5)
"""


def test_a_kill_while_the_answer_cache_is_rewritten_loses_no_answer(tmp_path):
    path = tmp_path / "answers.jsonl"
    records = [{"index": i, "prompt_length": 2, "ids": [1, 2, 3 + i]} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + '{"index": 5, "pro')  # a torn last line
    done = subprocess.run([sys.executable, "-c", KILL_MID_REWRITE, str(path)], cwd=ROOT, timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert read_cache(path) == records
