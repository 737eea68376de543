"""llama.cpp's own C++ `llama-server` against ppd's plain decoding on the MT-Bench first turns: the peer figure.

    .venv/bin/python benchmarks/scripts/llama_server_bench.py [--limit N] [--max-new-tokens 96] [--threads 2]
        [--model FILE.gguf] [--ppd-modes plain|plain,ppd|none] [--server PATH] [--json FILE]
    .venv/bin/python benchmarks/scripts/llama_server_bench.py --build-only   # build (or find) llama-server, print its path

**The server.** Without ``--server`` it is built once from the llama.cpp source that llama-cpp-python vendors (the
sdist of the installed version, fetched with pip: the same source as ppd's backend), for this CPU
(``GGML_NATIVE``), and cached under ``$XDG_CACHE_HOME/ppd-bench`` (default ``~/.cache/ppd-bench``). It runs the
GGUF with flash attention (``-fa on``), a Q8_0 KV cache (``-ctk q8_0 -ctv q8_0``, as ppd's backend), ``-t`` and
``-tb`` threads, one slot, and on an AMX CPU without weight repacking (``--no-repack``), as ppd's device policy
loads llama.cpp there (its AMX matmul segfaults: ``ppd_core.device_policy.llama_extra_buffers``).

**The requests.** Each first turn is one non-streamed ``POST /v1/chat/completions``: greedy (temperature 0, only
the ``top_k`` sampler with ``top_k`` 1, ``repeat_penalty`` 1.0), ``max_tokens`` new tokens, ``cache_prompt`` true
(the server keeps the previous prompt's cells and processes only what differs: the chat template's common head).
Each is timed over HTTP, prompt processing included; tokens/s = new tokens / wall time, summed over the requests.
Before timing, one native ``/completion`` request with the same fields checks that the server applies them (its
``generation_settings`` echo; kept in the JSON as ``sampling_applied``).

**ppd, side by side.** ppd's own decoding (``--ppd-modes``; plain decoding by default) answers the same questions in
this process through its Python API (``ppd_core.engine``, the GGUF on its llama.cpp backend with the same threads),
interleaved per question (which one goes first alternates), timed the same way: the chat template, the answer and
its text. Its KV cache is kept between questions (``reuse_cache``), so it too processes only what differs from the
previous prompt (one engine per mode, so two modes never share a cache). Each side warms up on one short answer
first. ``ppd`` mode calibrates first where this device has no profile yet (minutes). The JSON has every side's
tokens/s, the ratios to the server and the exact commands and calls.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from measurement import cpu_flags, cpu_model, default_gguf, first_turns, free_port, machine, now, report

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ppd-bench"
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
                 # no Web UI: neither npm nor a download from the Hub at build time (its assets table stays empty)
                 "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]
WARM_UP = "Say hello."
Answerer = Callable[[str, int], tuple[str, int]]  # (question, max new tokens) -> (answer text, new tokens)


# ---- llama-server: built from llama-cpp-python's vendored llama.cpp, cached ----


def llama_cpp_python_version() -> str:
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "0.3.36"  # the Makefile's LLAMA_CPP_VERSION


def build_folder(version: str, cmake_args: list[str]) -> Path:
    """Per llama-cpp-python version, CPU (a native build runs only on its own kind) and extra CMake options."""
    key = hashlib.sha256(" ".join([cpu_model(), *sorted(cpu_flags()), *cmake_args]).encode()).hexdigest()[:10]
    return CACHE / f"llama-server-{version}-{key}"


def vendored_source(version: str, folder: Path) -> Path:
    """llama.cpp's source from the llama-cpp-python sdist (pip download; pip's cache answers a repeat)."""
    source = folder / "llama.cpp"
    if (source / "CMakeLists.txt").is_file():
        return source
    with tempfile.TemporaryDirectory() as download:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", download], check=True)
        sdist = next(Path(download).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            prefix = f"{archive.getnames()[0].split('/')[0]}/vendor/llama.cpp/"
            members = []
            for member in archive.getmembers():
                if member.name.startswith(prefix):
                    member.name = member.name[len(prefix):]
                    members.append(member)
            folder.mkdir(parents=True, exist_ok=True)
            archive.extractall(source, members=members, filter="data")
    return source


def build_server(jobs: int, cmake_args: list[str]) -> tuple[Path, list[str]]:
    """The cached ``llama-server`` binary (built now if missing) and the CMake configure command that made it."""
    version = llama_cpp_python_version()
    folder = build_folder(version, cmake_args)
    binary = folder / "build" / "bin" / "llama-server"
    configure = ["cmake", "-S", str(folder / "llama.cpp"), "-B", str(folder / "build"), *CMAKE_OPTIONS, *cmake_args]
    if binary.is_file():
        return binary, configure
    source = vendored_source(version, folder)
    print(f"building llama-server from llama-cpp-python {version}'s llama.cpp in {folder} ({jobs} jobs; minutes)",
          file=sys.stderr, flush=True)
    log = folder / "build.log"
    with log.open("w") as output:
        for command in (configure, ["cmake", "--build", str(folder / "build"), "--target", "llama-server", "-j", str(jobs)]):
            if subprocess.run(command, stdout=output, stderr=subprocess.STDOUT, cwd=source).returncode:
                raise SystemExit(f"building llama-server failed: {' '.join(command)}; see {log}")
    return binary, configure


def server_help(server: Path) -> str:
    done = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def server_command(server: Path, gguf: Path, threads: int, kv_cache: str, context: int, repack: str,
                   port: int, extra: list[str]) -> list[str]:
    """The llama-server command line, in the flag spellings this build takes (from its --help)."""
    help_text = server_help(server)
    flash = ["-fa", "on"] if "[on|off|auto]" in help_text else ["-fa"]  # older builds: a switch
    no_repack = repack == "off" or (repack == "auto" and "amx_int8" in cpu_flags())  # ppd's AMX policy
    if no_repack and "--no-repack" not in help_text:
        raise SystemExit("this llama-server has no --no-repack, which an AMX CPU needs (llama.cpp#20824)")
    return [str(server), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), *flash,
            "-ctk", kv_cache, "-ctv", kv_cache, "-c", str(context), "-np", "1", "--no-webui",
            *(["--no-repack"] if no_repack else []), "--host", "127.0.0.1", "--port", str(port), *extra]


def wait_ready(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise SystemExit(f"llama-server exited with status {server.returncode}:\n{tail}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("llama-server did not become ready in 300 s")


def server_request(question: str, max_new_tokens: int) -> dict:
    """Greedy as ppd's: only the top-k sampler, k 1 (llama-server's default chain has penalties, DRY, min-p...)."""
    return {"messages": [{"role": "user", "content": question}], "max_tokens": max_new_tokens, "stream": False,
            "temperature": 0.0, "top_k": 1, "samplers": ["top_k"], "repeat_penalty": 1.0, "cache_prompt": True}


class ServerAnswerer:
    """``Answerer`` over HTTP; keeps the prompt tokens the server processed (``timings.prompt_n``) per request."""

    def __init__(self, url: str):
        self.client = httpx.Client(base_url=url, timeout=600)
        self.prompt_tokens = self.processed = 0
        self.split = {"prompt_s": 0.0, "generation_s": 0.0}  # the server's own timings (inside llama.cpp)

    def __call__(self, question: str, max_new_tokens: int) -> tuple[str, int]:
        answer = self.client.post("/v1/chat/completions", json=server_request(question, max_new_tokens))
        answer = answer.raise_for_status().json()
        self.prompt_tokens += answer["usage"]["prompt_tokens"]
        timings = answer.get("timings", {})
        self.processed += timings.get("prompt_n", 0)
        self.split["prompt_s"] += timings.get("prompt_ms", 0.0) / 1000
        self.split["generation_s"] += timings.get("predicted_ms", 0.0) / 1000
        return answer["choices"][0]["message"]["content"] or "", answer["usage"]["completion_tokens"]


def sampling_check(url: str) -> dict:
    """The sampler settings the server applies to such a request, as its native ``/completion`` echoes them
    (``generation_settings``); exits if they are not greedy top-k 1 alone."""
    body = {key: value for key, value in server_request("Hi", 1).items() if key not in ("messages", "max_tokens")}
    echoed = httpx.post(f"{url}/completion", json={**body, "prompt": "Hi", "n_predict": 1}, timeout=600)
    settings = echoed.raise_for_status().json()["generation_settings"]
    applied = {key: settings.get(key) for key in ("samplers", "top_k", "temperature", "repeat_penalty")}
    if applied["samplers"] != ["top_k"] or applied["top_k"] != 1:
        raise SystemExit(f"llama-server did not take the greedy settings: {applied}")
    return applied


# ---- ppd, in this process: the one function coupled to ppd's API ----

PPD_CALLS = ("engine = Engine.load(EngineConfig(model=GGUF, backend='llamacpp', threads={threads}, "
             "auto_calibrate={calibrate})); per question, timed: result = engine.generate(engine.chat_ids([{{'role': "
             "'user', 'content': QUESTION}}]), {mode!r}, {tokens}, reuse_cache=True); result.text, len(result.tokens)")


def ppd_answerer(gguf: Path, threads: int, mode: str) -> Answerer:
    """ppd's decoding in ``mode`` ("plain" or "ppd") through ``ppd_core.engine`` (see ``PPD_CALLS``). One
    engine per mode: each keeps its own previous conversation's cache, as the server keeps its previous prompt."""
    from ppd_core import Engine, EngineConfig  # noqa: PLC0415 - only when ppd runs too

    engine = Engine.load(EngineConfig(model=str(gguf), backend="llamacpp", threads=threads,
                                      auto_calibrate=mode == "ppd"))

    def answer(question: str, max_new_tokens: int) -> tuple[str, int]:
        ids = engine.chat_ids([{"role": "user", "content": question}])
        result = engine.generate(ids, mode, max_new_tokens, reuse_cache=True)
        answer.prompt_tokens += len(ids)
        answer.processed += result.stats.prompt_tokens - result.stats.reused_tokens
        answer.split["prompt_s"] += result.stats.prefill_seconds
        answer.split["generation_s"] += result.stats.decode_seconds
        return result.text, len(result.tokens)

    answer.prompt_tokens = answer.processed = 0  # the chat template's tokens, to compare with the server's
    answer.split = {"prompt_s": 0.0, "generation_s": 0.0}  # ppd's own step timings
    return answer


