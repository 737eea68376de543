"""How long an answer waits behind a first launch's background calibration (issue 50: the first token within 3 s).

    .venv/bin/python benchmarks/scripts/answer_during_calibration.py [--requests 8] [--every 10] [--json FILE]
        [-- more ppd chat args]

``ppd chat`` from new, empty ``XDG_DATA_HOME``, ``XDG_CACHE_HOME``, ``XDG_CONFIG_HOME`` and ``XDG_STATE_HOME`` (a first
launch: no profile, it calibrates in the background). Once ``/health`` says the calibration holds the model, a streamed
``/v1/chat/completions`` ("Say hello.", 16 tokens, greedy) every ``--every`` seconds while it runs (at most
``--requests``), each timed from the request to its first content chunk, with the ``queued_seconds`` of the same
request asked whole right after, and the calibration's line at that moment (its phase). Run on a quiet machine; the
target is every first token within 3 s. Prints one JSON object (also to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from measurement import ROOT, free_port, machine, now, report

QUESTION = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16, "temperature": 0}


def first_token_seconds(client: httpx.Client) -> float:
    """Seconds from a streamed request to its first chunk with content."""
    asked = time.monotonic()
    with client.stream("POST", "/v1/chat/completions", json={**QUESTION, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    return time.monotonic() - asked
    raise SystemExit("the stream ended without content")


def wait_for_calibration(client: httpx.Client, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            health = client.get("/health").json()
            if health.get("held_by") == "background calibration":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("the background calibration never held the model")


def measure(client: httpx.Client, requests: int, every: float) -> list[dict]:
    rows = []
    while len(rows) < requests:
        health = client.get("/health").json()
        if not (health.get("background") or "").startswith("Calibrating"):
            break  # the calibration ended
        first = first_token_seconds(client)
        whole = client.post("/v1/chat/completions", json=QUESTION).json()
        rows.append({"calibration": health["background"], "first_token_seconds": round(first, 3),
                     "queued_seconds": whole["ppd"]["queued_seconds"]})
        print(json.dumps(rows[-1]), file=sys.stderr)
        time.sleep(every)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between requests")
    parser.add_argument("--json", type=Path)
    parser.add_argument("chat_args", nargs="*", help="more `ppd chat` arguments (after --)")
    args = parser.parse_args()
    home, port = Path(tempfile.mkdtemp(prefix="ppd-first-launch-")), free_port()
    env = {**os.environ, **{name: str(home / name.lower()) for name in
                            ("XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}}
    command = [sys.executable, "-c", "from app.cli import entry; entry()", "chat", "--port", str(port), *args.chat_args]
    with (home / "chat.log").open("w") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=log)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=httpx.Timeout(300, connect=2))
    try:
        wait_for_calibration(client, 600)
        rows = measure(client, args.requests, args.every)
    finally:
        process.terminate()
        process.wait(60)
    worst = max((row["first_token_seconds"] for row in rows), default=None)
    report({"machine": machine(), "when": now(), "command": " ".join(sys.argv), "requests": rows,
            "worst_first_token_seconds": worst, "within_3_s": worst is not None and worst <= 3.0}, args.json)


if __name__ == "__main__":
    main()
