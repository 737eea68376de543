"""How many tokens per step can lookup chains reach, with this CPU's step cost and with a free one?

    python benchmarks/scripts/lookup_ceiling.py [--limit 40] [--max-new-tokens 128] [--json FILE]

The default model (int4, greedy, plain decoding) answers the first `--limit` MT-Bench questions,
both turns (the second after its own first answer, as `ppd bench --turns 2` asks it). The answers
are replayed as calibration replays its own (``LookupStats``, step by step), with the chain lengths
chosen over all answers by ``chain_lengths``: once with the step latency the shipped int4 profile
measured on this CPU, once with a step cost that does not grow with the tree (up to 16 tokens,
as on a GPU that is far from busy). The second is the most lookup can give on these answers,
whatever the hardware. Prints one JSON object (and writes it to ``--json``).
"""

from __future__ import annotations

import argparse

from app.bench import read_questions
from app.cli import DEFAULT_QUESTIONS
from ppd_core.calibration.latency import step_seconds
from ppd_core.calibration.profiles import read_profile
from ppd_core.engine import Engine, EngineConfig
from ppd_core.lookup import LookupStats, chain_lengths, with_lookup
from measurement import INT4_PROFILE, report


def expectation(stats: LookupStats, seconds) -> dict:
    """Chain lengths fitted on every answer; tokens per step and speedup on first and second turns apart."""
    lengths = chain_lengths(stats, 1.0, 1, seconds)
    out = {"chain_lengths": lengths}
    for name, keep in (("first turns", lambda turn: turn == 1), ("second turns", lambda turn: turn == 2)):
        tokens, step_seconds = with_lookup(stats.select(keep), lengths, 1.0, 1, seconds)
        out[name] = {"tokens_per_step": round(tokens, 4), "speedup": round(tokens / step_seconds * seconds(1), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model="default", quant="int4", device="cpu", tree="auto", auto_calibrate=False))
    stats = LookupStats.empty()
    for question in read_questions(DEFAULT_QUESTIONS, args.limit):
        messages: list[dict] = []
        for turn, text in enumerate(question.turns[:2], 1):
            messages.append({"role": "user", "content": text})
            prompt = engine.chat_ids(messages)
            answer = engine.generate(prompt, "vanilla", args.max_new_tokens).tokens
            stats.add_answer(prompt, answer, turn)
            messages.append({"role": "assistant", "content": engine.tokenizer.decode(answer, skip_special_tokens=True)})
    measured = step_seconds(read_profile(INT4_PROFILE).latency_ms)
    flat = lambda size: measured(1) if size <= 16 else measured(size)  # noqa: E731
    result = {
        "command": f"python benchmarks/scripts/lookup_ceiling.py --limit {args.limit} --max-new-tokens {args.max_new_tokens}",
        "model": "default, int4, greedy plain decoding", "questions": args.limit, "answers": len(stats.matches),
        "latency_from": INT4_PROFILE.name,
        "step_cost_measured_here": expectation(stats, measured),
        "step_cost_flat_up_to_16_tokens": expectation(stats, flat),
    }
    report(result, args.json)


if __name__ == "__main__":
    main()
