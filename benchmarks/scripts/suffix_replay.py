"""Suffix trees against today's n-gram lookup chains, replayed offline on greedy MT-Bench answers (issue 51, item 3).

    python benchmarks/scripts/suffix_replay.py [--start 0] [--limit 20] [--max-new-tokens 128] [--threads 1]
        [--corpus benchmarks/measurements/suffix-corpus.json] [--budgets 2 4 8 12] [--floors 0 0.05 0.3]
        [--profile FILE] [--json FILE] [--generate-only]

1. The corpus: the default GGUF on llama.cpp (plain greedy decoding, ppd's own engine) answers the first ``--limit``
   MT-Bench questions, both turns (the second after its own first answer in the chat template, as ``ppd bench
   --turns 2`` asks it; ``--start``: the replay skips that many of them, e.g. those a prior was fitted on),
   ``--max-new-tokens`` each. Prompt and answer token ids are kept in ``--corpus`` after every question, so a
   later run goes on where one stopped and the replay needs no model.
2. The replay, step by step as decoding goes: the prefill emits the first answer token; a step at position i drafts
   from the text before i only, accepts the longest drafted path the answer agrees with (a tokens) and moves on to
   i + a + 1. (i) ``NgramIndex`` chains of L = budget tokens (a longer chain never accepts fewer, so L = budget is
   the best fixed L by tokens per step), and today's calibrated chains (a length per match class with the most
   tokens per second on the curve, ``lookup.chain_lengths``, fitted on these same answers: optimistic for them);
   (ii) ``SuffixDrafter`` trees of at most ``budget`` nodes (its floor cuts them shorter: 0 fills the budget). Both
   without and with the session's earlier answers in the index (the conversations before this one, in corpus order,
   as a per-model history holds them: ``SuffixMemory``, 8192 tokens; for the n-gram index, the same answers before
   the prompt, so its most recent occurrence, the conversation's, wins). The suffix drafter's learnt acceptance lives
   in its ``SuffixMemory`` and goes on across the session either way.
   Reported per turn (first turns, follow-ups): tokens per step, rows drafted per step, and the speedup on
   ``--profile``'s step-latency curve (step seconds at 1 + rows; plain decoding at 1).
3. ``cost``: mean microseconds of one propose + observe (suffix: 8-node trees; n-gram: 8-token chains) on a
   4,000-token context made of the corpus's texts, the automaton's build time and bytes per token (tracemalloc).
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from measurement import DEFAULT_PROFILE, MT_BENCH, ROOT, machine, profile_latency, report

from ppd_core.drafters.base import right_guesses
from ppd_core.drafters.lookup import MATCH_CLASSES as LOOKUP_CLASSES
from ppd_core.drafters.lookup import LookupStats, NgramIndex, chain_lengths, match_class
from ppd_core.drafters.suffix import CONVERSATION, HISTORY, MATCH_CLASSES, SuffixDrafter, SuffixMemory
from ppd_core.drafters.suffix_automaton import SEPARATOR, SuffixAutomaton

CORPUS = ROOT / "benchmarks" / "measurements" / "suffix-corpus.json"
HISTORY_TOKENS = 8192
TURNS = {"first turns": 1, "follow-ups": 2}


def generate_corpus(path: Path, limit: int, max_new_tokens: int, threads: int) -> dict:
    """The corpus at ``path``, with the questions up to ``limit`` it lacks answered and saved one by one."""
    corpus = json.loads(path.read_text()) if path.exists() else {"conversations": []}
    done = len(corpus["conversations"])
    if done >= limit:
        return corpus
    from app.questions import read_questions
    from ppd_core import Engine, EngineConfig

    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="auto", auto_calibrate=False,
                                      threads=threads))
    corpus.update(model=f"{engine.loaded.name} ({engine.loaded.quant}) on {engine.loaded.backend.name}, greedy plain",
                  max_new_tokens=max_new_tokens, threads=threads)
    for number, question in enumerate(read_questions(MT_BENCH, limit)[done:], done):
        messages, turns = [], []
        for text in question.turns[:2]:
            messages.append({"role": "user", "content": text})
            prompt = engine.chat_ids(messages)
            answer = engine.generate(prompt, "plain", max_new_tokens).tokens
            turns.append({"prompt": prompt, "answer": answer})
            messages.append({"role": "assistant", "content": engine.tokenizer.decode(answer, skip_special_tokens=True)})
        corpus["conversations"].append({"question": number, "category": question.category, "turns": turns})
        path.write_text(json.dumps(corpus))
        print(f"question {number + 1}/{limit} answered", flush=True)
    engine.close()
    return corpus


def tree_path(tokens: list[int], parents: list[int], answer: list[int], i: int) -> list[int]:
    """The proposal's nodes greedy verification accepts at answer position i: the longest path the answer follows."""
    children = {(parent, token): k for k, (parent, token) in enumerate(zip(parents, tokens))}
    path, parent = [], -1
    while i + len(path) < len(answer) and (parent, answer[i + len(path)]) in children:
        parent = children[(parent, answer[i + len(path)])]
        path.append(parent)
    return path


