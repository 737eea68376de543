"""Tokens per step of the merged tree at fixed row budgets, by guess source and turn kind: no timing, no plain run.

    python benchmarks/scripts/merged_tree.py [--limit 20] [--max-new-tokens 128] [--budgets 2,4,8,12]
        [--drafters lookup,grammar ...] [--prompt-tokens none] [--start 0] [--curve FILE] [--json FILE]

The default GGUF on llama.cpp (2 threads) answers the MT-Bench questions' two turns greedily as ``ppd bench --turns 2
--tree B`` does (the first turn from an empty cache, the follow-up after its own answer), for each ``--drafters`` set
and each budget B; tokens per step (``GenerationStats.mean_accepted`` over all steps) for first turns and follow-ups
apart, and each source's accepted guesses per step. Tokens per step do not depend on the device's speed, so this runs
beside other work; ``ppd bench`` times them.

``--curve FILE`` (a step-latency curve, as ``ppd calibrate --latency-curve`` reads): each step's tree is sized by that
curve (``Engine.row_costs``: the best nodes only as far as they pay for their rows, up to the budget), and the run
prices its steps on it: ``forecast_speedup`` is the tokens over the steps' summed costs in plain steps (a plain step
emits 1 token at cost 1), host time not counted.
"""

from __future__ import annotations

import argparse
import json
import sys

from app.questions import DEFAULT_QUESTIONS, read_questions
from ppd_core import GREEDY, Engine, EngineConfig
from ppd_core.calibration.curves import read_curve
from ppd_core.calibration.tree_search import mean_curve, step_seconds
from ppd_core.plan import relative_costs


def curve_costs(path: str) -> tuple[float, ...]:
    """[R + 1] an r-row step's cost in plain steps on the curve in ``path`` (its contexts averaged)."""
    latency = read_curve(path).latency_ms
    return relative_costs(step_seconds(latency), max(mean_curve(latency)))


def run(args, drafters: tuple[str, ...], budget: int, questions) -> dict:
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree=str(budget), threads=args.threads,
                                      prompt_tokens=args.prompt_tokens, drafters=drafters, auto_calibrate=False))
    costs = engine.row_costs = curve_costs(args.curve) if args.curve else None
    kinds = {kind: dict(steps=0, tokens=0, cost=0.0, accepted={}, drafted={}) for kind in ("first turns", "follow-ups")}
    for number, question in enumerate(questions):
        engine.forget_conversation()
        history = []
        for turn, text in enumerate(question.turns[:2]):
            history.append({"role": "user", "content": text})
            result = engine.generate(engine.chat_ids(history), "ppd", args.max_new_tokens,
                                     sampling=GREEDY, reuse_cache=True)
            totals = kinds["first turns" if turn == 0 else "follow-ups"]
            totals["steps"] += result.stats.steps
            totals["tokens"] += sum(result.stats.accepted_per_step)
            if costs:
                totals["cost"] += sum(costs[min(rows, len(costs) - 1)] for rows in result.stats.rows_per_step)
            for counts, theirs in ((totals["accepted"], result.stats.accepted), (totals["drafted"], result.stats.drafted)):
                for name, count in theirs.items():
                    counts[name] = counts.get(name, 0) + count
            history.append({"role": "assistant", "content": engine.tokenizer.decode(result.tokens,
                                                                                    skip_special_tokens=True)})
        print(f"{','.join(drafters)} {budget} rows: {number + 1}/{len(questions)}", file=sys.stderr, flush=True)
    engine.close()
    out = {kind: {"tokens_per_step": round(t["tokens"] / t["steps"], 4), "steps": t["steps"],
                  "accepted_per_step_by_source": {k: round(v / t["steps"], 4) for k, v in t["accepted"].items()},
                  "drafted_per_step_by_source": {k: round(v / t["steps"], 4) for k, v in t["drafted"].items()}}
           for kind, t in kinds.items()}
    for kind, t in kinds.items():
        if costs:
            out[kind]["forecast_speedup"] = round(t["tokens"] / t["cost"], 4)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budgets", default="4")
    parser.add_argument("--drafters", action="append", default=None)
    parser.add_argument("--prompt-tokens", default=None, help="none: no prompt tokens (default: the shipped ones)")
    parser.add_argument("--curve", default=None, help="size each step's tree by this step-latency curve and price it")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    questions = read_questions(DEFAULT_QUESTIONS, args.start + args.limit)[args.start :]
    result = {"command": " ".join(["python", *sys.argv]), "questions": len(questions), "runs": {}}
    for names in args.drafters or ["lookup,grammar"]:
        for budget in map(int, args.budgets.split(",")):
            key = f"{names} @ {budget} rows"
            result["runs"][key] = run(args, tuple(names.split(",")), budget, questions)
            print(key, json.dumps(result["runs"][key]), flush=True)
            if args.json:
                with open(args.json, "w") as out:
                    json.dump(result, out, indent=1)


if __name__ == "__main__":
    main()
