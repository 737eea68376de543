"""Peak resident memory of `ppd generate` per backend and quantization mode, and of `ppd chat` serving one answer.

    python benchmarks/scripts/peak_rss.py [--modes auto,torch] [--no-chat] [--json FILE]

`ppd generate` on the default model runs under ``/usr/bin/time -f %M`` (the kernel's peak RSS of the process):
per mode, a 64-token answer on the small static tree and a 256-token one on the calibrated tree (``--tree auto``;
where the mode has no profile yet it calibrates first and the figure includes that, so run ``ppd calibrate`` with
the same options before). Modes: ``auto``, the default (llama.cpp on the default GGUF, in its own quantization);
``torch``, ``--backend torch`` (transformers' de-quantized float32 copy of the GGUF, converted and cached on first
use); ``torch-8bit`` / ``torch-4bit``, that with ``--quant 8bit`` / ``4bit`` (bitsandbytes, where it runs).

`ppd chat` (default options) is started on a free port (the calibration profile must already exist, or the figure
includes the first launch's calibration); once it answers ``/health`` its VmRSS is read, then one 256-token greedy
answer is asked through ``/v1/chat/completions`` and VmRSS and VmHWM (its peak) are read. Prints one JSON object
(and writes it to ``--json``). (``benchmarks/measurements/peak-rss-generate.json`` was measured with the former
``--quant int4/none/int8`` modes of the torch forward.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from ppd_core.device_info import cpu_name
from measurement import report


PPD = [sys.executable, "-m", "app.cli"]
MODES = {"auto": [], "torch": ["--backend", "torch"], "torch-8bit": ["--backend", "torch", "--quant", "8bit"],
         "torch-4bit": ["--backend", "torch", "--quant", "4bit"]}  # mode -> its `ppd generate` options
SHORT = ["generate", "Name three planets.", "--tree", "small", "--max-new-tokens", "64", "--json"]
LONG = ["generate", "Write a long story about a dragon.", "--max-new-tokens", "256", "--json"]


def peak_mb(command: list[str]) -> float:
    """Peak RSS in MB of ``command`` (GNU time's %M, in KB)."""
    done = subprocess.run(["/usr/bin/time", "-f", "PEAK %M", *command], capture_output=True, text=True, check=True)
    line = next(line for line in done.stderr.splitlines() if line.startswith("PEAK "))
    return round(int(line.split()[1]) / 1024, 1)


def status_mb(pid: int, field: str) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return round(int(text.split(f"{field}:")[1].split()[0]) / 1024, 1)


def chat_figures() -> dict:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([*PPD, "chat", "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{base}/health", timeout=2)
                break
            except OSError:
                time.sleep(0.5)
        started = status_mb(server.pid, "VmRSS")
        body = {"model": "ppd", "max_tokens": 256, "temperature": 0,
                "messages": [{"role": "user", "content": "Write a long story about a dragon."}]}
        request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        answer = json.load(urllib.request.urlopen(request, timeout=600))
        return {"rss_after_start_mb": started, "rss_after_answer_mb": status_mb(server.pid, "VmRSS"),
                "peak_rss_after_answer_mb": status_mb(server.pid, "VmHWM"),
                "answer_tokens": answer["usage"]["completion_tokens"]}
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="auto,torch", help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--no-chat", action="store_true", help="leave out the `ppd chat` figure")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    modes = args.modes.split(",")
    if unknown := [mode for mode in modes if mode not in MODES]:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if shutil.which("/usr/bin/time") is None:
        sys.exit("needs GNU time at /usr/bin/time")
    result = {
        "command": "python benchmarks/scripts/peak_rss.py " + " ".join(sys.argv[1:]),
        "device": f"{cpu_name()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB",
        "generate_64_tokens_peak_rss_mb": {mode: peak_mb([*PPD, *SHORT, *MODES[mode]]) for mode in modes},
        "generate_256_tokens_peak_rss_mb": {mode: peak_mb([*PPD, *LONG, *MODES[mode]]) for mode in modes},
    }
    if not args.no_chat:
        result["chat"] = chat_figures()
    report(result, args.json)


if __name__ == "__main__":
    main()