def step(tokens: list[int], kept: list[int] | None = None, path: list[int] | None = None) -> SimpleNamespace:
    """A verified step in the tree protocol's names: emitted ``tokens``, the suffix nodes' merged indices, the path."""
    return SimpleNamespace(stats=SimpleNamespace(tokens=tokens), kept={"suffix": kept or []}, path=path or [0])


def replay_ngram(history: list[int], prompt: list[int], answer: list[int],
                 lengths: Sequence[int]) -> list[tuple[int, int]]:
    """[(rows drafted, tokens emitted)] per step of chains of ``lengths[c]`` after a match of class c
    (``lookup.MATCH_CLASSES``)."""
    index, steps, i = NgramIndex([*history, *prompt, *answer[:1]]), [], 1
    while i < len(answer):
        chain, match = index.propose(max(lengths))
        chain = chain[: lengths[match_class(match)]] if chain else chain
        gained = min(right_guesses(chain, answer, i), len(answer) - i - 1)
        steps.append((len(chain), gained + 1))
        index.extend(answer[i:i + gained + 1])
        i += gained + 1
    return steps


def replay_suffix(memory: SuffixMemory, prompt: list[int], answer: list[int], limit: int,
                  floor: float) -> list[tuple[int, int]]:
    """[(rows drafted, tokens emitted)] per step of suffix trees of at most ``limit`` nodes; the answer then joins
    ``memory``."""
    drafter = SuffixDrafter(prompt, memory, limit=limit, floor=floor)
    drafter.observe(step(answer[:1]))  # the prefill's token
    steps, i = [], 1
    while i < len(answer):
        guesses = drafter.guesses()
        path = tree_path(guesses.tokens, guesses.parents, answer, i)[: len(answer) - i - 1]
        steps.append((len(guesses), len(path) + 1))
        kept = list(range(1, len(guesses) + 1))  # every node in the tree, node k as node k + 1 after the root
        drafter.observe(step(answer[i:i + len(path) + 1], kept, [0, *(k + 1 for k in path)]))
        i += len(path) + 1
    drafter.finish()
    return steps


def summary(steps: list[tuple[int, int]], seconds) -> dict:
    rows, tokens = sum(r for r, _ in steps), sum(t for _, t in steps)
    spent = sum(seconds(1 + r) for r, _ in steps)
    return {"tokens_per_step": round(tokens / len(steps), 4), "rows_per_step": round(rows / len(steps), 3),
            "speedup_on_curve": round(tokens / spent * seconds(1), 4)}


def replay_all(corpus: dict, budgets: list[int], floors: list[float], seconds) -> tuple[dict, dict]:
    """Tokens per step, rows and speedup for every method, budget, history setting and turn; and the suffix
    drafter's learnt ratios (accepted / expected at depth 1, by source and match class) with the history on."""
    results, learnt = {}, {}
    for with_history in (False, True):
        setting = "with earlier answers" if with_history else "conversation only"
        methods = {f"ngram chain L={b}": ("ngram", [b] * len(LOOKUP_CLASSES), 0.0) for b in budgets}
        methods["ngram chains calibrated"] = ("ngram", calibrated_lengths(corpus, with_history, seconds), 0.0)
        methods |= {f"suffix tree <={b} floor {f}": ("suffix", [b], f) for b in budgets for f in floors}
        for method, (kind, budget, floor) in methods.items():
            memory = SuffixMemory(HISTORY_TOKENS if with_history else 0)
            history: list[int] = []
            by_turn = {turn: [] for turn in TURNS.values()}
            for conversation in corpus["conversations"]:
                for turn, record in enumerate(conversation["turns"], 1):
                    prompt, answer = record["prompt"], record["answer"]
                    if kind == "ngram":
                        by_turn[turn] += replay_ngram(history[-HISTORY_TOKENS:], prompt, answer, budget)
                    else:
                        by_turn[turn] += replay_suffix(memory, prompt, answer, max(budget), floor)
                    if with_history:
                        history += [SEPARATOR, *answer]
            results.setdefault(setting, {})[method] = {name: summary(by_turn[turn], seconds)
                                                       for name, turn in TURNS.items()}
            if method == "ngram chains calibrated":
                results[setting][method]["lengths"] = budget
            if kind == "suffix" and with_history and budget == [max(budgets)] and floor == floors[0]:
                learnt = learnt_ratios(memory)
    return results, learnt


