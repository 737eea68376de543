"""How long `ppd chat` takes to serve its page and its first answer: a first launch, then launches with its folders kept.

    .venv/bin/python benchmarks/scripts/first_launch.py [--runs 1] [--model FILE.gguf] [--json FILE] [-- more ppd chat args]

The first launch gets new, empty folders for ``XDG_DATA_HOME``, ``XDG_CACHE_HOME`` and ``HF_HOME`` (profiles,
calibration, caches, the Hub's downloads); each of the ``--runs`` launches after it keeps them ("ready": what a
user sees on every later launch). Each launch is the venv's ``ppd`` console script, ``ppd chat --host 127.0.0.1
--port P`` on a free port with its default threads, timed from the process start to

* ``seconds_to_page``: ``GET /`` answering HTTP 200 (Gradio's page), and
* ``seconds_to_answer``: a completed, non-streamed ``POST /v1/chat/completions`` (the user message "Say hello.",
  ``max_tokens`` 32, temperature 0), asked again every 0.1 s while the API answers 503 (the model loading or
  calibrating; the 503's message is kept as ``progress_shown``).

Then ``/`` is fetched once more (a page open) and the resident memory of the server process and its children is
summed (psutil), and ``/proc/PID/maps`` tells whether libtorch is mapped into any of them (torch imported; the GGUF
path should not need it). transformers is pure Python and leaves no such trace.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

from measurement import ROOT, free_port, machine, now, report

POLL_SECONDS = 0.1
QUESTION = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 32, "temperature": 0}
TORCH_LIBRARIES = ("libtorch", "libc10")  # torch's shared libraries: mapped once `import torch` ran
FOLDERS = ("XDG_DATA_HOME", "XDG_CACHE_HOME", "HF_HOME")
UNSET = ("PPD_AUTH", "PPD_API_KEY")  # a login or key from the caller's environment would refuse the script's requests


def ppd_script() -> Path:
    """The ``ppd`` console script of the venv running this script, else of the repository's .venv."""
    for candidate in (Path(sys.executable).with_name("ppd"), ROOT / ".venv" / "bin" / "ppd"):
        if candidate.is_file():
            return candidate
    raise SystemExit("no `ppd` console script beside this Python or in .venv/bin: run make setup, or pass --ppd PATH")


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants (those still alive)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def torch_libraries(processes: list[psutil.Process]) -> list[str]:
    """The names of torch's shared libraries mapped into any of ``processes`` (from /proc/PID/maps)."""
    found = set()
    for process in processes:
        try:
            maps = Path(f"/proc/{process.pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            name = line.rsplit("/", 1)[-1] if "/" in line else ""
            if name.startswith(TORCH_LIBRARIES):
                found.add(name)
    return sorted(found)


def memory(pid: int) -> dict:
    """Resident memory of the process and its children, in MB, and whether torch is mapped into them."""
    processes = process_tree(pid)
    rows = []
    for process in processes:
        try:
            rows.append({"pid": process.pid, "name": process.name(), "rss_mb": round(process.memory_info().rss / 2**20, 1)})
        except psutil.NoSuchProcess:
            continue
    libraries = torch_libraries(processes)
    return {"rss_mb": round(sum(row["rss_mb"] for row in rows), 1), "processes": rows,
            "torch_loaded": bool(libraries), "torch_libraries_mapped": libraries}


def stop(process: subprocess.Popen) -> int | None:
    """End the server and its children: SIGINT (ppd's Ctrl+C), then SIGKILL after 30 s."""
    children = process_tree(process.pid)[1:]
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)
    for child in children:  # started by the server: gone with it, else ended here
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    return process.returncode