# ---- the run ----


def rounded(split: dict) -> dict:
    """Seconds in prompt processing and in generating, as each side times itself (the rest is HTTP or Python)."""
    return {key: round(value, 3) for key, value in split.items()}


class Totals:
    def __init__(self):
        self.new_tokens, self.seconds, self.answers = 0, 0.0, []

    def timed(self, answer: Answerer, question: str, max_new_tokens: int) -> None:
        start = time.perf_counter()
        text, tokens = answer(question, max_new_tokens)
        self.seconds += time.perf_counter() - start
        self.new_tokens += tokens
        self.answers.append(text.strip())

    def to_json(self) -> dict:
        return {"new_tokens": self.new_tokens, "seconds": round(self.seconds, 3),
                "tok_s": round(self.new_tokens / self.seconds, 2) if self.seconds else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the GGUF file (default: ppd's default model)")
    parser.add_argument("--limit", type=int, default=None, help="the first N questions (default: all 80)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache", default="q8_0", choices=("q8_0", "f16"), help="llama-server's KV cache type")
    parser.add_argument("--context", type=int, default=4096, help="llama-server's context (-c)")
    parser.add_argument("--repack", default="auto", choices=("auto", "on", "off"),
                        help="llama.cpp's weight repacking (auto: off on an AMX CPU, as ppd loads llama.cpp)")
    parser.add_argument("--ppd-modes", default="plain",
                        help="ppd's decodings to time beside the server: plain, ppd, both comma-separated, or none")
    parser.add_argument("--server", type=Path, default=None, help="a llama-server binary (default: build and cache one)")
    parser.add_argument("--build-jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cmake-arg", action="append", default=[], help="another CMake option for the build (repeatable)")
    parser.add_argument("--server-arg", action="append", default=[], help="another llama-server argument (repeatable)")
    parser.add_argument("--build-only", action="store_true", help="build (or find) llama-server, print its path, exit")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    modes = [] if args.ppd_modes == "none" else [m for m in args.ppd_modes.split(",") if m]
    if any(mode not in ("plain", "ppd") for mode in modes):
        parser.error("--ppd-modes takes plain, ppd, plain,ppd or none")

    if args.server:
        server, configure = args.server, None
    else:
        server, configure = build_server(args.build_jobs, args.cmake_arg)
    if args.build_only:
        print(server)
        return 0
    gguf = (args.model or default_gguf()).resolve()
    questions = first_turns(args.limit)
    port = free_port()
    command = server_command(server, gguf, args.threads, args.kv_cache, args.context, args.repack, port, args.server_arg)
    ppd = {mode: ppd_answerer(gguf, args.threads, mode) for mode in modes}  # loaded before the server starts

    log = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
    with log.open("w") as output:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    sides: dict[str, Answerer] = {}
    totals: dict[str, Totals] = {}
    try:
        wait_ready(url, process, log)
        applied = sampling_check(url)
        build_info = httpx.get(f"{url}/props", timeout=60).json().get("build_info")
        peer = ServerAnswerer(url)
        sides = {"llama_server": peer, **{f"ppd_{mode}": answer for mode, answer in ppd.items()}}
        totals = {name: Totals() for name in sides}
        for answer in sides.values():
            answer(WARM_UP, 16)
            answer.prompt_tokens = answer.processed = 0
            answer.split = {"prompt_s": 0.0, "generation_s": 0.0}
        names = list(sides)
        for number, question in enumerate(questions):
            order = names if number % 2 == 0 else names[::-1]
            for name in order:
                totals[name].timed(sides[name], question, args.max_new_tokens)
            line = ", ".join(f"{name} {totals[name].to_json()['tok_s']} tok/s" for name in names)
            print(f"[{number + 1}/{len(questions)}] {line}", file=sys.stderr, flush=True)
    finally:
        process.terminate()
        process.wait(timeout=60)
    log.unlink()

    shown = ["llama-server", *(arg if arg != str(gguf) else gguf.name for arg in command[1:])]
    shown = shown[: shown.index("--port") + 1] + ["PORT"] + shown[shown.index("--port") + 2:]
    server_json = {**totals["llama_server"].to_json(), "command": " ".join(shown), "binary": str(server),
                   "built_with": None if configure is None else " ".join(configure),
                   "source": None if configure is None else f"llama-cpp-python {llama_cpp_python_version()} sdist, vendor/llama.cpp",
                   "build_info": build_info, "request": server_request("QUESTION", args.max_new_tokens),
                   "sampling_applied": applied,
                   "prompt_tokens": peer.prompt_tokens, "prompt_tokens_processed": peer.processed,
                   "split": rounded(peer.split)}
    result = {
        "command": " ".join(["python", "benchmarks/scripts/llama_server_bench.py", *sys.argv[1:]]),
        "date": now(), "machine": machine(), "model": gguf.name, "questions": len(questions),
        "turns": "first turns of app/data/mt_bench.jsonl", "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "timing": "wall time of each answer (prompt processing included), summed; tok/s = new tokens / that time; "
                  "interleaved per question, the order alternating; one warm-up answer each first",
        "llama_server": server_json,
    }
    for mode in modes:
        side = totals[f"ppd_{mode}"]
        same = sum(a == b for a, b in zip(side.answers, totals["llama_server"].answers))
        server_tok_s = totals["llama_server"].to_json()["tok_s"]
        result[f"ppd_{mode}"] = {**side.to_json(), "calls": PPD_CALLS.format(
            threads=args.threads, calibrate=mode == "ppd", mode=mode, tokens=args.max_new_tokens),
                                 "prompt_tokens": sides[f"ppd_{mode}"].prompt_tokens,
                                 "prompt_tokens_processed": sides[f"ppd_{mode}"].processed,
                                 "split": rounded(sides[f"ppd_{mode}"].split),
                                 "same_text_as_llama_server": f"{same}/{len(questions)}",
                                 "over_llama_server": round(side.to_json()["tok_s"] / server_tok_s, 4) if server_tok_s else None}
    result["ratios"] = {f"ppd_{mode}_over_llama_server": result[f"ppd_{mode}"]["over_llama_server"] for mode in modes}
    report(result, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
