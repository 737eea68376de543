"""What `ppd chat` is doing before the model is ready: the page shows it, the API answers 503 meanwhile.

    startup = Startup()
    engine = startup.run(lambda progress: Engine.load(config, progress))   # progress: (phase, done, total)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ppd_core.errors import PpdError

Progress = Callable[[str, int, int], None]  # (phase, done, total)
RETRY_SECONDS = 5  # what a client is told to wait while the model loads
Loaded = TypeVar("Loaded")


class NotReady(PpdError):
    """The model is not loaded yet (or failed to load); ``retry_after`` in seconds, None when it will never be."""

    def __init__(self, line: str, retry_after: int | None):
        super().__init__(line)
        self.retry_after = retry_after


@dataclass
class Startup:
    phase: str = "starting"
    done: int = 0
    total: int = 0
    error: str | None = None  # the one line of a load that failed
    ready: bool = False
    began: float = field(default_factory=time.monotonic)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            self.phase, self.done, self.total = phase, done, total

    def run(self, load: Callable[[Progress], Loaded]) -> Loaded:
        """``load(progress)`` with its phases recorded; whatever it raises (``BaseException`` included) is recorded as
        the one line, then raised."""
        self.report("loading the model", 0, 0)
        try:
            result = load(self.report)
        except BaseException as error:
            self.error = failure_line(error)
            raise
        self.ready = True
        return result

    def line(self) -> str:
        """One line for the page: the phase, its progress and the time so far; or the failure."""
        if self.error is not None:
            return f"The model could not be loaded: {self.error}"
        if self.ready:
            return "Ready."
        with self._lock:
            phase, done, total = self.phase, self.done, self.total
        what = f"Calibrating this device ({phase})" if phase in CALIBRATION_PHASES else phase[:1].upper() + phase[1:]
        count = f" {done}/{total}{' MB' if phase == 'downloading' else ''}" if total else ""
        return f"{what}{count}… {time.monotonic() - self.began:.0f} s so far. Sending opens when the model is ready."

    def refusal(self) -> NotReady:
        return NotReady(self.line(), None if self.error is not None else RETRY_SECONDS)


def failure_line(error: BaseException) -> str:
    """One line for any failure: a PpdError's message; else the exception's name and its message's first line."""
    if isinstance(error, PpdError):
        return " ".join(str(error).split()) or type(error).__name__
    first = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


CALIBRATION_PHASES = ("latency", "lookup", "acceptance", "fixed", "tree search")  # ppd_core.calibration's phases
