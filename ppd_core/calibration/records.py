"""Acceptance records: the guesses' statistics, kept beside the prompt tokens instead of measured on every machine.

How often the prompt tokens' guesses and the lookup chains are right is a property of the model,
its prompt tokens and its numerics (the backend and quantization that answer), not of the device:
calibration measures it once per numerics, stores it here, and on another machine measures only
the latency curve. A record is found beside the prompt-token file (``NAME.acceptance.json``, as
shipped or written by ``ppd train``) or in the user's data directory (written by calibrations).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import platformdirs

from ppd_core.atomic_files import atomic_write
from ppd_core.drafters.lookup import LookupStats

FORMAT = 1
log = logging.getLogger(__name__)


@dataclass
class AcceptanceStats:
    """Counts per depth: ``hits[d][r]`` guesses right at rank r, out of ``trials[d]`` eligible positions."""

    hits: list[list[int]]  # [n][k]
    trials: list[int]  # [n]

    @property
    def probs(self) -> list[list[float]]:
        """p_d(r) as observed frequencies (a depth never reached: all zero)."""
        return [[h / max(t, 1) for h in row] for row, t in zip(self.hits, self.trials)]

    @property
    def top1(self) -> list[float]:
        return [row[0] / max(t, 1) for row, t in zip(self.hits, self.trials)]

    def add(self, ranks: np.ndarray) -> None:
        """``ranks`` [C, n]: rank of the model's token among the guesses, or -1 when outside the top k."""
        ranks = np.asarray(ranks)
        eligible = np.ones(ranks.shape[0], dtype=bool)
        for depth in range(ranks.shape[1]):
            self.trials[depth] += int(eligible.sum())
            found = ranks[:, depth]
            for rank in found[eligible & (found >= 0)].tolist():
                self.hits[depth][rank] += 1
            eligible &= found >= 0


@dataclass
class AcceptanceRecord:
    """Statistics measured on greedy answers to the calibration prompts, with what they depend on (``key``)."""

    key: dict  # model fingerprint, prompt-token fingerprint, backend, quant, dtype, prompts, answer length
    acceptance: AcceptanceStats  # the prompt tokens' guesses, through the decoding backend
    lookup: LookupStats  # lookup chains replayed on the decoding backend's own answers
    created: str = ""

    def to_json(self) -> dict:
        return {"format": FORMAT, "key": self.key, "acceptance": asdict(self.acceptance), "lookup": asdict(self.lookup),
                "created": self.created}

    @staticmethod
    def from_json(data: dict) -> AcceptanceRecord:
        lookup = data["lookup"]
        lookup = LookupStats(**{**lookup, "matches": [[tuple(m) for m in answer] for answer in lookup["matches"]]})
        return AcceptanceRecord(data["key"], AcceptanceStats(**data["acceptance"]), lookup, data.get("created", ""))


def beside(prompt_tokens_file: Path) -> Path:
    """``x.prompt-tokens.safetensors`` -> ``x.prompt-tokens.acceptance.json``."""
    return prompt_tokens_file.with_name(prompt_tokens_file.name.removesuffix(".safetensors") + ".acceptance.json")


def user_records_dir() -> Path:
    return Path(platformdirs.user_data_dir("ppd")) / "acceptance"


def candidate_files(prompt_tokens_file: Path | None, fingerprint: str) -> list[Path]:
    """Where a record may be: beside the prompt-token file first, then the user's data directory."""
    own = [beside(prompt_tokens_file)] if prompt_tokens_file is not None else []
    return [*own, user_records_dir() / f"{fingerprint}.json"]


def read_records(path: Path) -> list[AcceptanceRecord]:
    """The records in ``path``; a missing file is none, an unreadable one is none with a warning."""
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')}, expected {FORMAT}")
        return [AcceptanceRecord.from_json(record) for record in data["records"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("ignoring the acceptance records in %s (%s)", path, error)
        return []


def find_record(prompt_tokens_file: Path | None, fingerprint: str, key: dict) -> tuple[AcceptanceRecord, Path] | None:
    """The record measured under exactly ``key``, and its file."""
    for path in candidate_files(prompt_tokens_file, fingerprint):
        for record in read_records(path):
            if record.key == key:
                return record, path
    return None


def save_record(record: AcceptanceRecord, path: Path) -> Path:
    """Add ``record`` to the file ``path`` (replacing one with the same key)."""
    kept = [r for r in read_records(path) if r.key != record.key]
    data = {"format": FORMAT, "records": [r.to_json() for r in (*kept, record)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(data) + "\n")


def copy_records(source: Path, fingerprint: str, destination: Path) -> int:
    """Add the records of ``source`` made for the prompt tokens ``fingerprint`` to ``destination``; how many."""
    records = [r for r in read_records(source) if r.key.get("prompt_tokens") == fingerprint]
    for record in records:
        save_record(record, destination)
    return len(records)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
