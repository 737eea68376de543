"""Opening the real page in the browser the tests use: Debian's Chromium, its flags, and ``reach`` (the app listens
while its model loads, so a first ``goto`` may come too early)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")  # `make browser` installs it
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def reach(page, url: str, process: subprocess.Popen, seconds: float = 60) -> None:
    """Open ``url`` in ``page`` once the app ``process`` listens; fails if it exits or ``seconds`` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            page.goto(url)
            return
        except Exception:  # noqa: BLE001 - not listening yet
            ended = process.poll() is not None
            detail = process.stderr.read() if ended and process.stderr is not None else ""
            assert time.monotonic() < deadline and not ended, detail
            time.sleep(0.3)
