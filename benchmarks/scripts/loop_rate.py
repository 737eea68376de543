"""How often answers end in a loop, with and without a repetition penalty: the figure behind ppd's default penalty.

    .venv/bin/python benchmarks/scripts/loop_rate.py [--questions 20] [--max-new-tokens 256] [--threads 2]
        [--model FILE.gguf] [--settings greedy,greedy+penalty,defaults,defaults-penalty] [--penalties 1.05,1.1,1.15]
        [--json FILE]

The default model answers ``--questions`` MT-Bench first turns (every fourth of the shipped 80, so that every
category is in) with plain decoding on its llama.cpp backend, ``--max-new-tokens`` each, one fresh cache per answer,
under each setting:

- ``greedy``: temperature 0, no penalty; ``greedy+penalty``: temperature 0 with the default penalty;
- ``defaults``: what the page and the API use when a request leaves everything unset (``ppd_core.sampling.params``):
  the model's recommendation, else llama-server's defaults, with ppd's default repeat penalty; seed = question number;
- ``defaults-penalty``: the same without any penalty (repeat penalty 1);
- ``greedy@P`` for each ``--penalties`` value P: greedy with repeat penalty P over the default window (the sweep that
  picked the default).

An answer **ends in a loop** (``loops``) when it runs to the token limit and, in its last third, a line of at least 8
characters occurs 3 or more times, or a run of 8 words does. The JSON has, per setting, how many answers loop, which, and the tokens per answer.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import Counter
from pathlib import Path

from measurement import default_gguf, first_turns, machine, now, report

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def loops(text: str, stopped_at_limit: bool, repeats: int = 3, words: int = 8, line_chars: int = 8) -> bool:
    """Whether an answer ends in a loop: it ran to the token limit, and its last third repeats itself (a line of
    ``line_chars`` or more, or a run of ``words`` words, ``repeats`` times or more there)."""
    if not stopped_at_limit:
        return False
    tail = text[len(text) * 2 // 3:]
    lines = Counter(line.strip() for line in tail.splitlines() if len(line.strip()) >= line_chars)
    if lines and max(lines.values()) >= repeats:
        return True
    tokens = re.findall(r"\S+", tail)
    runs = Counter(tuple(tokens[i:i + words]) for i in range(len(tokens) - words + 1))
    return bool(runs) and max(runs.values()) >= repeats


def settings(names: list[str], penalties: list[float]) -> dict:
    """Each setting's sampling (a SamplingParams) by name."""
    from ppd_core.sampling.params import default_sampling
    from ppd_core.sampling.params import SamplingParams

    chosen = default_sampling({})
    penalty = {name: chosen.values[name] for name in ("repeat_penalty", "repeat_last_n")}
    table = {"greedy": lambda seed: SamplingParams(),
             "greedy+penalty": lambda seed: SamplingParams(**penalty),
             "defaults": lambda seed: chosen.params(seed=seed),
             "defaults-penalty": lambda seed: chosen.params(seed=seed, repeat_penalty=1.0)}
    picked = {name: table[name] for name in names}
    for value in penalties:
        picked[f"greedy@{value}"] = lambda seed, value=value: SamplingParams(repeat_penalty=value,
                                                                              repeat_last_n=penalty["repeat_last_n"])
    return picked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default=None, help="a GGUF file (default: the embedded default model)")
    parser.add_argument("--settings", default="greedy,greedy+penalty,defaults,defaults-penalty")
    parser.add_argument("--penalties", default="", help="greedy repeat penalties to sweep, e.g. 1.05,1.1,1.15")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    from ppd_core import Engine, EngineConfig

    questions = first_turns()[::4][: args.questions]
    engine = Engine.load(EngineConfig(model=str(args.model or default_gguf()), backend="llamacpp", tree="medium",
                                      threads=args.threads))
    results = {}
    try:
        for name, sampling_of in settings(args.settings.split(","), [float(p) for p in args.penalties.split(",") if p]).items():
            started, looped, tokens, tails = time.perf_counter(), [], 0, {}
            for number, question in enumerate(questions):
                sampling = sampling_of(number)
                answer = engine.generate(engine.chat_ids([{"role": "user", "content": question}]), "plain",
                                         args.max_new_tokens, sampling=sampling)
                tokens += len(answer.tokens)
                if loops(answer.text, answer.stop_reason == "length"):
                    looped.append(number)
                    tails[number] = answer.text[-160:]
            results[name] = {"sampling": sampling.describe(), "answers": len(questions), "loops": len(looped),
                             "looping_questions": looped, "looping_tails": tails,
                             "tokens_per_answer": tokens / len(questions),
                             "seconds": round(time.perf_counter() - started, 1)}
            print(f"{name}: {len(looped)} of {len(questions)} answers loop", file=sys.stderr, flush=True)
    finally:
        engine.close()
    report({"what": "answers ending in a loop (a line or an 8-word run repeated 3+ times), plain decoding",
            "command": "python " + " ".join(sys.argv), "machine": machine(), "measured": now(),
            "model": str(args.model or "default"), "questions": "MT-Bench first turns, every fourth",
            "max_new_tokens": args.max_new_tokens, "settings": results}, args.json)


if __name__ == "__main__":
    main()
