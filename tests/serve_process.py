"""A real `ppd serve` process (``app.cli.entry``, as a user starts it) for the tests that must see the process itself:
alive after hostile requests, its memory, and its log, where a native abort or a Python traceback shows."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from ports import free_port

ROOT = Path(__file__).resolve().parent.parent
# what a crash or a bug leaves in a server's log: Python's traceback, a C++ exception through the C API, an abort
CRASH_SIGNS = ("Traceback", "terminate called", "Aborted", "Fatal Python error", "GGML_ASSERT", "Segmentation fault",
               "cannot allocate memory", "std::bad_alloc")


@dataclass
class ServeProcess:
    process: subprocess.Popen
    url: str
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_mb(self) -> float:
        """The process's resident memory now (Linux)."""
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(line.split()[1]) / 1024

    def crash_lines(self) -> list[str]:
        """The log's lines that show a crash or a bug."""
        return [line for line in self.log.read_text(errors="replace").splitlines()
                if any(sign in line for sign in CRASH_SIGNS)]

    def post(self, body: dict | str, timeout: float = 60) -> httpx.Response:
        """A chat request, its body as JSON (NaN and Infinity written as Python writes them, as some clients do)."""
        raw = body if isinstance(body, str) else json.dumps(body)
        return httpx.post(f"{self.url}/v1/chat/completions", content=raw, timeout=timeout,
                          headers={"Content-Type": "application/json"})


@contextlib.contextmanager
def serving(home: Path, *options: str, ready_seconds: float = 180) -> Iterator[ServeProcess]:
    """`ppd serve` on a free port with its own data and cache folders and its output in ``home``/serve.log, until the
    model is loaded; killed at the end."""
    port = free_port()
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"), "XDG_CACHE_HOME": str(home / "cache")}
    log = home / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-c", "from app.cli import entry; entry()", "serve", "--port",
                                    str(port), *options], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    served = ServeProcess(process, f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            assert served.alive(), log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the model did not load"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{served.url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield served
    finally:
        process.kill()
        process.wait(30)
