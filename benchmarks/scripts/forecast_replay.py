"""Check a forecast on another device's step-latency curve by replaying real greedy answers on it.

``ppd calibrate --latency-curve FILE`` chooses a tree (and lookup chains) for a curve such as a published GPU's and
says how many tokens per step and what speedup to expect. This decodes the MT-Bench first turns greedily here with
exactly that tree and those chains (fixed lengths), keeps every step's rows and tokens, and prices each step at the
curve's latency for its rows: the replayed tokens per step and speedup over plain decoding on that device, beside the
forecast (with lookup: calibration's forecast for first turns, which is what the replay answers). The output is also checked against plain decoding (``identical``).

    python benchmarks/scripts/forecast_replay.py --curve profiles/curves/rtx3090-llama1b-f16.json \
        [--prompt-tokens FILE] [--limit 80] [--max-new-tokens 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.bench import read_questions  # noqa: E402
from app.cli import DEFAULT_QUESTIONS  # noqa: E402
from ppd_core.calibration.latency import step_seconds  # noqa: E402
from ppd_core.engine import Engine, EngineConfig  # noqa: E402


def replay(engine: Engine, prompts: list[list[int]], max_new_tokens: int, seconds) -> dict:
    """Tokens per step and the curve's speedup over plain decoding, over ``prompts`` decoded with the engine's tree."""
    tokens = steps = 0
    curve_seconds = 0.0
    identical = True
    for ids in prompts:
        answer = []
        for event in engine.stream(ids, "ppd", max_new_tokens):
            if not event.step.prefill:
                steps += 1
                tokens += len(event.step.tokens)
                curve_seconds += seconds(event.step.tree_tokens)
            answer = event.tokens
        identical &= answer == engine.generate(ids, "vanilla", max_new_tokens).tokens
    return {"steps": steps, "tokens": tokens, "tokens_per_step": round(tokens / steps, 4),
            "speedup": round(tokens * seconds(1) / curve_seconds, 4), "identical": identical}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", type=Path, required=True)
    parser.add_argument("--prompt-tokens", default=None)
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(prompt_tokens=args.prompt_tokens, threads=args.threads, auto_calibrate=False))
    profile = engine.calibrate_with_curve(args.curve)
    seconds = step_seconds(profile.latency_ms)
    questions = read_questions(DEFAULT_QUESTIONS, args.limit)
    prompts = [engine.chat_ids([{"role": "user", "content": q.turns[0]}]) for q in questions]
    engine.use_profile(profile)
    expected = engine.calibration_expectation()
    result = {"curve": str(args.curve), "prompt_tokens": engine.prompt_tokens.fingerprint, "questions": len(prompts),
              "max_new_tokens": args.max_new_tokens, "tree_budget": profile.budget, "lookup_lengths": profile.lookup_lengths}
    engine.set_lookup(0)
    result["prompt_tokens_alone"] = {
        "forecast_tokens_per_step": expected["expected_tokens_per_step"],
        "forecast_speedup": profile.expected_speedup, **replay(engine, prompts, args.max_new_tokens, seconds)}
    if any(profile.lookup_lengths):
        engine.set_lookup("fixed")
        first = profile.expected_with_lookup_by_turn.get("first turns", {})  # the replay answers first turns
        result["with_lookup"] = {
            "forecast_tokens_per_step": first.get("tokens_per_step"), "forecast_speedup": first.get("speedup"),
            "forecast_all_turns": {"tokens_per_step": profile.expected_tokens_per_step_with_lookup,
                                   "speedup": profile.expected_speedup_with_lookup},
            **replay(engine, prompts, args.max_new_tokens, seconds)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
