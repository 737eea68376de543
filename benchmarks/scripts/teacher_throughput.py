"""How fast llama.cpp writes teacher answers, against the transformers batch ``ppd train`` uses.

Prompt-token training learns from the model's own greedy answers. ``ppd train`` writes them with transformers'
``generate`` on the float32 model, 32 prompts per batch. This times llama.cpp on the shipped GGUF writing the same
answers (``llama-server`` with ``--parallel`` slots and continuous batching, the prompts sent as token ids,
greedy), so the "llama.cpp as the teacher" try has its data rate measured rather than assumed.

    python benchmarks/scripts/teacher_throughput.py --server BIN --answers FILE [--count 64] [--parallel 1,8,32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.server_peer import free_port  # noqa: E402
from ppd_core.loading import default_model_file  # noqa: E402
from ppd_core.training.answers import read_cache  # noqa: E402


def timed(server: Path, records: list[dict], parallel: int, threads: int, max_new_tokens: int) -> dict:
    port = free_port()
    command = [str(server), "-m", str(default_model_file()), "-t", str(threads), "-tb", str(threads), "-fa", "on",
               "-c", str(1024 * parallel), "-np", str(parallel), "--no-webui", "--host", "127.0.0.1", "--port", str(port)]
    log = Path(tempfile.mkstemp(suffix=".log")[1])
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=900)
    try:
        while True:
            try:
                if client.get("/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

        def answer(record: dict) -> int:
            body = {"prompt": record["ids"][: record["prompt_length"]], "n_predict": max_new_tokens, "temperature": 0.0,
                    "top_k": 1, "samplers": ["top_k"], "cache_prompt": False}
            return client.post("/completion", json=body).raise_for_status().json()["tokens_predicted"]

        start = time.perf_counter()
        with ThreadPoolExecutor(parallel) as pool:
            tokens = sum(pool.map(answer, records))
        seconds = time.perf_counter() - start
    finally:
        process.terminate()
        process.wait()
    return {"parallel": parallel, "answers": len(records), "new_tokens": tokens, "seconds": round(seconds, 1),
            "answers_per_minute": round(60 * len(records) / seconds, 1), "tokens_per_second": round(tokens / seconds, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True, help="a llama-server binary")
    parser.add_argument("--answers", type=Path, required=True, help="ppd train's answers.jsonl (its prompts are reused)")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--parallel", default="1,8,32")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    records = read_cache(args.answers)
    records = records[:: max(1, len(records) // args.count)][: args.count]  # spread over the prompt lengths
    results = [timed(args.server, records, int(p), args.threads, args.max_new_tokens) for p in args.parallel.split(",")]
    text = json.dumps({"model": default_model_file().name, "threads": args.threads, "runs": results}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
