"""The OpenAI-compatible API's overhead: the same answers through HTTP and through the engine directly.

    python benchmarks/scripts/api_overhead.py [--questions 8] [--max-tokens 128] [--tree auto] [--threads N]
        [--model FILE.gguf] [--json FILE]

Starts the API in this process on the model (default: the default GGUF on llama.cpp) as ``ppd serve`` does
(uvicorn on 127.0.0.1, the decoding on the API's own thread), then answers the first turns of the first
``--questions`` MT-Bench questions greedily, one at a time, each twice: once as a non-streamed
request through the official ``openai`` client and once with ``Engine.generate`` (what ``ppd
generate`` runs), alternating which goes first. Speed is answer tokens over wall time: from
sending the request to having the parsed response for the API, around the call for the engine.
Prints one JSON object (and writes it to ``--json``). (``benchmarks/measurements/api-overhead.json`` was measured on
the former torch int4 forward.)
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from app.api import create_api
from app.model_host import ModelHost
from app.questions import DEFAULT_QUESTIONS, read_questions
from app.server import make_server
from ppd_core import Engine, EngineConfig
from measurement import cpu_model, free_port, report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--tree", default="auto")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads for the model (default: one per core, as `ppd serve`)")
    parser.add_argument("--model", default="default", help="a GGUF file or Hugging Face model (default: the default GGUF)")
    parser.add_argument("--json", type=Path, default=None, dest="json_path")
    args = parser.parse_args()
    import openai

    engine = Engine.load(EngineConfig(model=args.model, tree=args.tree, threads=args.threads))
    service = ModelHost(engine)
    port = free_port()
    server = make_server(create_api(service), "127.0.0.1", port)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)

    def via_api(messages):
        start = time.perf_counter()
        answer = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=args.max_tokens)
        seconds = time.perf_counter() - start
        return answer.choices[0].message.content, answer.usage.completion_tokens, seconds, answer.model_extra["ppd"]["tokens_per_second"]

    def via_engine(messages):
        start = time.perf_counter()
        result = engine.generate(engine.chat_ids(messages), "ppd", args.max_tokens)
        seconds = time.perf_counter() - start
        return result.text, result.stats.new_tokens, seconds, result.stats.tok_s

    warm = [{"role": "user", "content": "Hello!"}]
    via_api(warm), via_engine(warm)  # warm-up, both paths
    rows = []
    for index, turns in enumerate(q.turns for q in read_questions(DEFAULT_QUESTIONS, args.questions)):
        messages = [{"role": "user", "content": turns[0]}]
        order = ("api", "generate") if index % 2 == 0 else ("generate", "api")
        results = {name: (via_api if name == "api" else via_engine)(messages) for name in order}
        rows.append({
            "question": index + 1, "first": order[0], "identical": results["api"][0] == results["generate"][0],
            **{f"{name}_{field}": round(value, 4) if isinstance(value, float) else value
               for name, result in results.items()
               for field, value in zip(("tokens", "seconds", "engine_tok_s"), result[1:])},
        })
    server.should_exit = True
    thread.join(10)

    def total(name: str) -> dict:
        tokens = sum(row[f"{name}_tokens"] for row in rows)
        seconds = sum(row[f"{name}_seconds"] for row in rows)
        return {"tokens": tokens, "seconds": round(seconds, 3), "tok_s": round(tokens / seconds, 3)}

    api, generate = total("api"), total("generate")
    result = {
        "command": "python benchmarks/scripts/api_overhead.py " + " ".join(sys.argv[1:]),
        "device": f"{cpu_model()}, {engine.threads} threads",
        "model": engine.loaded.name, "backend": engine.loaded.backend.name, "quant": engine.loaded.quant,
        "forward": engine.loaded.forward,
        "tree": engine.plan.family.name, "max_tokens": args.max_tokens, "requests": len(rows),
        "speed": "answer tokens per second over wall time, sequential requests, non-streamed, greedy",
        "api": api, "generate": generate,
        "api_overhead_percent": round(100.0 * (1.0 - api["tok_s"] / generate["tok_s"]), 2),
        "identical": all(row["identical"] for row in rows),
        "rows": rows,
    }
    report(result, args.json_path)
    engine.close()


if __name__ == "__main__":
    main()
