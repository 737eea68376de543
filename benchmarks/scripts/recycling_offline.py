"""What would Token Recycling's trees accept on first turns? An offline replay of greedy answers, by row budget.

    python benchmarks/scripts/recycling_offline.py [--limit 20] [--max-new-tokens 128] [--threads 2]
        [--cache FILE.npz] [--shape 4,2,2,1,1,1 ...] [--json FILE]

The default GGUF on llama.cpp answers the first ``--limit`` MT-Bench questions' first turns (the engine's chat template,
``Engine.chat_ids``), plain greedy decoding one token a step; every step's row (its top-k next tokens) is kept in
``--cache`` (so a rerun, or one that was stopped, decodes only the questions missing there). Then the answers are
replayed in order, one ``RecyclingTable`` across all of them (as one loaded model across a session), as decoding with
the recycling drafter alone would step: at an answer position, with root the last emitted token, the tree is grown
from the table as it stands then (the prefill's row and the rows of every earlier position: never the root's own row,
which that step computes), the merge keeps the B - 1 nodes of highest path product under the drafter's learnt
estimates (B rows with the root), the step accepts the longest path the greedy answer follows and emits one more token,
the drafter learns from those emitted tokens only, and the next step starts after them. Tokens per step = answer
tokens after the prefill's / steps, as ``GenerationStats.mean_accepted`` counts them.

A real run fills the table from every row of its tree; plain steps give one row (the root's), so this replay's
table holds the accepted paths' rows alone: it underestimates what the tree's other rows would add (or overwrite).
Acceptance counts persist across answers too (the engine would hold them with the table). ``--live B`` then decodes
the same questions for real on llama.cpp with the recycling drafter alone at B rows (its trees built as the replay
builds them, verified greedily, the table filled from every row of every step) and checks each answer against plain
decoding's.

Measured (2-core Xeon, nice'd beside a test suite; 2427 answer tokens; B rows = the root + B - 1 guesses):
    python benchmarks/scripts/recycling_offline.py --limit 20 --cache /tmp/rec/answers.npz
  tokens per step, replay, shape 4,2,2,1,1,1: 2 rows 1.170, 4 rows 1.270, 8 rows 1.358, 12 rows 1.385 (at 4 rows
  1.232 over the first 10 answers, 1.314 over the last 10: the table fills as the session goes on)
    python benchmarks/scripts/recycling_offline.py --limit 10 --cache /tmp/rec/answers.npz --live 4
  live, 4 rows, first 10 answers: 1.283 tokens per step (replay of the same answers: 1.232), 10 of 10 answers
  identical to plain decoding.
    python benchmarks/scripts/recycling_offline.py --limit 20 --cache /tmp/rec/answers.npz --live 4
  live, 4 rows, 20 answers: 1.323 tokens per step (replay: 1.270), 20 of 20 identical to plain decoding, 1243 tokens'
  rows filled (1.5 MiB table); acceptance at the end, depth 1 ranks 0-2: 0.26 0.10 0.05, rank 0 at depths 2-3:
  0.43 0.49.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from types import SimpleNamespace

import numpy as np

from app.questions import DEFAULT_QUESTIONS, read_questions
from ppd_core import Engine, EngineConfig
from ppd_core.drafters.recycling import (
    DEFAULT_K, DEFAULT_SHAPE, AcceptanceCounts, RecyclingDrafter, RecyclingTable, expand, outcomes,
)
from ppd_core.tree import Tree, TreeSpec, build_tree

BUDGETS = (2, 4, 8, 12)


def decode(engine: Engine, prompt: list[int], max_new_tokens: int, k: int) -> tuple[list[int], np.ndarray]:
    """Plain greedy decoding: the answer [T] and each step's top-k [T, k] (row j's input is the prompt's last token
    for j = 0, else answer[j - 1]; its best is answer[j])."""
    decoder, eos = engine.loaded.backend, engine.loaded.eos_token_ids
    cache = decoder.new_cache()
    logits = decoder.prefill(cache, prompt)
    answer, tops = [], []
    while True:
        tops.append(logits.top_k(np.array([0]), k)[0])
        answer.append(int(logits.argmax()[0]))
        if answer[-1] in eos or len(answer) >= max_new_tokens:
            break
        logits = decoder.prefill(cache, [answer[-1]])
    decoder.truncate(cache, 0)
    return answer, np.array(tops, dtype=np.int32)


def decode_all(args, k: int) -> tuple[list[dict], int]:
    """Every question's prompt end, answer and rows, from ``--cache`` where it has them; the vocabulary's size."""
    path = Path(args.cache)
    stored = dict(np.load(path)) if path.exists() else {}
    questions = read_questions(DEFAULT_QUESTIONS, args.limit)
    engine = None
    for i, question in enumerate(questions):
        if f"answer{i}" in stored:
            continue
        if engine is None:
            engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="auto", auto_calibrate=False,
                                              threads=args.threads))
            stored["vocab_size"] = np.array([engine.loaded.backend.vocab_size])
        start = time.perf_counter()
        prompt = engine.chat_ids([{"role": "user", "content": question.turns[0]}])
        answer, tops = decode(engine, prompt, args.max_new_tokens, k)
        stored |= {f"prompt_last{i}": np.array([prompt[-1]]), f"answer{i}": np.array(answer), f"tops{i}": tops}
        np.savez(path, **stored)
        print(f"question {i + 1}/{len(questions)}: {len(answer)} tokens, {time.perf_counter() - start:.1f} s",
              file=sys.stderr, flush=True)
    if engine is not None:
        engine.close()
    return [{"prompt_last": int(stored[f"prompt_last{i}"][0]), "answer": stored[f"answer{i}"].tolist(),
             "tops": stored[f"tops{i}"]} for i in range(len(questions))], int(stored["vocab_size"][0])


def kept_nodes(proposal, estimates: np.ndarray, rows: int) -> np.ndarray:
    """The merge with one source: the ``rows - 1`` nodes of highest path product (ties: the earlier), a closed tree
    (a child's product is below its parent's)."""
    probs = estimates[proposal.depths - 1, proposal.ranks]
    path = probs.copy()
    for i, parent in enumerate(proposal.parents.tolist()):
        if parent >= 0:
            path[i] *= path[parent]
    return np.sort(np.argsort(-path, kind="stable")[: rows - 1])


def subtree(proposal, keep: np.ndarray):
    """The proposal's nodes ``keep`` (ascending, closed under parents), parents renumbered."""
    renumber = -np.ones(len(proposal) + 1, dtype=np.int64)
    renumber[keep] = np.arange(len(keep))
    return type(proposal)(proposal.tokens[keep], renumber[proposal.parents[keep]], proposal.depths[keep],
                          proposal.ranks[keep])


