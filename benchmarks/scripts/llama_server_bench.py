"""llama.cpp's own C++ `llama-server` on the questions `ppd bench` asks: the figure ppd is compared with.

    python benchmarks/scripts/llama_server_bench.py --server PATH/llama-server [--limit 20]
        [--max-new-tokens 128] [--turns 1] [--threads 2] [--kv-cache f16|q8_0] [--json FILE]

Build the server from the llama.cpp that llama-cpp-python vendors (the same source as ppd's backend):
`cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build --target llama-server`.
The server runs the default GGUF with flash attention on the given threads; each question is a greedy
`/v1/chat/completions` request (``top_k`` 1, no repeat penalty) timed over HTTP, prompt processing
included, as `ppd bench` times its answers. As there, a first turn is processed whole (``cache_prompt``
off) and a second turn follows the server's own first answer, reusing the conversation's cells.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import time
from pathlib import Path

import httpx

from app.bench import read_questions
from app.cli import DEFAULT_QUESTIONS
from measurement import report
from ppd_core.device_info import cpu_name
from ppd_core.loading import default_model_file


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen) -> None:
    for _ in range(600):
        if server.poll() is not None:
            raise SystemExit(f"llama-server exited with status {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("llama-server did not become ready in 120 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-cache", default="f16", choices=("f16", "q8_0"),
                        help="the KV cache type (f16: llama-server's default; q8_0: ppd's, for its bitwise trees)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    gguf, port = default_model_file(), free_port()
    command = [str(args.server), "-m", str(gguf), "-t", str(args.threads), "-tb", str(args.threads), "-fa", "on",
               "-c", "4096", "-ctk", args.kv_cache, "-ctv", args.kv_cache, "--port", str(port), "--no-webui", "-np", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    by_turn = {}
    try:
        wait_ready(url, server)
        client = httpx.Client(base_url=url, timeout=600)

        def ask(messages: list[dict]) -> tuple[str, int, float]:
            body = {"messages": messages, "max_tokens": args.max_new_tokens, "temperature": 0.0, "top_k": 1,
                    "repeat_penalty": 1.0, "cache_prompt": len(messages) > 1}
            start = time.perf_counter()
            answer = client.post("/v1/chat/completions", json=body).raise_for_status().json()
            return answer["choices"][0]["message"]["content"], answer["usage"]["completion_tokens"], time.perf_counter() - start

        ask([{"role": "user", "content": "Say hello."}])  # warm-up, as ppd bench does
        for question in read_questions(DEFAULT_QUESTIONS, args.limit):
            history: list[dict] = []
            for turn, text in enumerate(question.turns[: args.turns], 1):
                history.append({"role": "user", "content": text})
                answer, tokens, seconds = ask(history)
                totals = by_turn.setdefault(f"turn {turn}", {"new_tokens": 0, "seconds": 0.0})
                totals["new_tokens"] += tokens
                totals["seconds"] += seconds
                history.append({"role": "assistant", "content": answer})
    finally:
        server.terminate()
        server.wait()
    for totals in by_turn.values():
        totals["tok_s"] = round(totals["new_tokens"] / totals["seconds"], 2)
        totals["seconds"] = round(totals["seconds"], 3)
    shown = ["llama-server", "-m", gguf.name] + [a for a in command[3:] if a not in ("--port", str(port))]
    report({"command": " ".join(shown), "cpu": cpu_name(),
            "questions": args.limit, "max_new_tokens": args.max_new_tokens,
            "prompt_cache": "first turns processed whole, follow-ups reuse the conversation's cells",
            "by_turn": by_turn}, args.json)


if __name__ == "__main__":
    main()
