"""How long a first launch takes: `ppd chat` from an empty data directory, timed from the process start to the page
answering HTTP and to the model being ready (/health 200), with the progress lines the page showed meanwhile.

    python benchmarks/scripts/first_launch.py --json benchmarks/measurements/first-launch.json [-- extra ppd chat args]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("extra", nargs="*", help="more `ppd chat` arguments")
    args = parser.parse_args()
    port = free_port()
    data = tempfile.mkdtemp(prefix="ppd-first-launch-")
    command = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", "chat", "--port", str(port),
               *args.extra]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "XDG_DATA_HOME": data},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    page = ready = None
    lines: list[tuple[float, str]] = []
    try:
        while time.monotonic() - started < args.timeout and process.poll() is None:
            now = time.monotonic() - started
            try:
                if page is None and httpx.get(f"http://127.0.0.1:{port}/", timeout=2).status_code == 200:
                    page = now
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                if health.status_code == 200:
                    ready = now
                    break
                detail = health.json().get("detail", "")
                shown = detail.split("…")[0]
                if not lines or lines[-1][1] != shown:
                    lines.append((round(now, 1), shown))
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    finally:
        process.terminate()
        stderr = process.communicate(timeout=30)[1]
    result = {
        "command": "python benchmarks/scripts/first_launch.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "seconds_to_page": None if page is None else round(page, 1),
        "seconds_to_ready": None if ready is None else round(ready, 1),
        "progress_shown": lines,
        "stderr": stderr.splitlines()[-12:],
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0 if ready is not None else 1


if __name__ == "__main__":
    sys.exit(main())
