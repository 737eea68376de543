"""The model's one line: a lock taken in arrival order, a bounded number of waiters, and giving up while waiting.

Every model call (a page's answer, Compare, Calibrate, an API request) takes a ticket, waits its
turn and leaves; beyond ``max_waiting`` waiters a new ticket is refused with ``Busy``. A waiter whose
``stop()`` turns true gives up its place (Stop pressed while queued, a client that went away).
Each ticket says what it is (``ANSWER``, ``BACKGROUND_CALIBRATION``, ...), so a waiter is told what is ahead of it.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ppd_core.errors import PpdError

POLL_SECONDS = 0.05  # how often a waiter checks its stop flag
# what a ticket is, as a waiter is told of it
ANSWER, COMPARISON, CALIBRATION, SWITCH, QUITTING = "answer", "comparison", "calibration", "model switch", "quit"
BACKGROUND_CALIBRATION = "background calibration"  # a first launch's: it pauses between its measurements for any waiter


class Busy(PpdError):
    """The line is full; ``retry_after`` (seconds) is a guess from the recent hold times."""

    def __init__(self, waiting: int, retry_after: int):
        behind = f"and {waiting} more wait{'s' if waiting == 1 else ''} behind it, " if waiting else ""
        super().__init__(f"ppd is busy: the model is answering {behind}as many as it queues; try again in about "
                         f"{retry_after} s")
        self.waiting, self.retry_after = waiting, retry_after


@dataclass
class Queued:
    """Waiting for the model: ``ahead`` calls before this one (the one holding it included); ``what`` they are, the
    holder first."""

    ahead: int
    what: tuple[str, ...] = field(default=(), compare=False)

    def line(self) -> str:
        """What the waiter is told: "Waiting for the model: 1 answer and 1 comparison ahead.", or, where only a
        background calibration holds it, that it pauses for this call (it does so at its next measurement)."""
        held_by, others = (self.what[0], self.what[1:]) if self.what else ("", ())
        if held_by == BACKGROUND_CALIBRATION:
            if not others:
                return "Calibrating this device: pausing it for your answer…"
            return f"Waiting for the model: {counted(others)} ahead (the calibration pauses for them)."
        return f"Waiting for the model: {counted(self.what) if self.what else plural(self.ahead, ANSWER)} ahead."


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def counted(what: tuple[str, ...]) -> str:
    """"2 answers and 1 comparison", in the order first met."""
    parts = [plural(count, noun) for noun, count in Counter(what).items()]
    return ", ".join(parts[:-1]) + f" and {parts[-1]}" if len(parts) > 1 else parts[0]


class ModelQueue:
    """A first-come first-served lock with at most ``max_waiting`` waiters behind the holder."""

    def __init__(self, max_waiting: int = 8, stamp: Callable[[], object] | None = None):
        if max_waiting < 0:
            raise PpdError(f"the queue length must be 0 or more, got {max_waiting}")
        self.max_waiting = max_waiting
        self._changed = threading.Condition()
        self._tickets = itertools.count()
        self._line: deque[int] = deque()  # waiting tickets, first in line first
        self._holder: int | None = None
        self._held_since = 0.0
        self._hold_seconds: deque[float] = deque(maxlen=16)  # recent holds, for Retry-After
        self._stamp = stamp or (lambda: None)  # what each ticket records when it joins (``stamp_of``)
        self._stamps: dict[int, object] = {}
        self._what: dict[int, str] = {}  # each ticket's kind of call (``ANSWER``...)

    @property
    def busy(self) -> bool:
        return self._holder is not None

    @property
    def waiting(self) -> int:
        return len(self._line)

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the mean recent hold times the line ahead, at least 1."""
        mean = sum(self._hold_seconds) / len(self._hold_seconds) if self._hold_seconds else 1.0
        return max(1, math.ceil(mean * (len(self._line) + 1)))

    def check_room(self) -> None:
        """Raise ``Busy`` if a new ticket would be refused now."""
        with self._changed:
            self._refuse_if_full()

    def join(self, what: str = ANSWER) -> int:
        """A place in line for a call of kind ``what`` (``Busy`` when the line is full); pass it to ``wait``, and
        ``leave`` it in every case."""
        with self._changed:
            self._refuse_if_full()
            ticket = next(self._tickets)
            self._line.append(ticket)
            self._stamps[ticket] = self._stamp()
            self._what[ticket] = what
            return ticket

    @property
    def holder(self) -> str | None:
        """What holds the model now (``ANSWER``...); None when nothing does."""
        with self._changed:
            return None if self._holder is None else self._what.get(self._holder)

    def stamp_of(self, ticket: int) -> object:
        """What ``stamp()`` said when ``ticket`` joined (ModelHost: the model loaded then); None once it left."""
        with self._changed:
            return self._stamps.get(ticket)

    def wait(self, ticket: int, stop: Callable[[], bool] | None = None) -> Iterator[Queued]:
        """Yield ``Queued`` while waiting; return True once ``ticket`` holds the model, False when ``stop()`` turned
        true first (the place is given up). Closing it also gives the place up."""
        held = False
        try:
            while True:
                with self._changed:
                    if self._holder is None and self._line[0] == ticket:
                        self._line.popleft()
                        self._holder, self._held_since, held = ticket, time.monotonic(), True
                        return True
                    before = list(self._line)[: self._line.index(ticket)]
                    ahead = ([] if self._holder is None else [self._holder]) + before
                    what = tuple(self._what.get(other, ANSWER) for other in ahead)
                if stop is not None and stop():
                    return False
                yield Queued(max(len(ahead), 1), what)
                with self._changed:
                    self._changed.wait(POLL_SECONDS)
        finally:
            if not held:
                self.leave(ticket)

    def leave(self, ticket: int) -> None:
        """Give up the model (or the place in line) of ``ticket``; a ticket no longer here is a no-op."""
        with self._changed:
            if self._holder == ticket:
                self._holder = None
                self._hold_seconds.append(time.monotonic() - self._held_since)
            elif ticket in self._line:
                self._line.remove(ticket)
            self._stamps.pop(ticket, None)
            self._what.pop(ticket, None)
            self._changed.notify_all()

    def hold(self, stop: Callable[[], bool] | None = None, what: str = ANSWER) -> int | None:
        """Join and wait without progress: the ticket holding the model, or None when ``stop()`` turned true."""
        ticket = self.join(what)
        waiting = self.wait(ticket, stop)
        while True:
            try:
                next(waiting)
            except StopIteration as done:  # the generator's return value: whether it holds the model
                return ticket if done.value else None

    def _refuse_if_full(self) -> None:
        if self._holder is not None and len(self._line) >= self.max_waiting:
            raise Busy(len(self._line), self.retry_after())
