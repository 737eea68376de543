"""Step-latency curves from a file: another device's measured or published curve, instead of timing this one.

``ppd calibrate --latency-curve FILE`` chooses the tree and lookup chains for that curve with this model's
guess acceptance, so the search for GPU-like hardware (a step that costs about the same up to many tokens)
can be run, and checked, on a CPU. The file is JSON::

    {
      "device": "free text: the hardware the curve describes",
      "source": "where the numbers come from: a measurement's command, a paper's table, or 'synthetic'",
      "latency_ms": {"1": 10.0, "2": 10.0, "...": 10.0, "64": 10.0},
      "fixed_ms": {"1": 8.0, "2": 8.5, "4": 9.0}
    }

``latency_ms`` maps tree tokens (one forward pass) to the median milliseconds of a step; or, as a profile holds
it, cached context length to such a map (``{"256": {"1": ..., ...}, "1024": {...}}``), every context with the
same sizes. Sizes are whole numbers from 1 (the plain step, the speed every tree is compared with) up to
``MAX_SIZE``, not necessarily every one (steps in between are interpolated); sizes above the largest are never
chosen. A curve without contexts is kept under context 0 (not stated). Every ms must be a positive, finite number.

``fixed_ms`` (optional) maps rows R to the ms of a step when every step is decoded as R rows (one batch shape all
along: ``R, R, R``, what a padded step costs where llama.cpp replays a CUDA graph; 1: plain steps). With it the
forecast also weighs the ``fixed`` step policy (``step_policy.StepPolicy``), as calibration does on a GPU build.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ppd_core.calibration.latency import GPU_SIZES
from ppd_core.errors import PpdError

MAX_SIZE = max(GPU_SIZES)  # the largest tree a calibration measures on a GPU
UNSTATED_CONTEXT = 0  # the context length a curve without contexts is kept under
DESCRIBES = {"device": "which hardware the curve describes", "source": "where its numbers come from"}


class CurveError(PpdError):
    """A latency-curve file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class LatencyCurve:
    """Another device's step latency, read from ``path``."""

    device: str  # the hardware it describes (free text from the file)
    source: str  # where its numbers come from
    latency_ms: dict[int, dict[int, float]]  # context length -> tree tokens -> median ms per step
    path: str
    fixed_ms: dict[int, float] = field(default_factory=dict)  # rows -> ms of a step when every step has that many

    def device_key(self) -> dict:
        """The profile key's "device": a curve from a file, never this machine's measured one."""
        return {"kind": "curve", "name": self.device, "source": self.source, "file": self.path}


def read_curve(path: str | Path) -> LatencyCurve:
    """The curve in ``path``; CurveError (one line) when it is missing, unreadable or malformed."""
    name = f"latency curve {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise CurveError(f"cannot read {name}: {error.strerror or error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CurveError(f"{name} is not JSON ({error})") from None
    if not isinstance(data, dict) or not isinstance(data.get("latency_ms"), dict):
        raise CurveError(f'{name} must be a JSON object with "device", "source" and "latency_ms" (tree tokens -> ms)')
    text = {field: data.get(field) for field in ("device", "source")}
    for field, value in text.items():
        if not isinstance(value, str) or not value.strip():
            raise CurveError(f'{name} needs "{field}": a non-empty string saying {DESCRIBES[field]}')
    table = data["latency_ms"]
    if table and all(isinstance(value, dict) for value in table.values()):
        curves = {whole_number(name, context, "context length", 1): sizes(name, curve) for context, curve in table.items()}
        if len({tuple(sorted(curve)) for curve in curves.values()}) > 1:
            raise CurveError(f"{name}: every context length must list the same tree sizes")
    else:
        curves = {UNSTATED_CONTEXT: sizes(name, table)}
    fixed = data.get("fixed_ms")
    if fixed is not None and not isinstance(fixed, dict):
        raise CurveError(f'{name}: "fixed_ms" must map rows to ms (a step when every step has that many rows)')
    return LatencyCurve(text["device"].strip(), text["source"].strip(), curves, str(path),
                        sizes(f"{name}: fixed_ms", fixed) if fixed else {})


def sizes(name: str, curve: dict) -> dict[int, float]:
    """One curve: tree tokens -> ms, checked."""
    out = {}
    for size, ms in curve.items():
        size = whole_number(name, size, "tree size", 1)
        if size > MAX_SIZE:
            raise CurveError(f"{name}: tree sizes go up to {MAX_SIZE}, got {size}")
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not math.isfinite(ms) or ms <= 0:
            raise CurveError(f"{name}: a step's latency must be a positive number of ms, got {ms!r} at size {size}")
        out[size] = float(ms)
    if not out or min(out) != 1:
        found = f"{min(out)}..{max(out)}" if out else "none"
        raise CurveError(f"{name}: tree sizes must start at 1 (the plain step), got {found}")
    return dict(sorted(out.items()))


def whole_number(name: str, text: str, what: str, least: int) -> int:
    """A JSON key as a whole number of at least ``least`` ("4", not "04" or "4.0")."""
    try:
        value = int(text)
    except ValueError:
        raise CurveError(f"{name}: a {what} must be a whole number, got {text!r}") from None
    if value < least or str(value) != text.strip():
        raise CurveError(f"{name}: a {what} must be a whole number of at least {least}, got {text!r}")
    return value