def launch(command: list[str], env: dict, log_path: Path, timeout: float) -> dict:
    """One launch: times to the page and to a completed answer, then memory with a page open."""
    port = int(command[command.index("--port") + 1])
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=httpx.Timeout(300, connect=2))
    progress: list[tuple[float, str]] = []
    page = answered = None
    answer: dict = {}
    with log_path.open("w") as log:  # a file, not a pipe: tqdm's bars would fill a pipe nobody reads and block ppd
        started = time.monotonic()
        process = subprocess.Popen(command, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        while process.poll() is None and time.monotonic() - started < timeout:
            try:
                if page is None:
                    if client.get("/").status_code == 200:
                        page = time.monotonic() - started
                    else:
                        time.sleep(POLL_SECONDS)
                    continue
                asked = time.monotonic()
                response = client.post("/v1/chat/completions", json=QUESTION)
                if response.status_code == 200:
                    answered = time.monotonic() - started
                    body = response.json()
                    answer = {"answer_request_seconds": round(time.monotonic() - asked, 3),
                              "answer": body["choices"][0]["message"]["content"],
                              "completion_tokens": body.get("usage", {}).get("completion_tokens")}
                    break
                if response.status_code != 503:
                    raise SystemExit(f"POST /v1/chat/completions answered {response.status_code}: {response.text[:300]}")
                line = response.json().get("error", {}).get("message", "").split("…")[0].strip()
                if line and (not progress or progress[-1][1] != line):
                    progress.append((round(time.monotonic() - started, 1), line))
            except httpx.TransportError:  # not listening yet
                pass
            time.sleep(POLL_SECONDS)
        after = {}
        if answered is not None:
            client.get("/").raise_for_status()  # the page, served once more: a page open
            after = memory(process.pid)
    finally:
        client.close()
        code = stop(process)
    return {"seconds_to_page": None if page is None else round(page, 2),
            "seconds_to_answer": None if answered is None else round(answered, 2),
            **answer, "progress_shown": progress,
            "memory_after_answer_with_page": after, "exit_code": code,
            "log_tail": log_path.read_text(errors="replace").replace("\r", "\n").splitlines()[-12:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="launches after the first, with its folders kept (default 1)")
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file for --model (default: ppd's default model)")
    parser.add_argument("--ppd", type=Path, default=None, help="the ppd console script (default: the venv's)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a launch may take to answer")
    parser.add_argument("--keep", action="store_true", help="keep the data, cache and HF folders (printed) at the end")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("extra", nargs="*", help="more `ppd chat` arguments (after --)")
    args = parser.parse_args()
    if args.runs < 0:
        parser.error("--runs must be 0 or more")
    ppd = args.ppd or ppd_script()
    root = Path(tempfile.mkdtemp(prefix="ppd-first-launch-"))
    folders = {name: root / name.lower() for name in FOLDERS}
    for folder in folders.values():
        folder.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in UNSET}
    env.update({name: str(folder) for name, folder in folders.items()}, PYTHONUNBUFFERED="1")
    model = ["--model", str(args.model.resolve())] if args.model else []
    launches = []
    try:
        for number in range(1 + args.runs):
            command = [str(ppd), "chat", "--host", "127.0.0.1", "--port", str(free_port()), *model, *args.extra]
            result = launch(command, env, root / f"launch-{number}.log", args.timeout)
            launches.append({"launch": "first" if number == 0 else "ready", **result})
            print(f"launch {number + 1}/{1 + args.runs}: page {result['seconds_to_page']} s, answer "
                  f"{result['seconds_to_answer']} s", file=sys.stderr, flush=True)
            if result["seconds_to_answer"] is None:
                break
    finally:
        if args.keep:
            print(f"folders kept under {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)

    def median(key: str, which: list[dict]) -> float | None:
        values = [launch[key] for launch in which if launch[key] is not None]
        return round(statistics.median(values), 2) if values else None

    ready = [launch for launch in launches if launch["launch"] == "ready"]
    result = {
        "command": " ".join(["python", "benchmarks/scripts/first_launch.py", *sys.argv[1:]]),
        "ppd_command": " ".join(["ppd", "chat", "--host", "127.0.0.1", "--port", "PORT", *model, *args.extra]),
        "environment": {name: "a new empty folder, kept across the launches" for name in FOLDERS},
        "request": QUESTION,
        "date": now(),
        "machine": machine(),
        "first": {"seconds_to_page": launches[0]["seconds_to_page"],
                  "seconds_to_answer": launches[0]["seconds_to_answer"],
                  "rss_mb": launches[0]["memory_after_answer_with_page"].get("rss_mb"),
                  "torch_loaded": launches[0]["memory_after_answer_with_page"].get("torch_loaded")},
        "ready": {"runs": len(ready), "median_seconds_to_page": median("seconds_to_page", ready),
                  "median_seconds_to_answer": median("seconds_to_answer", ready)} if ready else None,
        "launches": launches,
    }
    report(result, args.json)
    return 0 if all(launch["seconds_to_answer"] is not None for launch in launches) else 1


if __name__ == "__main__":
    sys.exit(main())