class Replay:
    """One budget's decoding: where its next step starts, what it learnt, what it emitted."""

    def __init__(self, rows: int, shape: tuple[int, ...], k: int):
        self.rows, self.shape = rows, shape
        self.counts = AcceptanceCounts.new(len(shape), k)
        self.steps = self.tokens = 0
        self.next = 0  # the answer position of the next step's root

    def step(self, table: RecyclingTable, answer: list[int], t: int) -> None:
        """The step whose root is answer[t]: grown, merged, verified against the answer, learnt from."""
        proposal = expand(table.ids, answer[t], self.shape)
        future = answer[t + 1 :]  # what greedy decoding emits next: used only to score, then what the step emitted
        accepted = 0
        if len(proposal):
            merged = subtree(proposal, kept_nodes(proposal, self.counts.estimates(), self.rows))
            accepted = int(outcomes(merged, future[: len(self.shape) + 1])[1].sum())
        accepted = min(accepted, len(future) - 1)  # the answer's end: its last token is emitted, never guessed past
        emitted = future[: accepted + 1]
        if len(proposal):
            tried, right = outcomes(proposal, emitted)  # learns what the step emitted, nothing after
            self.counts.add(proposal.depths[tried], proposal.ranks[tried], right[tried])
        self.steps, self.tokens, self.next = self.steps + 1, self.tokens + len(emitted), t + len(emitted)


def replay(answers: list[dict], vocab_size: int, shape: tuple[int, ...], k: int, budgets=BUDGETS) -> dict:
    """Every budget's tokens per step over the answers in order, one table across them."""
    table = RecyclingTable.empty(vocab_size, k)
    runs = {rows: Replay(rows, shape, k) for rows in budgets}
    halves = {rows: [] for rows in budgets}  # per answer: (tokens, steps)
    for answer_rows in answers:
        answer, tops = answer_rows["answer"], answer_rows["tops"]
        table.update(np.array([answer_rows["prompt_last"]]), tops[:1])  # the prefill's row; it emits answer[0]
        before = {rows: (run.tokens, run.steps) for rows, run in runs.items()}
        for run in runs.values():
            run.next = 0
        for t in range(len(answer) - 1):  # a step per root answer[t], until the last token is emitted
            for run in runs.values():
                if run.next == t:
                    run.step(table, answer, t)
            table.update(np.array([answer[t]]), tops[t + 1 : t + 2])  # the root's row, computed by the step at t
        for rows, run in runs.items():
            halves[rows].append((run.tokens - before[rows][0], run.steps - before[rows][1]))
    out = {}
    for rows, run in runs.items():
        split = len(answers) // 2
        first, second = (np.array(halves[rows][:split]).sum(0), np.array(halves[rows][split:]).sum(0))
        out[f"{rows} rows"] = {
            "tokens_per_step": round(run.tokens / run.steps, 4), "steps": run.steps,
            "first_half_tokens_per_step": round(first[0] / first[1], 4) if split else None,
            "second_half_tokens_per_step": round(second[0] / second[1], 4),
            "estimates_at_the_end": np.round(run.counts.estimates()[:, : max(shape)], 3).tolist(),
        }
    out["table_rows_filled"] = table.filled()
    return out


