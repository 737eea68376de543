"""Which backend decodes a model that both can run: the faster plain step on this machine, measured once.

llama.cpp is ahead on every CPU measured so far, by very different margins (0.27x-1.0x for torch), and
users' CPUs differ more than ours do: so the choice is a measurement, saved per device and model file,
with both timings, and redone when either changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from ppd_core.atomic_files import atomic_write
from ppd_core.backends import Decoder
from ppd_core.calibration.latency import measure_latency
from ppd_core.calibration.profiles import profiles_dir
from ppd_core.device_info import describe

log = logging.getLogger(__name__)
CONTEXT = 256  # cached tokens before the timed steps, as in calibration
ROUNDS = 3  # alternating rounds: a drift of the machine's speed hits both backends


def choice_path(device: dict, gguf_file: Path) -> Path:
    """Where the choice for this device (its thread count included) and model file is saved."""
    stat = gguf_file.stat()
    key = json.dumps([device, str(gguf_file.resolve()), stat.st_size, stat.st_mtime_ns], sort_keys=True)
    return profiles_dir() / f"backend-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def plain_step_ms(decoder: Decoder) -> float:
    """Median milliseconds of a plain one-token step after ``CONTEXT`` cached tokens."""
    return measure_latency(decoder, None, 0, 1, [1], contexts=(CONTEXT,), repeats=8, warmup=3)[CONTEXT][1]


def saved_choice(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        return record if record.get("chosen") in record.get("step_ms", {}) else None
    except (OSError, ValueError, AttributeError):
        return None


def choose(decoders: dict[str, Callable[[], Decoder]], path: Path, device: dict,
           timer: Callable[[Decoder], float] = plain_step_ms) -> dict:
    """The saved choice at ``path``, else time each backend's plain step (alternating rounds, best of each)
    and save {chosen, step_ms, ...}. ``decoders`` builds each backend's decoder on demand."""
    record = saved_choice(path)
    if record is not None and set(record["step_ms"]) == set(decoders):
        return record
    built = {name: build() for name, build in decoders.items()}
    step_ms = {name: float("inf") for name in built}
    for _ in range(ROUNDS):
        for name, decoder in built.items():
            step_ms[name] = min(step_ms[name], timer(decoder))
    chosen = min(step_ms, key=step_ms.get)
    record = {"chosen": chosen, "step_ms": {name: round(ms, 3) for name, ms in step_ms.items()},
              "context": CONTEXT, "device": device, "created": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    atomic_write(path, json.dumps(record, indent=2) + "\n")
    log.warning("backend: %s (plain step %s)", chosen,
                ", ".join(f"{name} {ms:.1f} ms" for name, ms in record["step_ms"].items()))
    return record


def device_key(loaded) -> dict:
    return describe(loaded.device).to_json()
