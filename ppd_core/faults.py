"""Named fault-injection points: any phase of a model load or of a calibration can be made to fail on purpose, so the
app's failure paths are tested on any model file.

    fault("load.tokenizer")                          # in the code: raises what is armed there, else nothing
    with inject("load.tokenizer", MemoryError): ...  # in a test (``times``: only the first N passes fail)
    PPD_FAULTS="load.tokenizer=ValueError,calibrate.latency=MemoryError" ppd chat   # in another process
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

from ppd_core.errors import PpdError

ENVIRONMENT = "PPD_FAULTS"
POINTS = {
    "load.model": "llama.cpp has loaded the weights; the decoder is half made",
    "load.tokenizer": "the decoder is made; the tokenizer is next",
    "load.prompt_tokens": "the model is loaded; its prompt tokens are next",
    "calibrate.acceptance": "a calibration starts: the guesses' acceptance",
    "calibrate.latency": "the acceptance is known: the step latency is timed next",
    "calibrate.tree_search": "the latency is known: the tree is chosen next",
}
KINDS = {kind.__name__: kind for kind in (ValueError, RuntimeError, OSError, MemoryError, KeyboardInterrupt, PpdError)}

_armed: dict[str, list] = {}  # point -> [exception class, passes left to fail (None: every one)]
_lock = threading.Lock()


class FaultError(PpdError):
    """A fault that names no known point or exception; one line."""


def fault(point: str) -> None:
    """Raise the exception armed at ``point`` (by ``inject`` or ``PPD_FAULTS``); nothing when none is."""
    with _lock:
        armed = _armed.get(point)
        if armed is None:
            kind = from_environment().get(point)
        else:
            kind, left = armed
            if left is not None:
                if left <= 0:
                    return
                armed[1] = left - 1
    if kind is not None:
        raise kind(f"injected fault at {point}")


@contextmanager
def inject(point: str, kind: type[BaseException] = ValueError, times: int | None = None):
    """``point`` raises ``kind`` inside the block: every time, or the first ``times`` times only."""
    check_point(point)
    with _lock:
        _armed[point] = [kind, times]
    try:
        yield
    finally:
        with _lock:
            _armed.pop(point, None)


def from_environment() -> dict[str, type[BaseException]]:
    """``PPD_FAULTS`` ("point=Exception,..."): point -> exception class; FaultError for a name neither list knows."""
    text = os.environ.get(ENVIRONMENT, "").strip()
    faults = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        point, _, kind = item.partition("=")
        point, kind = point.strip(), kind.strip() or "ValueError"
        check_point(point)
        if kind not in KINDS:
            raise FaultError(f"{ENVIRONMENT}: unknown exception {kind!r}; use one of {', '.join(KINDS)}")
        faults[point] = KINDS[kind]
    return faults


def check_point(point: str) -> None:
    if point not in POINTS:
        raise FaultError(f"unknown fault point {point!r}; use one of {', '.join(POINTS)}")