def calibrated_lengths(corpus: dict, with_history: bool, seconds) -> list[int]:
    """Today's lookup as calibration sets it: a chain length per match class with the most tokens per second on the
    curve (``lookup.chain_lengths``), fitted on these very answers (an optimistic figure for the n-gram side)."""
    stats, history = LookupStats.empty(), []
    for conversation in corpus["conversations"]:
        for turn, record in enumerate(conversation["turns"], 1):
            stats.add_answer([*history[-HISTORY_TOKENS:], *record["prompt"]], record["answer"], turn)
            if with_history:
                history += [SEPARATOR, *record["answer"]]
    return chain_lengths(stats, 1.0, 1, seconds)


def learnt_ratios(memory: SuffixMemory) -> dict:
    acceptance = memory.acceptance
    out = {}
    for source, name in ((CONVERSATION, "conversation"), (HISTORY, "history")):
        out[name] = {str(low): [round(a / e, 3) if e else None for a, e in
                                zip(acceptance.accepted[source][c][:4], acceptance.expected[source][c][:4])]
                     for c, low in enumerate(MATCH_CLASSES)}
    return out


def timing(corpus: dict, context_length: int = 4000, steps: int = 2000) -> dict:
    """Mean microseconds per step of propose + observe on a ``context_length``-token context, one token emitted a
    step (the corpus's next token), and the automata's bytes per token."""
    text = [t for c in corpus["conversations"] for r in c["turns"] for t in (*r["prompt"], *r["answer"])]
    context, going_on = text[:context_length], text[context_length:context_length + steps]
    out = {"context_tokens": len(context), "steps": len(going_on)}
    drafter, index = SuffixDrafter(context, limit=8), NgramIndex(context)
    start = time.perf_counter()
    for token in going_on:
        guesses = drafter.guesses()
        drafter.observe(step([token], [-1] * len(guesses), [0]))
    out["suffix_propose_observe_us"] = round((time.perf_counter() - start) / len(going_on) * 1e6, 1)
    start = time.perf_counter()
    for token in going_on:
        index.propose(8)
        index.extend([token])
    out["ngram_propose_extend_us"] = round((time.perf_counter() - start) / len(going_on) * 1e6, 1)
    start = time.perf_counter()
    SuffixDrafter(context)
    out["suffix_build_context_ms"] = round((time.perf_counter() - start) * 1e3, 1)
    tracemalloc.start()
    automaton = SuffixAutomaton(context)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out["automaton_bytes_per_token"] = round(size / len(automaton))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--start", type=int, default=0, help="replay the questions from this one on (0: the first)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--corpus", default=str(CORPUS))
    parser.add_argument("--budgets", type=int, nargs="+", default=[2, 4, 8, 12])
    parser.add_argument("--floors", type=float, nargs="+", default=[0.0, 0.05, 0.3])
    parser.add_argument("--profile", default=str(DEFAULT_PROFILE))
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "measurements" / "suffix-replay.json"))
    parser.add_argument("--generate-only", action="store_true")
    args = parser.parse_args()
    corpus = generate_corpus(Path(args.corpus), args.limit, args.max_new_tokens, args.threads)
    if args.generate_only:
        return
    corpus = dict(corpus, conversations=corpus["conversations"][args.start : args.limit])
    from ppd_core.calibration.tree_search import step_seconds

    seconds = step_seconds(profile_latency(args.profile))
    results, learnt = replay_all(corpus, args.budgets, args.floors, seconds)
    report({
        "command": f"python benchmarks/scripts/suffix_replay.py --start {args.start} --limit {args.limit} "
                   f"--max-new-tokens {args.max_new_tokens} --budgets {' '.join(map(str, args.budgets))} --floors "
                   f"{' '.join(map(str, args.floors))} --profile {Path(args.profile).name}",
        "corpus": {"path": str(Path(args.corpus).relative_to(ROOT)) if Path(args.corpus).is_relative_to(ROOT)
                   else args.corpus, "model": corpus.get("model"), "conversations": len(corpus["conversations"])},
        "latency_from": Path(args.profile).name, "machine": machine(),
        "replay": results, "learnt_ratio_depth1_to_4_with_history": learnt, "cost": timing(corpus),
    }, args.json)


if __name__ == "__main__":
    main()
