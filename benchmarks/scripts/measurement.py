"""What the measurement scripts share: their one JSON result, printed and saved, and the profile latencies they replay on."""

from __future__ import annotations

import json
from pathlib import Path

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
INT4_PROFILE = PROFILES / "cpu-amd-epyc-2threads-int4-lean.json"


def profile_latency(path: str | Path) -> dict[int, dict[int, float]]:
    """A profile's measured step latency (context -> tree tokens -> ms), whatever the profile's format version."""
    curves = json.loads(Path(path).read_text())["latency_ms"]
    return {int(context): {int(size): ms for size, ms in curve.items()} for context, curve in curves.items()}


def report(result: dict, path: str | Path | None) -> None:
    """Print ``result`` as indented JSON and write the same text to ``path`` when one is given."""
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
