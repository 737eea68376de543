"""Speed of structured answers: ppd (plain and PPD, the grammar's forced text drafted) against llama-server given the
same schema in ``response_format``, same GGUF and threads, on the 40 schema prompts (tests/schema_prompts.py), greedy.

    .venv/bin/python benchmarks/scripts/schema_bench.py --server BIN [--json OUT] [--limit 40] [--rounds 2]

BIN: a llama-server built from the same llama.cpp (``benchmarks/scripts/llama_server_bench.py --build-only``). ppd
loads the default model as ``ppd serve`` does (``--tree auto``: its saved calibration; run ``ppd calibrate`` first)
and answers in-process; llama-server's answers are timed over HTTP (wall), its slot erased before each (ppd starts
each answer from an empty cache too), as ``ppd bench --compare-llama-server`` times them. The prompts go round ``--rounds`` times, the three runners taking turns per prompt, so drift in the
machine's speed falls on all three alike. Tokens per second are total answer tokens over total seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from app.server_peer import ServerPeer, server_request  # noqa: E402
from app.structured import json_content  # noqa: E402
from ppd_core import Engine, EngineConfig, SamplingParams  # noqa: E402
from ppd_core import schema_grammar  # noqa: E402
from ppd_core.loading import default_model_file  # noqa: E402
from schema_prompts import PROMPTS  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", type=Path, required=True)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tree", default="auto", help="ppd's tree (auto: the saved calibration)")
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree=args.tree, threads=args.threads,
                                      auto_calibrate=False))
    peer = ServerPeer(args.server, default_model_file(), args.threads, "plain", SamplingParams())
    names = ("llama-server", "ppd plain", "ppd PPD")
    totals = {name: {"seconds": 0.0, "tokens": 0} for name in names}
    guessed = {"accepted": {}, "drafted": {}, "from_guesses": 0, "steps": 0}  # by source, where by source
    equal = {"ppd plain": 0, "ppd PPD": 0}
    try:
        for round_ in range(args.rounds):
            for prompt, schema in PROMPTS[: args.limit]:
                messages = [{"role": "user", "content": prompt}]
                body = {**server_request(messages, args.max_new_tokens, SamplingParams()),
                        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}
                peer.client.post("/slots/0", params={"action": "erase"}).raise_for_status()  # no cached prefix: as ppd
                start = time.perf_counter()
                theirs = peer.client.post("/v1/chat/completions", json=body).raise_for_status().json()
                totals["llama-server"]["seconds"] += time.perf_counter() - start
                totals["llama-server"]["tokens"] += theirs["usage"]["completion_tokens"]
                text = theirs["choices"][0]["message"]["content"]
                grammar = schema_grammar(schema, response_format=True)  # as ppd serve takes response_format
                for name, mode in (("ppd plain", "plain"), ("ppd PPD", "ppd")):
                    start = time.perf_counter()  # tokenizing counts, as the server's does
                    result = engine.generate(engine.chat_ids(messages), mode, args.max_new_tokens, grammar=grammar)
                    totals[name]["seconds"] += time.perf_counter() - start
                    totals[name]["tokens"] += result.stats.new_tokens
                    if round_ == 0:  # the content ppd serve answers
                        equal[name] += json_content(result.text, complete=result.stop_reason == "eos") == text
                    if mode == "ppd" and round_ == 0:
                        guessed["from_guesses"] += result.stats.from_guesses
                        guessed["steps"] += result.stats.steps
                        for key in ("accepted", "drafted"):
                            for source, count in getattr(result.stats, key).items():
                                guessed[key][source] = guessed[key].get(source, 0) + count
            rates = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
            print(f"round {round_ + 1}: " + ", ".join(f"{name} {rate:.1f} tokens/s" for name, rate in rates.items()),
                  flush=True)
    finally:
        peer.close()
    rates = {name: t["tokens"] / t["seconds"] for name, t in totals.items()}
    result = {
        "tokens_per_second": {name: round(rate, 2) for name, rate in rates.items()},
        "ppd PPD / llama-server": round(rates["ppd PPD"] / rates["llama-server"], 3),
        "ppd plain / llama-server": round(rates["ppd plain"] / rates["llama-server"], 3),
        "ppd PPD / ppd plain": round(rates["ppd PPD"] / rates["ppd plain"], 3),
        "equal_to_llama_server": {name: f"{count} of {min(args.limit, len(PROMPTS))}" for name, count in equal.items()},
        "ppd_PPD_guesses_first_round": guessed, "totals": totals, "tree": engine.snapshot().tree, "server_command": peer.describe(default_model_file())["command"],
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "max_new_tokens": args.max_new_tokens,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "totals"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
