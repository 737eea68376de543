"""llama.cpp's own ``llama-server`` answering `ppd bench`'s conversations beside ppd: plain, and with its n-gram drafts.

One server process per kind of decoding (``SPEC_TYPES``), on the same GGUF file and threads, with flash attention
and a Q8_0 KV cache as ppd's backend loads llama.cpp, one slot, its prompt cache on. Each conversation starts from
an erased slot (ppd's bench starts each from an empty cache too), so a follow-up reuses its first turn's cells and
nothing else does. Requests are greedy as ppd's (only the top-k sampler, k 1; the bench's penalties when on).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from ppd_core.errors import PpdError
from ppd_core.sampling.params import SamplingParams

SPEC_TYPES = {"plain": [], "ngram-simple": ["--spec-type", "ngram-simple"], "ngram-mod": ["--spec-type", "ngram-mod"]}
CONTEXT = 4096
READY_SECONDS = 300


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def executable(binary: Path) -> Path:
    """``binary`` (a path, or a name on PATH) as an executable file's path; PpdError in one line otherwise."""
    found = Path(shutil.which(str(binary)) or binary)
    if not (found.is_file() and os.access(found, os.X_OK)):
        raise PpdError(f"--compare-llama-server: {binary} is not an executable file")
    return found


def has_amx() -> bool:
    """Whether this CPU has AMX (/proc/cpuinfo's ``amx_int8``), where llama.cpp must not repack weights."""
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def server_help(binary: Path) -> str:
    try:
        done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    except OSError as error:
        raise PpdError(f"--compare-llama-server: cannot run {binary} ({error.strerror or error})") from None
    return done.stdout + done.stderr


def server_command(binary: Path, gguf: Path, threads: int, spec: str, port: int, help_text: str,
                   kv_cache: str = "q8_0", context: int = CONTEXT, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line, in the flag spellings this build takes (its ``--help``): on an AMX CPU without weight
    repacking, as ppd's device policy loads llama.cpp there (``device_policy.llama_extra_buffers``)."""
    if spec not in SPEC_TYPES:
        raise PpdError(f"unknown llama-server decoding {spec!r}; choose from {', '.join(SPEC_TYPES)}")
    if SPEC_TYPES[spec] and "--spec-type" not in help_text:
        raise PpdError(f"--compare-llama-server: {binary} has no --spec-type (a llama.cpp older than ngram-mod)")
    flash = ["-fa", "on"] if "[on|off|auto]" in help_text else ["-fa"]  # older builds: a switch
    no_repack = ["--no-repack"] if has_amx() and "--no-repack" in help_text else []
    no_webui = ["--no-webui"] if "--no-webui" in help_text else []
    # slot actions (the erase before each conversation) need a save path; the RAM prompt cache would bring an
    # erased conversation's cells back
    no_ram_cache = ["--cache-ram", "0"] if "--cache-ram" in help_text else []
    return [str(binary), "-m", str(gguf), "-t", str(threads), "-tb", str(threads), *flash, "-ctk", kv_cache,
            "-ctv", kv_cache, "-c", str(context), "-np", "1", *no_webui, *no_repack, *no_ram_cache,
            "--slot-save-path", tempfile.gettempdir(), "--host", "127.0.0.1", "--port", str(port),
            *SPEC_TYPES[spec], *extra]


def server_request(messages: list[dict], max_new_tokens: int, sampling: SamplingParams) -> dict:
    """Greedy as ppd's: the top-k sampler alone, k 1 (the server's default chain has DRY, min-p...); its penalties
    sampler first where the bench's penalties are on. Every sampling field goes by its own name (llama-server's, the
    same: ``ppd_core.sampling.fields``); ``samplers`` says which of them act."""
    chain = ["penalties", "top_k"] if sampling.penalized else ["top_k"]
    return {"messages": messages, "max_tokens": max_new_tokens, "stream": False, **sampling.values(),
            "temperature": 0.0, "top_k": 1, "samplers": chain, "cache_prompt": True}


class ServerPeer:
    """One running ``llama-server``; ``conversation`` answers one question's turns, each timed over HTTP."""

    def __init__(self, binary: Path, gguf: Path, threads: int, spec: str, sampling: SamplingParams):
        binary = executable(binary)
        self.spec, self.sampling = spec, sampling
        port = free_port()
        self.command = server_command(binary, gguf, threads, spec, port, server_help(binary))
        self.url = f"http://127.0.0.1:{port}"
        self.log = Path(tempfile.mkstemp(prefix=f"llama-server-{spec}-", suffix=".log")[1])
        with self.log.open("w") as output:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
        self.client = httpx.Client(base_url=self.url, timeout=600)
        self.prompt_processed = 0  # prompt tokens the server decoded (``timings.prompt_n``): what its cache left
        try:
            self.wait_ready()
            self.build_info = self.client.get("/props").json().get("build_info")
        except BaseException:
            self.close()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = " | ".join(self.log.read_text(errors="replace").splitlines()[-3:])
                raise PpdError(f"--compare-llama-server: llama-server ({self.spec}) exited with status "
                               f"{self.process.returncode}: {tail}")
            try:
                if self.client.get("/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise PpdError(f"--compare-llama-server: llama-server ({self.spec}) was not ready in {READY_SECONDS} s")

    def answer(self, messages: list[dict], max_new_tokens: int) -> tuple[str, int, float]:
        """(text, new tokens, wall seconds) of one non-streamed chat completion."""
        start = time.perf_counter()
        response = self.client.post("/v1/chat/completions", json=server_request(messages, max_new_tokens, self.sampling))
        seconds = time.perf_counter() - start
        body = response.raise_for_status().json()
        self.prompt_processed += body.get("timings", {}).get("prompt_n", 0)
        return body["choices"][0]["message"]["content"] or "", body["usage"]["completion_tokens"], seconds

    def conversation(self, turns: list[str], max_new_tokens: int) -> list[tuple[str, int, float]]:
        """Each turn's (text, new tokens, seconds), following its own answers, from an erased slot."""
        self.client.post("/slots/0", params={"action": "erase"}).raise_for_status()
        history, answers = [], []
        for turn in turns:
            history.append({"role": "user", "content": turn})
            answers.append(self.answer(history, max_new_tokens))
            history.append({"role": "assistant", "content": answers[-1][0]})
        return answers

    def describe(self, gguf: Path) -> dict:
        shown = [arg if arg != str(gguf) else gguf.name for arg in self.command]
        port = shown.index("--port") + 1
        return {"command": " ".join(["llama-server", *shown[1:port], "PORT", *shown[port + 1:]]),
                "binary": self.command[0], "build_info": self.build_info, "prompt_tokens_processed": self.prompt_processed,
                "request": server_request([{"role": "user", "content": "QUESTION"}], 0, self.sampling)}

    def close(self) -> None:
        self.client.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.unlink(missing_ok=True)
