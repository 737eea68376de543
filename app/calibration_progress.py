"""Work run from the page, followed as it goes: one line with numbers ("Calibrating: timing trees 23/58, about 40 s
left…", "Comparing: PPD, 2 of 2: 40 of at most 256 tokens…"), shown where the result goes until it replaces it (not
Gradio's progress overlay, which covered the old summary with a bare "processing" before the first report and then
overlapped it). A calibration's count is one over all its phases (``ppd_core.calibration.count``)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

# ppd_core.calibration's progress phases, in words
STEPS = {"lookup": "answering the calibration prompts", "acceptance": "measuring the guesses' acceptance",
         "latency": "timing trees", "fixed": "timing fixed step shapes", "tree search": "choosing the tree"}
SETTLE = 0.1  # the share of the count done before the time left is told (the first items say little of the rest)
# before the first report: what it does first (the acceptance, unless measured before for this model and its tokens)
FIRST = "Calibrating: measuring how often the guesses are right, then timing trees…"
POLL_SECONDS = 0.25  # how often the page's line is brought up to date

T = TypeVar("T")


@dataclass
class CalibrationProgress:
    """The latest report of a calibration (``Progress``: phase, and one count over every phase), as a line for the
    page, with the time left at the pace so far."""

    phase: str = ""
    done: int = 0
    total: int = 0
    started: float | None = None  # the first report's time

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.phase, self.done, self.total = phase, done, total

    def line(self) -> str:
        return f"Calibrating: {self.count_line()}…" if self.phase else FIRST

    def count_line(self) -> str:
        """"timing trees 23/58, about 40 s left" ("" before the first report)."""
        if not self.phase:
            return ""
        count = f" {self.done}/{self.total}" if self.total else ""
        left = self.time_left()
        return f"{STEPS.get(self.phase, self.phase)}{count}" + (f", {left}" if left else "")

    def time_left(self) -> str:
        """"about 40 s left", "about 3 min left": the time so far over the count done, times the count left; "" while
        too little is done to tell."""
        if self.started is None or not self.total or self.done < max(1, SETTLE * self.total) or self.done >= self.total:
            return ""
        seconds = (time.monotonic() - self.started) / self.done * (self.total - self.done)
        if seconds < 60:
            return f"about {max(5, 5 * math.ceil(seconds / 5))} s left"
        return f"about {math.ceil(seconds / 60)} min left"


@dataclass
class CompareProgress:
    """The latest report of a comparison (``Chat.compare``'s ``progress``: mode, tokens, most tokens)."""

    modes: list[str] = field(default_factory=list)  # the ways run so far, in order
    tokens: int = 0
    total: int = 0

    def __call__(self, mode: str, tokens: int, total: int) -> None:
        if mode not in self.modes:
            self.modes.append(mode)
        self.tokens, self.total = tokens, total

    def line(self) -> str:
        if not self.modes:
            return "Comparing: waiting for the model…"
        return (f"Comparing (greedy, both ways, no cache reuse): {self.modes[-1]}, {len(self.modes)} of 2: "
                f"{self.tokens} of at most {self.total} tokens…")


class Progress(Protocol):
    def __call__(self, *report) -> None: ...

    def line(self) -> str: ...


def followed(work: Callable[[Progress], T], progress: Progress | None = None) -> Generator[str, None, T]:
    """Run ``work(progress)`` in a thread (``progress``: a calibration's by default); yield its progress line at once
    and whenever it changes, then return its result (or raise its error)."""
    progress, outcome = progress or CalibrationProgress(), {}

    def run() -> None:
        try:
            outcome["result"] = work(progress)
        except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True, name="ppd-page-work")
    thread.start()
    shown = progress.line()
    yield shown
    while thread.is_alive():
        thread.join(POLL_SECONDS)
        if thread.is_alive() and progress.line() != shown:
            shown = progress.line()
            yield shown
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
