"""Work run from the page, followed as it goes: one line with numbers ("Calibrating: timing trees 3/12…", "Comparing:
PPD, 2 of 2: 40 of at most 256 tokens…"), shown where the result goes until it replaces it (not Gradio's progress
overlay, which covered the old summary with a bare "processing" before the first report and then overlapped it)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

# ppd_core.calibration's progress phases, in words
STEPS = {"lookup": "answering the calibration prompts", "acceptance": "measuring the guesses' acceptance",
         "latency": "timing trees", "tree search": "choosing the tree"}
# before the first report: what it does first (the acceptance, unless measured before for this model and its tokens)
FIRST = "Calibrating: measuring how often the guesses are right, then timing trees…"
POLL_SECONDS = 0.25  # how often the page's line is brought up to date

T = TypeVar("T")


@dataclass
class CalibrationProgress:
    """The latest report of a calibration (``Progress``: phase, done, total), as a line for the page."""

    phase: str = ""
    done: int = 0
    total: int = 0

    def __call__(self, phase: str, done: int, total: int) -> None:
        self.phase, self.done, self.total = phase, done, total

    def line(self) -> str:
        if not self.phase:
            return FIRST
        count = f" {self.done}/{self.total}" if self.total else ""
        return f"Calibrating: {STEPS.get(self.phase, self.phase)}{count}…"


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
