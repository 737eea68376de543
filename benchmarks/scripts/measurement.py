"""What the measurement scripts share: their one JSON result, printed and saved, and the int4 profile they replay on."""

from __future__ import annotations

import json
from pathlib import Path

INT4_PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "cpu-amd-epyc-2threads-int4-lean.json"


def report(result: dict, path: str | Path | None) -> None:
    """Print ``result`` as indented JSON and write the same text to ``path`` when one is given."""
    text = json.dumps(result, indent=1)
    print(text)
    if path:
        Path(path).write_text(text + "\n")
