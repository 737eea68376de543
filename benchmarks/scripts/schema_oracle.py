"""ppd's greedy constrained answers against llama-server's, same GGUF, on the 40 schema prompts (tests/schema_prompts.py).

    .venv/bin/python benchmarks/scripts/schema_oracle.py --server BIN [--json OUT] [--limit 40] [--max-new-tokens 80]

BIN: a llama-server built from the same llama.cpp (``benchmarks/scripts/llama_server_bench.py --build-only``). Each
prompt is asked of llama-server twice, with OpenAI's ``response_format`` json_schema and with the GBNF ppd makes of
the schema in llama-server's ``grammar`` field, greedy as ppd's bench asks it (``app.server_peer.server_request``),
with and without penalties; ppd answers each in plain and PPD modes as ``ppd serve`` does (response_format: the chat
grammar llama-server builds, the JSON bare or in a fence, and the JSON as the content). The JSON counts the equal answers per field and mode and keeps the first differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from app.server_peer import ServerPeer, server_request  # noqa: E402
from app.structured import json_content  # noqa: E402
from ppd_core import Engine, EngineConfig, SamplingParams  # noqa: E402
from ppd_core import schema_grammar  # noqa: E402
from ppd_core.loading import default_model_file  # noqa: E402
from schema_prompts import PROMPTS  # noqa: E402

PENALTIES = SamplingParams(repeat_penalty=1.2, repeat_last_n=64, presence_penalty=0.3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="medium", threads=2))
    engine.replan(lookup=4)
    counts: dict[str, list[int]] = {}
    differences = []
    for name, sampling in (("greedy", SamplingParams()), ("penalised", PENALTIES)):
        peer = ServerPeer(args.server, default_model_file(), 2, "plain", sampling)
        try:
            for prompt, schema in PROMPTS[: args.limit]:
                messages = [{"role": "user", "content": prompt}]
                grammar = schema_grammar(schema)
                wrapped = schema_grammar(schema, response_format=True)  # what ppd serve gives response_format
                ids = engine.chat_ids(messages)
                answers = {field: {mode: engine.generate(ids, mode, args.max_new_tokens, sampling=sampling,
                                                         grammar=constraint) for mode in ("plain", "ppd")}
                           for field, constraint in (("response_format", wrapped), ("grammar", grammar))}
                answers["grammar"] = {mode: result.text for mode, result in answers["grammar"].items()}
                answers["response_format"] = {mode: json_content(result.text, complete=result.stop_reason == "eos")
                                              for mode, result in answers["response_format"].items()}  # as ppd serve
                fields = {"response_format": {"response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": schema}}}, "grammar": {"grammar": grammar}}
                for field, extra in fields.items():
                    ours = answers[field]
                    body = {**server_request(messages, args.max_new_tokens, sampling), **extra}
                    theirs = peer.client.post("/v1/chat/completions", json=body).json()
                    theirs = theirs["choices"][0]["message"]["content"]
                    for mode, text in ours.items():
                        key = f"{name}, llama-server's {field} against ppd's {mode}"
                        counts.setdefault(key, [0, 0])
                        counts[key][0] += text == theirs
                        counts[key][1] += 1
                        if text != theirs and len(differences) < 12:
                            differences.append({"case": key, "prompt": prompt, "ppd": text, "llama_server": theirs})
                print(prompt[:50], {k: f"{v[0]}/{v[1]}" for k, v in counts.items() if k.startswith(name)}, flush=True)
        finally:
            peer.close()
    engine.close()
    result = {"equal": {key: f"{equal} of {total}" for key, (equal, total) in counts.items()},
              "first_differences": differences, "server_command": peer.command,
              "command": " ".join([Path(sys.executable).name, *sys.argv]), "max_new_tokens": args.max_new_tokens,
              "penalties": PENALTIES.describe()}
    print(json.dumps(result["equal"], indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
