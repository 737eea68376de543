"""The progress callback long work reports to: ``progress(phase, done, total)`` (total 0: no count yet)."""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str, int, int], None]
