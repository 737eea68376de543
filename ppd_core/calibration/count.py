"""One count over a whole calibration, and its pause points.

A calibration runs phases of very different lengths (answering its prompts, the guesses' acceptance, timing trees,
timing fixed shapes, choosing the tree), each counting in its own terms; told one after another, the page's line jumped
("timing trees 12/19", then "13/13" for 46 s while the fixed shapes were timed unsaid, then "choosing the tree 0/1" for
16 s). ``CalibrationCount`` lays the phases' items end to end, planned before the first is measured, and reports every
phase's progress as that one count (``progress(phase, done, total)`` with ``total`` the whole calibration's): it only
moves forward, and what a phase skips (trees too large to win) is counted as done.

``Pace`` is what a long loop calls between its items: its progress, and the pause point where a calibration beside the
chat lends the model to an answer waiting for it (``between``), then goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ppd_core.progress import Progress

PHASES = ("lookup", "acceptance", "latency", "fixed", "tree search")  # in the order they run
TREE_SEARCH_ITEMS = 8  # the tree search's share of the count: about as long as that many timed sizes on a CPU


@dataclass
class CalibrationCount:
    """``progress`` told one count over the phases; ``items``: each phase's share (0: not run this time)."""

    progress: Progress
    items: dict[str, int] = field(default_factory=dict)
    done: int = 0

    @property
    def total(self) -> int:
        return sum(self.items.values())

    def __call__(self, phase: str, done: int, total: int) -> None:
        """A phase's own progress (``done`` of ``total``; a total may shrink when the rest is skipped), told as the
        whole count: never backwards."""
        offset = sum(self.items.get(name, 0) for name in PHASES[: PHASES.index(phase)]) if phase in PHASES else 0
        share = self.items.get(phase, 0) * min(done / total, 1.0) if total > 0 else 0.0
        self.done = min(max(self.done, offset + int(share)), self.total)
        self.progress(phase, self.done, self.total)


def plan(turns: int, acceptance: bool, sizes: int, fixed: int, search: bool = True) -> dict[str, int]:
    """Each phase's items: the prompts' answers (``turns``, where the acceptance is measured; then the same again
    for the acceptance itself, with prompt tokens), the sizes and the fixed shapes timed, and the tree search."""
    return {"lookup": turns, "acceptance": turns if acceptance else 0, "latency": sizes, "fixed": fixed,
            "tree search": TREE_SEARCH_ITEMS if search else 0}


@dataclass
class Pace:
    """A long loop's ``tick(done, total)``: the pause point (``between``, where a calibration lends the model to a
    waiting answer) and the phase's progress, at most every ``every``-th item (ticks are cheap, reports are not)."""

    phase: str
    progress: Progress
    between: Callable[[], object] | None = None
    start: float = 0.0  # this loop's part of its phase: from ``start`` ...
    end: float = 1.0  # ... to ``end``
    every: int = 1
    scale: int = 1000  # the phase's progress is told in thousandths

    def tick(self, done: int, total: int) -> None:
        if self.between is not None:
            self.between()
        if done % self.every == 0 or done == total:
            fraction = self.start + (self.end - self.start) * (done / total if total else 1.0)
            self.progress(self.phase, int(self.scale * fraction), self.scale)

    def part(self, start: float, end: float, every: int = 1) -> Pace:
        """The same pace for a part of the phase (``start`` to ``end`` of this pace's own part)."""
        width = self.end - self.start
        return Pace(self.phase, self.progress, self.between, self.start + width * start, self.start + width * end,
                    every, self.scale)
