"""Would lookup in the user's earlier conversations add guesses? A replay on MT-Bench first turns.

    python benchmarks/scripts/history_lookup.py [--limit 80] [--max-new-tokens 128] [--model FILE.gguf]
        [--profile FILE] [--json FILE]

The model (default: the default GGUF on llama.cpp; greedy, plain decoding) answers the first turn of
each question, in order. Each answer is then replayed as ``LookupStats`` does in calibration, once
with the index over its own conversation (what ppd does) and once over the earlier conversations too
(the prompts and answers of all questions before it, as a saved-chat history would hold them; the
most recent occurrence wins, so the conversation's own text is preferred), and once with the
earlier conversations consulted only where the conversation has no match at all. The replays are
turned into expected tokens per step and speedup with the chain lengths chosen for each from
``--profile``'s latency curve (default: the shipped llama.cpp profile; ``chain_lengths`` /
``with_lookup``, as calibration does). Prints one JSON object (and writes it to ``--json``).
(``benchmarks/measurements/history-lookup.json`` was measured on the former torch int4 forward, replayed
on its int4 profile.)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from app.questions import DEFAULT_QUESTIONS, read_questions
from ppd_core.calibration.tree_search import step_seconds
from ppd_core import Engine, EngineConfig
from ppd_core.drafters.lookup import LookupStats, NgramIndex, chain_lengths, with_lookup
from measurement import DEFAULT_PROFILE, profile_latency, report


def expectation(stats: LookupStats, seconds) -> dict:
    lengths = chain_lengths(stats, 1.0, 1, seconds)
    tokens, step_seconds = with_lookup(stats, lengths, 1.0, 1, seconds)
    return {"chain_lengths": lengths, "matched_positions": sum(stats.trials), "positions": stats.positions,
            "expected_tokens_per_step": round(tokens, 4), "expected_speedup": round(tokens / step_seconds * seconds(1), 4),
            "acceptance_by_match_class": [[round(p, 4) for p in row[:4]] for row in stats.probs]}


def add_with_fallback(stats: LookupStats, history: list[int], prompt: list[int], answer: list[int]) -> None:
    """``stats.add_answer(prompt, answer)``, except that where the conversation has no match at all, the
    earlier conversations (followed by this one) propose."""
    own, everything = NgramIndex(prompt), NgramIndex(history + prompt)
    stats.start_answer()
    for i, token in enumerate(answer):
        chain, match = own.propose(len(stats.hits[0]))
        if not chain:
            chain, match = everything.propose(len(stats.hits[0]))
        stats.add_proposal(chain, match, answer, i)
        own.extend([token])
        everything.extend([token])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=80)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--model", default="default", help="a GGUF file or Hugging Face model (default: the default GGUF)")
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE), help="the profile whose latency curve is replayed")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    engine = Engine.load(EngineConfig(model=args.model, tree="auto", auto_calibrate=False))
    conversations = []
    for question in read_questions(DEFAULT_QUESTIONS, args.limit):
        prompt = engine.chat_ids([{"role": "user", "content": question.turns[0]}])
        conversations.append((prompt, engine.generate(prompt, "plain", args.max_new_tokens).tokens))
    own, with_history, fallback = LookupStats.empty(), LookupStats.empty(), LookupStats.empty()
    history: list[int] = []
    for prompt, answer in conversations:
        own.add_answer(prompt, answer)
        with_history.add_answer(history + prompt, answer)
        add_with_fallback(fallback, history, prompt, answer)
        history += prompt + answer
    seconds = step_seconds(profile_latency(args.profile))
    result = {
        "command": f"python benchmarks/scripts/history_lookup.py --limit {args.limit} --max-new-tokens {args.max_new_tokens} "
                   f"--model {args.model} --profile {args.profile}",
        "model": f"{engine.loaded.name} ({engine.loaded.quant}), greedy plain decoding on {engine.loaded.backend.name}",
        "questions": len(conversations), "latency_from": Path(args.profile).name,
        "conversation_only": expectation(own, seconds),
        "conversation_and_earlier_conversations": expectation(with_history, seconds),
        "earlier_conversations_only_where_the_conversation_has_no_match": expectation(fallback, seconds),
    }
    report(result, args.json)
    engine.close()


if __name__ == "__main__":
    main()
