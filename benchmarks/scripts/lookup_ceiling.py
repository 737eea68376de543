"""How many tokens per step can lookup chains reach, with this CPU's step cost, with a free one, and with foresight?

    python benchmarks/scripts/lookup_ceiling.py [--limit 40] [--max-new-tokens 128] [--model FILE.gguf]
        [--backend auto|llamacpp|torch] [--profile FILE] [--json FILE]

The model (default: the default GGUF on llama.cpp; greedy, plain decoding; ``--backend torch``: transformers'
de-quantized float32 copy) answers the first `--limit` MT-Bench questions, both turns (the second after its own
first answer, as `ppd bench --turns 2` asks it). The answers are replayed as calibration replays its own
(``LookupStats``, step by step), with the chain lengths chosen over all answers by ``chain_lengths`` (so fitted on
the very answers they are scored on: an optimistic figure): once with the step latency `--profile` measured
(default: the shipped llama.cpp profile), once with a step cost that does not grow with the tree (up to 16 tokens,
as on a GPU that is far from busy). Then *foresight*: every step carries exactly the chain tokens that turn out
right, where copying them pays on the measured curve: no lookup policy can beat it on these answers and this curve.
Between them, *adaptive*: ppd's own ``AdaptiveChains`` (ppd_core/lookup_policy.py) choosing every step's chain from
what its conversation showed before it, with the same answers' acceptance as its prior (as the fixed lengths are fitted
on them); and *held out*: fixed lengths and the adaptive prior fitted on half the conversations and scored on the
other half (two folds), as calibration's figures come from other answers than a user's.
Prints one JSON object (and writes it to ``--json``). (``benchmarks/measurements/lookup-ceiling.json`` was measured
on the former torch int4 forward and its profile; ``lookup-ceiling-llamacpp-avx512.json`` on llama.cpp.)
"""

from __future__ import annotations

import argparse

from app.questions import DEFAULT_QUESTIONS, read_questions
from ppd_core.calibration.tree_search import step_seconds
from ppd_core import Engine, EngineConfig
from ppd_core.drafters.lookup import LookupStats, chain_lengths, replay_steps, with_lookup
from ppd_core.drafters.chain_policy import AdaptiveChains, replay_adaptive
from ppd_core.options import BACKEND_CHOICES
from measurement import DEFAULT_PROFILE, profile_latency, report

FORESIGHT_CHAIN = 16  # the longest chain foresight may carry
TURNS = (("first turns", lambda turn: turn == 1), ("second turns", lambda turn: turn == 2))


def expectation(stats: LookupStats, seconds) -> dict:
    """Chain lengths fitted on every answer; tokens per step and speedup on first and second turns apart."""
    lengths = chain_lengths(stats, 1.0, 1, seconds)
    out = {"chain_lengths": lengths}
    for name, keep in TURNS:
        tokens, step_seconds = with_lookup(stats.select(keep), lengths, 1.0, 1, seconds)
        out[name] = {"tokens_per_step": round(tokens, 4), "speedup": round(tokens / step_seconds * seconds(1), 4)}
    return out


def adaptive(stats: LookupStats, seconds, prior: list[list[float]]) -> dict:
    """The product's adaptive policy (``AdaptiveChains``): each conversation's chains chosen step by step from what it
    showed before (its two turns in order), with ``prior`` as calibration's acceptance."""
    out = {}
    for name, keep in TURNS:
        steps, accepted, chains = replay_adaptive(stats, AdaptiveChains(prior, seconds), keep)
        spent = sum(count * seconds(1 + length) for length, count in chains.items())
        out[name] = {"tokens_per_step": round((steps + accepted) / steps, 4),
                     "speedup": round((steps + accepted) / spent * seconds(1), 4)}
    return out


def conversations(stats: LookupStats, keep) -> LookupStats:
    """The conversations (a first turn and the answers after it) whose number passes ``keep``."""
    out, number = LookupStats.empty(len(stats.hits[0]), len(stats.trials)), -1
    for turn, answer in zip(stats.turns, stats.matches):
        number += turn == 1
        if keep(number):
            out.start_answer(turn)
            for n, right, proposed in answer:
                out.add_position(n, right, proposed)
    return out