def real_tree(proposal, root: int, depth: int) -> tuple[Tree, np.ndarray]:
    """The step's tree of a (merged) proposal and its node tokens [N], the root first, in the tree's node order."""
    paths: list[tuple[int, ...]] = []
    for parent, rank in zip(proposal.parents.tolist(), proposal.ranks.tolist()):
        paths.append((paths[parent] if parent >= 0 else ()) + (rank,))  # ranks are distinct among siblings
    tree = build_tree(TreeSpec({(): 0, **{path: 0 for path in paths}}), 0, 1, max_depth=depth)
    token_of = dict(zip(paths, proposal.tokens.tolist())) | {(): root}
    return tree, np.array([token_of[path] for path in tree.paths], dtype=np.int64)


def greedy_path(tree: Tree, node_tokens: np.ndarray, logits) -> tuple[list[int], list[int]]:
    """The accepted node indices (root first) and the emitted tokens: greedy verification."""
    best = logits.argmax(slice(0, tree.num_nodes)).tolist()  # [N]
    path, node = [0], 0
    while True:
        child = next((j for j in range(tree.num_nodes) if tree.parents[j] == node and node_tokens[j] == best[node]),
                     None)
        if child is None:
            return path, [int(node_tokens[i]) for i in path[1:]] + [best[node]]
        path.append(child)
        node = child


def live(args, answers: list[dict], rows: int, shape: tuple[int, ...]) -> dict:
    """Real tree steps on llama.cpp with the recycling drafter alone at ``rows`` rows: the table fills from every row
    of every step, as in a real run; the answers are compared with plain decoding's."""
    engine = Engine.load(EngineConfig(model="default", backend="llamacpp", tree="auto", auto_calibrate=False,
                                      threads=args.threads))
    decoder, eos = engine.loaded.backend, engine.loaded.eos_token_ids
    drafter = RecyclingDrafter(RecyclingTable.empty(decoder.vocab_size), limit=rows - 1, shape=shape)
    steps = tokens = identical = 0
    for question, plain in zip(read_questions(DEFAULT_QUESTIONS, args.limit), answers):
        prompt = engine.chat_ids([{"role": "user", "content": question.turns[0]}])
        cache = decoder.new_cache()
        logits = decoder.prefill(cache, prompt)
        out = [int(logits.argmax()[0])]
        drafter.observe(SimpleNamespace(node_tokens=np.array([prompt[-1]]), logits=logits,
                                        stats=SimpleNamespace(tokens=out[:1])))
        while len(out) < args.max_new_tokens and out[-1] not in eos:
            drafter.propose(SimpleNamespace(add=lambda name, guesses: None))
            proposal = drafter.proposed or expand(drafter.table.ids, out[-1], ())  # none: the root alone
            proposal = subtree(proposal, kept_nodes(proposal, drafter.counts.estimates(), rows))
            tree, node_tokens = real_tree(proposal, out[-1], len(shape))
            cached = decoder.cache_length(cache)
            logits = decoder.tree_logits(cache, tree, node_tokens, None)
            path, emitted = greedy_path(tree, node_tokens, logits)
            decoder.keep(cache, cached, path)
            drafter.observe(SimpleNamespace(node_tokens=node_tokens, logits=logits,
                                            stats=SimpleNamespace(tokens=emitted)))
            stop = next((i + 1 for i, t in enumerate(emitted) if t in eos), len(emitted))
            emitted = emitted[: min(stop, args.max_new_tokens - len(out))]
            out, steps, tokens = out + emitted, steps + 1, tokens + len(emitted)
        decoder.truncate(cache, 0)
        identical += out == plain["answer"]
        print(f"live {rows} rows: {steps} steps, {tokens / max(steps, 1):.3f} tokens/step so far", file=sys.stderr,
              flush=True)
    engine.close()
    return {"tokens_per_step": round(tokens / steps, 4), "steps": steps, "answers_identical_to_plain": identical,
            "table_rows_filled": drafter.table.filled(),
            "estimates_at_the_end": np.round(drafter.counts.estimates()[:, : max(shape)], 3).tolist()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", default="recycling-offline-answers.npz")
    parser.add_argument("--shape", action="append", default=None, help="children per depth, e.g. 4,2,2,1,1,1")
    parser.add_argument("--live", type=int, action="append", default=None,
                        help="also decode for real with recycling trees of this many rows (the table from every row)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shape] if args.shape else [DEFAULT_SHAPE]
    answers, vocab_size = decode_all(args, DEFAULT_K)
    result = {
        "command": " ".join(["python", *sys.argv]),
        "model": "the default GGUF on llama.cpp, greedy plain decoding, MT-Bench first turns",
        "questions": len(answers), "answer_tokens": sum(len(a["answer"]) for a in answers),
        "rows": "B rows = the root + B - 1 recycled guesses",
        "by_shape": {",".join(map(str, shape)): replay(answers, vocab_size, shape, DEFAULT_K) for shape in shapes},
    }
    for rows in args.live or ():
        result[f"live {rows} rows, shape {','.join(map(str, shapes[0]))}"] = live(args, answers, rows, shapes[0])
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
