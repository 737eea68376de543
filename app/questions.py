"""The MT-Bench style questions `ppd bench`, `ppd doctor` and `ppd train`'s evaluation answer: the shipped file and
reading one (plain data: no model code)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ppd_core.errors import PpdError

# MT-Bench questions shipped inside the package (app/data/README.md says where they come from).
DEFAULT_QUESTIONS = Path(__file__).resolve().parent / "data" / "mt_bench.jsonl"


@dataclass
class Question:
    turns: list[str]
    category: str = "-"


def read_questions(path: Path, limit: int | None) -> list[Question]:
    """The ``turns`` (and ``category``) of each MT-Bench style JSONL record; a missing or malformed file is a one-line PpdError."""
    path = Path(path)
    if not path.is_file():
        raise PpdError(f"question file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise PpdError(f"cannot read the question file {path} ({error})") from None
    questions = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            turns = record["turns"]
        except (json.JSONDecodeError, KeyError, TypeError):
            record, turns = {}, None
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise PpdError(f"{path}:{number} is not a JSON object with a 'turns' list")
        questions.append(Question(turns, str(record.get("category", "-"))))
    if not questions:
        raise PpdError(f"{path} holds no questions (expected one JSON object with a 'turns' list per line)")
    return questions[:limit] if limit else questions