def held_out(stats: LookupStats, seconds) -> dict:
    """Two-fold, by conversation: the fixed lengths and the adaptive policy's prior fitted on the even conversations
    and scored on the odd ones, and the other way round (as calibration's figures come from other answers)."""
    totals = {name: {"fixed": [0.0, 0.0], "adaptive": [0.0, 0.0]} for name, _ in TURNS}
    for fold in (0, 1):
        train, test = conversations(stats, lambda n: n % 2 == fold), conversations(stats, lambda n: n % 2 != fold)
        lengths = chain_lengths(train, 1.0, 1, seconds)
        for name, keep in TURNS:
            for kind, (steps, accepted, chains) in (
                    ("fixed", replay_steps(test.select(keep), lengths)),
                    ("adaptive", replay_adaptive(test, AdaptiveChains(train.probs, seconds), keep))):
                totals[name][kind][0] += steps + accepted
                totals[name][kind][1] += sum(count * seconds(1 + length) for length, count in chains.items())
    return {name: {kind: round(tokens / spent * seconds(1), 4) for kind, (tokens, spent) in kinds.items()}
            for name, kinds in totals.items()}


def foresight(stats: LookupStats, seconds) -> dict:
    """Each step copies exactly the right tokens of its chain when that beats a plain step on the curve."""
    out = {}
    for name, keep in TURNS:
        tokens = steps = spent = 0.0
        for answer in stats.select(keep).matches:
            i = 0
            while i < len(answer):
                right = answer[i][1]
                copied = right if right and (1 + right) / seconds(1 + right) > 1 / seconds(1) else 0
                tokens, steps, spent = tokens + 1 + copied, steps + 1, spent + seconds(1 + copied)
                i += 1 + copied
        out[name] = {"tokens_per_step": round(tokens / steps, 4), "speedup": round(tokens / spent * seconds(1), 4)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default="default", help="a GGUF file or Hugging Face model (default: the default GGUF)")
    parser.add_argument("--backend", default="auto", choices=BACKEND_CHOICES)
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE), help="the profile whose latency curve is replayed")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model=args.model, backend=args.backend, tree="auto", auto_calibrate=False))
    stats, long_chains = LookupStats.empty(), LookupStats.empty(max_chain=FORESIGHT_CHAIN)
    for question in read_questions(DEFAULT_QUESTIONS, args.limit):
        messages: list[dict] = []
        for turn, text in enumerate(question.turns[:2], 1):
            messages.append({"role": "user", "content": text})
            prompt = engine.chat_ids(messages)
            answer = engine.generate(prompt, "plain", args.max_new_tokens).tokens
            stats.add_answer(prompt, answer, turn)
            long_chains.add_answer(prompt, answer, turn)
            messages.append({"role": "assistant", "content": engine.tokenizer.decode(answer, skip_special_tokens=True)})
    measured = step_seconds(profile_latency(args.profile))
    flat = lambda size: measured(1) if size <= 16 else measured(size)  # noqa: E731
    result = {
        "command": f"python benchmarks/scripts/lookup_ceiling.py --limit {args.limit} --max-new-tokens {args.max_new_tokens} "
                   f"--model {args.model} --backend {args.backend} --profile {args.profile}",
        "model": f"{engine.loaded.name} ({engine.loaded.quant}), greedy plain decoding on {engine.loaded.backend.name}",
        "questions": args.limit,
        "answers": len(stats.matches), "latency_from": args.profile,
        "step_cost_measured_here": expectation(stats, measured),
        "step_cost_flat_up_to_16_tokens": expectation(stats, flat),
        "adaptive_on_the_measured_curve": adaptive(stats, measured, stats.probs),
        "held_out_speedup_on_the_measured_curve": held_out(stats, measured),
        "foresight_on_the_measured_curve": foresight(long_chains, measured),
    }
    report(result, args.json)
    engine.close()


if __name__ == "__main__":
    main()
