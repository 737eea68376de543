"""Acceptance statistics p_d(r) of the prompt tokens, measured on this model.

The model answers the calibration prompts greedily; then, as in training, prompt tokens are
attached at every position of each answer in one batched forward, and the rank of the
model's own token among each prompt token's guesses is recorded. p_d(r) counts rank r at
depth d among the positions where depths 1..d-1 were guessed within the top k. n-gram lookup
is replayed on the decoding backend's own greedy answers to the same conversations.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources

import numpy as np

from ppd_core.backends import Decoder
from ppd_core.decoding import Request, Speculator, generate
from ppd_core.lookup import LookupStats
from ppd_core.text import chat_ids
from ppd_core.tree import vanilla_family

TOP_K = 10


def calibration_prompts() -> list[list[str]]:
    """Conversations shipped with the package, as their user turns (none from MT-Bench): most ask once,
    some follow up (shorten, rewrite, extend code), as chats do and as lookup needs to be measured on."""
    entries = json.loads(resources.files("ppd_core.calibration").joinpath("prompts.json").read_text())
    return [[entry] if isinstance(entry, str) else entry for entry in entries]


Answerer = Callable[[list[list[int]]], list[list[int]]]  # prompts -> the model's greedy answers (token ids)


def conversation_answers(tokenizer, conversations: Sequence[Sequence[str]], answer: Answerer) -> list[tuple[int, list[int], list[int]]]:
    """The model's greedy answer to every turn of each conversation, asked turn by turn (``answer`` takes one
    turn's prompts at once); a later turn follows the earlier answers (as text, as a chat holds them).
    (turn, prompt ids, answer ids) each."""
    histories: list[list[dict]] = [[] for _ in conversations]
    out = []
    for turn in range(max((len(c) for c in conversations), default=0)):
        live = [i for i, turns in enumerate(conversations) if turn < len(turns)]
        for i in live:
            histories[i].append({"role": "user", "content": conversations[i][turn]})
        prompts = [chat_ids(tokenizer, histories[i]) for i in live]
        for i, prompt, reply in zip(live, prompts, answer(prompts)):
            histories[i].append({"role": "assistant", "content": tokenizer.decode(reply, skip_special_tokens=True)})
            out.append((turn + 1, prompt, reply))
    return out


def batched_answers(model, max_new_tokens: int, pad_id: int, eos_ids: Sequence[int]) -> Answerer:
    """Greedy answers from the transformers model, a batch per turn."""
    from ppd_core.greedy_answers import greedy_batch  # noqa: PLC0415 - torch: the transformers model's path

    return lambda prompts: greedy_batch(model, prompts, max_new_tokens, pad_id, eos_ids)


def decoder_answers(decoder: Decoder, max_new_tokens: int, eos_ids: Sequence[int],
                    progress: Callable[[int], None] | None = None) -> Answerer:
    """Greedy answers from the decoding backend itself, plain decoding, one prompt at a time (``progress`` gets
    the number answered so far): lookup is replayed on exactly the text decoding will see (llama.cpp's answers
    differ from transformers' fp32 ones)."""
    speculator = Speculator(decoder, vanilla_family())
    answered = itertools.count(1)

    def answer(prompts: list[list[int]]) -> list[list[int]]:
        replies = []
        for prompt in prompts:
            request = Request(prompt, max_new_tokens, frozenset(eos_ids), decoder.max_context)
            replies.append([token for step in generate(speculator, request) for token in step.tokens])
            if progress:
                progress(next(answered))
        return replies

    return answer


def lookup_stats(answers: Sequence[tuple[int, list[int], list[int]]]) -> LookupStats:
    """n-gram lookup replayed on ``conversation_answers``."""
    stats = LookupStats.empty()
    for turn, prompt, reply in answers:
        stats.add_answer(prompt, reply, turn)
    return stats


@dataclass
class AcceptanceStats:
    """Counts per depth: ``hits[d][r]`` guesses right at rank r, out of ``trials[d]`` eligible positions."""

    hits: list[list[int]]  # [n][k]
    trials: list[int]  # [n]

    @property
    def probs(self) -> list[list[float]]:
        """p_d(r) as observed frequencies (a depth never reached: all zero)."""
        return [[h / max(t, 1) for h in row] for row, t in zip(self.hits, self.trials)]

    @property
    def top1(self) -> list[float]:
        return [row[0] / max(t, 1) for row, t in zip(self.hits, self.trials)]

    def add(self, ranks: np.ndarray) -> None:
        """``ranks`` [C, n]: rank of the model's token among the guesses, or -1 when outside the top k."""
        ranks = np.asarray(ranks)
        eligible = np.ones(ranks.shape[0], dtype=bool)
        for depth in range(ranks.shape[1]):
            self.trials[depth] += int(eligible.sum())
            found = ranks[:, depth]
            for rank in found[eligible & (found >= 0)].tolist():
                self.hits[depth][rank] += 1
            eligible &= found >= 0


def guess_ranks(student, teacher, top_k: int):
    """Ranks [C, n] of the teacher's argmax among the student's top k; -1 where absent (torch tensors)."""
    import torch  # noqa: PLC0415 - the transformers model's path

    truth = teacher.argmax(-1)  # [C, n]
    ranked = student.topk(top_k, dim=-1).indices  # [C, n, K]
    found = ranked == truth[..., None]  # [C, n, K]
    return torch.where(found.any(-1), found.float().argmax(-1), torch.full_like(truth, -1))


def measure_acceptance(
    model,
    tokenizer,
    prompt_table,  # [n * V, hidden] torch tensor
    num_prompt_tokens: int,
    ensemble_size: int,
    conversations: Sequence[Sequence[str]],
    eos_ids: Sequence[int],
    max_new_tokens: int = 96,
    top_k: int = TOP_K,
    chunk: int = 64,
    progress: Callable[[int, int], None] | None = None,
) -> AcceptanceStats:
    """p_d(r) over the transformers model's greedy answers to every turn of ``conversations``."""
    import torch  # noqa: PLC0415 - the transformers model's path

    from ppd_core.distillation import student_logits, teacher_pass, teacher_targets, valid_cuts  # noqa: PLC0415

    with torch.inference_mode():
        return _measure(model, tokenizer, prompt_table, num_prompt_tokens, ensemble_size, conversations, eos_ids,
                        max_new_tokens, top_k, chunk, progress, (student_logits, teacher_pass, teacher_targets, valid_cuts))


def _measure(model, tokenizer, prompt_table, num_prompt_tokens, ensemble_size, conversations, eos_ids, max_new_tokens,
             top_k, chunk, progress, distillation) -> AcceptanceStats:
    student_logits, teacher_pass, teacher_targets, valid_cuts = distillation
    n = num_prompt_tokens
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    answers = conversation_answers(tokenizer, conversations, batched_answers(model, max_new_tokens, pad, eos_ids))
    stats = AcceptanceStats(hits=[[0] * top_k for _ in range(n)], trials=[0] * n)
    for done, (turn, prompt, answer) in enumerate(answers, 1):
        sequence = prompt + answer
        cache, teacher = teacher_pass(model, sequence)
        cuts = valid_cuts(len(prompt), len(sequence), n)
        for start in range(0, len(cuts), chunk):
            part = cuts[start : start + chunk]
            student = student_logits(model, cache, prompt_table, part, n, ensemble_size)  # [C, n, vocab]
            stats.add(guess_ranks(student, teacher_targets(teacher, part, n), top_k).cpu().numpy())
        if progress:
            progress(done, len(answers))
    return stats
