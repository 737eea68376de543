"""Check a forecast on another device's step-latency curve by replaying real greedy answers on it.

``ppd calibrate --latency-curve FILE`` chooses a step policy, a tree and lookup chains for a curve such as a
published GPU's or ``model_shapes.py``'s and says how many tokens per step and what speedup to expect. This decodes
MT-Bench questions greedily here with exactly that tree and those chains (fixed lengths), first turns and, with
``--turns 2``, their follow-ups after the first answer (plain decoding's), keeps every step's rows and tokens, and
prices each step as the chosen policy would on that device: at the curve's latency for its rows (``trees``), or at
the padded step's cost whatever it holds (``fixed R``, from the curve's ``fixed_ms``). The replayed tokens per step
and speedup over plain decoding on that device (its 1-token step) stand beside calibration's forecast for the same
turns. The output is also checked against plain decoding (``identical``).

    python benchmarks/scripts/forecast_replay.py --curve profiles/curves/rtx3090-llama1b-f16.json \
        [--prompt-tokens FILE] [--limit 80] [--turns 2] [--max-new-tokens 128] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.questions import DEFAULT_QUESTIONS, read_questions  # noqa: E402
from ppd_core.calibration.tree_search import step_seconds  # noqa: E402
from ppd_core import Engine, EngineConfig  # noqa: E402
from ppd_core.engine_calibration import calibrate_with_curve  # noqa: E402


def replay(engine: Engine, prompts: list[list[int]], max_new_tokens: int, seconds, plain: float) -> dict:
    """Tokens per step and the curve's speedup over plain decoding (``plain`` seconds a step), over ``prompts``
    decoded with the engine's tree; ``seconds(rows)``: a step's cost under the chosen policy."""
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
        identical &= answer == engine.generate(ids, "plain", max_new_tokens).tokens
    return {"answers": len(prompts), "steps": steps, "tokens": tokens, "tokens_per_step": round(tokens / steps, 4),
            "speedup": round(tokens * plain / curve_seconds, 4), "identical": identical}


def turn_prompts(engine: Engine, questions, turns: int, max_new_tokens: int) -> dict[str, list[list[int]]]:
    """The first turns' prompts and, for ``turns`` 2, the follow-ups' after plain decoding's first answer."""
    out = {"first turns": [], "follow-ups": []}
    for question in questions:
        first = [{"role": "user", "content": question.turns[0]}]
        out["first turns"].append(engine.chat_ids(first))
        if turns > 1 and len(question.turns) > 1:
            answer = engine.generate(out["first turns"][-1], "plain", max_new_tokens).text
            out["follow-ups"].append(engine.chat_ids(
                [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": question.turns[1]}]))
    return {name: prompts for name, prompts in out.items() if prompts}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--curve", type=Path, required=True)
    parser.add_argument("--prompt-tokens", default=None)
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--turns", type=int, choices=(1, 2), default=1)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(prompt_tokens=args.prompt_tokens, threads=args.threads, auto_calibrate=False))
    profile = calibrate_with_curve(engine, args.curve)
    policy = profile.policy
    curve = step_seconds(profile.latency_ms)
    seconds, plain = policy.seconds(curve), curve(1)  # plain decoding's step: the curve's 1-token step
    prompts = turn_prompts(engine, read_questions(DEFAULT_QUESTIONS, args.limit), args.turns, args.max_new_tokens)
    engine.replan(profile, tree="auto")
    expected = engine.plan.expectation
    result = {"curve": str(args.curve), "prompt_tokens": engine.prompt_tokens.fingerprint,
              "questions": len(prompts["first turns"]), "turns": args.turns, "max_new_tokens": args.max_new_tokens,
              "step_policy": policy.to_json(), "policy": policy.line(), "plain_tokens_per_second": round(1 / plain, 2),
              "tree_budget": profile.budget, "lookup_lengths": profile.lookup_lengths}
    engine.replan(lookup=0)
    result["prompt_tokens_alone"] = {
        "forecast_tokens_per_step": expected["expected_tokens_per_step"], "forecast_speedup": profile.expected_speedup,
        **{name: replay(engine, ids, args.max_new_tokens, seconds, plain) for name, ids in prompts.items()}}
    if any(profile.lookup_lengths):
        engine.replan(lookup="fixed")
        result["with_lookup"] = {"forecast_all_turns": {"tokens_per_step": profile.expected_tokens_per_step_with_lookup,
                                                        "speedup": profile.expected_speedup_with_lookup}}
        for name, ids in prompts.items():
            forecast = profile.expected_with_lookup_by_turn.get(name, {})
            result["with_lookup"][name] = {"forecast_tokens_per_step": forecast.get("tokens_per_step"),
                                           "forecast_speedup": forecast.get("speedup"),
                                           **replay(engine, ids, args.max_new_tokens, seconds, plain)}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
