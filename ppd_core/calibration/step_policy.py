"""How decoding shapes its steps on this device: the policy calibration chooses from step costs timed as decoding runs
them, and the step-cost function each policy prices steps with.

* ``trees``: each step its own shape, trees of guesses between 1-token steps, each step priced by the curve timed
  in that alternation (``latency.measure_latency``). The CPU's choice: a row costs most of a step there, padding
  only adds rows.
* ``fixed``: every generation step decoded as exactly ``rows`` rows (``StepRows.pad_to``), plain steps too, so a
  GPU build of llama.cpp replays one CUDA graph; every step costs ``fixed_ms[rows]``, whatever its tree
  (``latency.measure_fixed``). On an H200 a tree step between 1-token steps cost 9-19 ms against 1.9-3.5 ms
  repeated (benchmarks/measurements/h200-steps-repeated-vs-alternating.json).
* ``plain``: no guess pays; 1-token steps (the ``trees`` policy with a 1-token budget).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Literal

StepPolicyKind = Literal["trees", "fixed", "plain"]  # the module's docstring says each
KINDS: tuple[StepPolicyKind, ...] = ("trees", "fixed", "plain")
FIXED_LADDER = (2, 4, 8, 12, 16, 24, 32)  # rows a fixed-shape step is timed at (the GPU's ladder is the same)


@dataclass(frozen=True)
class StepPolicy:
    kind: StepPolicyKind = "trees"
    rows: int = 0  # ``fixed``: the rows every step is decoded as
    fixed_ms: dict[int, float] = field(default_factory=dict)  # rows -> ms of a step of that shape repeated (1: plain)
    rates: dict[str, float] = field(default_factory=dict)  # the expected tokens/s of each policy weighed

    @property
    def pads(self) -> int | None:
        """The rows decoding pads every step to; None: each step its own shape."""
        return self.rows if self.kind == "fixed" else None

    def seconds(self, curve: Callable[[int], float]) -> Callable[[int], float]:
        """Step seconds against tree tokens under this policy: ``curve`` (the alternation's), or a fixed step's cost up
        to its rows (more cannot be decoded)."""
        if self.kind != "fixed":
            return curve
        cost = self.fixed_ms[self.rows] / 1000
        return lambda size: cost if size <= self.rows else float("inf")

    def line(self) -> str:
        """What runs, in words, with the measured costs: the device panel, the doctor and the bench say it."""
        plain = f"; a 1-token step {self.fixed_ms[1]:.2f} ms" if 1 in self.fixed_ms else ""
        if self.kind == "fixed":
            return f"every step padded to {self.rows} rows ({self.fixed_ms[self.rows]:.2f} ms each{plain})"
        if self.kind == "plain":
            return f"plain 1-token steps: no tree paid here{plain}"
        return "trees of guesses between 1-token steps, each step its own shape" + (
            f" (a fixed shape would cost {fixed_costs(self.fixed_ms)})" if len(self.fixed_ms) > 1 else "")

    def to_json(self) -> dict:
        data = asdict(self)
        data["fixed_ms"] = {str(rows): ms for rows, ms in self.fixed_ms.items()}
        return data

    @staticmethod
    def from_json(data: dict | None) -> StepPolicy:
        """The saved policy; a profile from before policies (none saved): ``trees``, as decoding then ran."""
        if not data:
            return StepPolicy()
        return StepPolicy(data.get("kind", "trees"), int(data.get("rows", 0)),
                          {int(rows): float(ms) for rows, ms in data.get("fixed_ms", {}).items()},
                          dict(data.get("rates", {})))


def fixed_costs(fixed_ms: dict[int, float]) -> str:
    """"1/2/4 rows: 3.10/3.20/3.60 ms"."""
    rows = sorted(fixed_ms)
    return f"{'/'.join(map(str, rows))} rows: {'/'.join(f'{fixed_ms[r]:.2f}' for r in rows)} ms"
