"""A first launch's calibration, run beside the chat's answers and the API's requests (``ModelHost``).

It holds the model in its line as ``BACKGROUND_CALIBRATION`` and pauses at every pause point of the calibration (before
each timed step, each step of its prompts' answers, each item of the tree search: ``calibrate(between=...)``): where a
call waits, it gives the model up, the call runs on the plan as it is (plain decoding: no profile yet, as
`ppd generate` answers on an uncalibrated model), and the calibration goes on behind it. Its line for the page says
what it does, with one count over all its phases and the time left (``CalibrationProgress``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from app.calibration_progress import CalibrationProgress
from app.model_queue import BACKGROUND_CALIBRATION, ModelQueue
from ppd_core import Engine

log = logging.getLogger(__name__)
LINE = "Calibrating this device in the background{progress}: answers decode plainly until it is done."


class Abandoned(Exception):
    """The model being calibrated in the background was replaced, or ppd is quitting."""


class BackgroundCalibration:
    """One engine's calibration beside the answers; ``run`` on a thread of its own."""

    def __init__(self, engine: Engine, queue: ModelQueue, current: Callable[[], Engine | None],
                 stopping: threading.Event, calibrate: Callable[..., object], options: dict, idle_seconds: float):
        """``current()``: the engine loaded now (another one abandons this calibration); ``calibrate``:
        ``calibrate_engine``; ``idle_seconds``: how long nothing must ask for the model before it starts."""
        self.engine, self.queue, self.current, self.stopping = engine, queue, current, stopping
        self.calibrate, self.options, self.idle_seconds = calibrate, options, idle_seconds
        self.progress = CalibrationProgress()
        self.paused_for = 0  # calls it gave the model to, between its measurements
        self.pausing = False  # True while a call it paused for holds the model
        self._ticket: int | None = None

    def line(self) -> str:
        """The page's line (and /health's "background")."""
        counted = self.progress.count_line()
        if self.pausing:
            counted = ", paused for an answer" + (f" ({counted})" if counted else "")
        elif counted:
            counted = f" ({counted})"
        return LINE.format(progress=counted)

    def run(self) -> None:
        """Wait for a quiet moment, calibrate with pauses for every waiting call, decode with the result; raises
        ``Abandoned`` where the model was replaced or ppd quits first, else what the calibration raised."""
        # a first answer is usually asked for as soon as the page opens: let it go first, then calibrate
        if not self._idle_for(self.idle_seconds):
            raise Abandoned
        self._ticket = self.queue.hold(what=BACKGROUND_CALIBRATION)
        try:
            self.calibrate(self.engine, self._report, between=self.between, **self.options)
        finally:
            self.queue.leave(self._ticket)

    def between(self) -> bool:
        """The pause point: a call waiting goes first (True: it did, the timing in progress starts over)."""
        lent = False
        if self.queue.waiting:
            self.paused_for += 1
            self.pausing = True
            log.info("background calibration: pausing for %d waiting call(s)", self.queue.waiting)
            self.queue.leave(self._ticket)
            self._ticket = self.queue.hold(what=BACKGROUND_CALIBRATION)  # behind every call waiting now
            self.pausing, lent = False, True
        if self.current() is not self.engine or self.stopping.is_set():  # another model, or ppd is quitting
            raise Abandoned
        return lent

    def _report(self, phase: str, done: int, total: int) -> None:
        self.progress(phase, done, total)
        self.between()

    def _idle_for(self, seconds: float) -> bool:
        """Wait until the model has had nothing to do for ``seconds``; False if ppd quits or the model changes first."""
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < seconds:
            if self.stopping.wait(0.1) or self.current() is not self.engine:
                return False
            if self.queue.busy or self.queue.waiting:
                quiet_since = time.monotonic()
        return True
