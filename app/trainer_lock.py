"""One training per work directory. `ppd train` holds a lock on its folder for its whole run (the operating system
drops it when the process ends, however it ends), and a side file names the process holding it (PID and start time):
a second trainer is refused in one line, and the chat app can follow and stop a trainer it did not start (one that
outlived an earlier app), by PID, once sure the PID is still that trainer. A side file naming a process that is gone
(a stale lock) is ignored, and replaced by the next trainer."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from ppd_core.atomic_files import atomic_write
from ppd_core.errors import PpdError

LOCK_NAME = ".trainer.lock"  # the lock itself (empty; stays in place)
OWNER_NAME = "trainer.json"  # {"pid", "started", "after_boot"}: who holds it


@dataclass(frozen=True)
class Trainer:
    """A `ppd train` process, named by its PID and when it started: ``after_boot`` seconds after the machine booted
    (a reused PID differs), ``started`` on the wall clock (what the page shows). The identity is the boot-relative
    time: the wall-clock one moves with the clock (the kernel's boot time, which psutil adds, steps by a second or
    more when the clock is corrected), so two processes reading it apart could disagree."""

    pid: int
    started: float
    after_boot: float

    @classmethod
    def of(cls, process: psutil.Process) -> Trainer:
        return cls(process.pid, process.create_time(), after_boot(process))

    def process(self) -> psutil.Process | None:
        """The process, while it is still this trainer; None once it has ended (or its PID names another)."""
        try:
            process = psutil.Process(self.pid)
            if abs(after_boot(process) - self.after_boot) < 0.5 and process.status() != psutil.STATUS_ZOMBIE:
                return process
        except psutil.Error:
            pass
        return None

    def stop(self, timeout: float = 30.0) -> None:
        """Ask it to stop (SIGTERM: it stops where it is, resumable), killing it if it has not within ``timeout``."""
        for signal_it, seconds in (("terminate", timeout), ("kill", 10.0)):
            process = self.process()
            if process is None:
                return
            with contextlib.suppress(psutil.NoSuchProcess):
                getattr(process, signal_it)()  # psutil checks the start time again first: never another process
            if self.ended_within(seconds):
                return

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM: it stops where it is, resumable) without waiting."""
        process = self.process()
        if process is not None:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.terminate()

    def ended_within(self, seconds: float) -> bool:
        """Wait for it to end (a non-child's end is polled; an unreaped zombie counts as ended)."""
        deadline = time.monotonic() + seconds
        while self.process() is not None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True


def after_boot(process: psutil.Process) -> float:
    """When ``process`` started, in seconds after the machine booted (immune to clock corrections)."""
    return process.create_time() - psutil.boot_time()  # both carry the same boot time, read a moment apart


def live_trainer(folder: Path) -> Trainer | None:
    """The trainer working in ``folder`` now; None where none is (never was, or the side file is stale)."""
    try:
        record = json.loads((Path(folder) / OWNER_NAME).read_text())
        trainer = Trainer(int(record["pid"]), float(record["started"]), float(record["after_boot"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return trainer if trainer.process() is not None else None


def describe(trainer: Trainer | None) -> str:
    if trainer is None:
        return "another process"
    return f"process {trainer.pid} (started {time.strftime('%Y-%m-%d %H:%M', time.localtime(trainer.started))})"


class WorkDirLock:
    """What `ppd train` holds on its work directory while it runs; ``acquire`` refuses a busy folder (PpdError)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.lock = FileLock(self.folder / LOCK_NAME, timeout=0)

    def acquire(self) -> WorkDirLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            self.lock.acquire()
        except Timeout:
            raise PpdError(f"{self.folder} is already in use by another training, {describe(live_trainer(self.folder))}: "
                           "wait for it or stop it, or give another --work-dir") from None
        atomic_write(self.folder / OWNER_NAME, json.dumps(asdict(Trainer.of(psutil.Process()))) + "\n")
        return self

    def release(self) -> None:
        if self.lock.is_locked:
            (self.folder / OWNER_NAME).unlink(missing_ok=True)
            self.lock.release()
