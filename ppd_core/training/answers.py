"""The teacher's data: the frozen model's own greedy answers to chat prompts, cached on disk.

A greedy answer is, at every cut inside it, the model's own greedy continuation from that
cut, so one sequence serves as the teacher for every cut. The teacher
distributions are recomputed from the cached token ids by one forward pass during training:
exact full-vocabulary targets for the cost of storing token ids only.

The cache is JSON lines ``{"index", "prompt_length", "ids"}``, appended batch by batch, so an
interrupted run resumes where it stopped; a resume first rewrites it atomically without a torn last line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ppd_core.atomic_files import atomic_write
from ppd_core.training.greedy import greedy_batch
from ppd_core.text import chat_ids

if TYPE_CHECKING:
    from transformers import PreTrainedModel  # type hints only: importing model code costs ~90 MB

Message = dict[str, str]


def encode_prompt(tokenizer, history: list[Message], max_prompt_tokens: int) -> list[int] | None:
    """Chat-template ids, dropping the oldest turns until it fits; None if even the last turn does not."""
    history = list(history)
    while history:
        ids = chat_ids(tokenizer, history)
        if len(ids) <= max_prompt_tokens:
            return ids
        history = history[1:] if history[0]["role"] == "system" else history[2:]
    return None


def read_cache(path: Path) -> list[dict]:
    """Records already generated; a half-written last line (an interrupted run) is dropped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def build_answer_cache(
    model: PreTrainedModel,
    tokenizer,
    histories: list[list[Message]],
    path: Path,
    count: int,
    max_prompt_tokens: int = 384,
    max_new_tokens: int = 192,
    batch_size: int = 16,
    eos_ids: Sequence[int] = (),
    progress: Callable[[int, int], None] | None = None,
) -> list[dict]:
    """Make sure ``path`` holds answers for the first ``count`` usable histories; returns the records."""
    records = read_cache(path)
    # rewrite the intact records (drops a torn last line), atomically: a kill meanwhile leaves the file as it was
    atomic_write(path, "".join(json.dumps(r) + "\n" for r in records))
    done = {r["index"] for r in records}
    todo = []
    for index, history in enumerate(histories):
        if len(done) + len(todo) >= count:
            break
        if index in done:
            continue
        prompt = encode_prompt(tokenizer, history, max_prompt_tokens)
        if prompt is not None:
            todo.append((index, prompt))
    todo.sort(key=lambda item: len(item[1]))  # similar lengths batch with little padding
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else list(eos_ids)[0]
    if progress:  # the count from the start (a resumed cache's answers included), before the first batch's wait
        progress(len(records), count)
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        answers = greedy_batch(model, [p for _, p in batch], max_new_tokens, pad_id, eos_ids)
        with path.open("a") as handle:
            for (index, prompt), answer in zip(batch, answers):
                record = {"index": index, "prompt_length": len(prompt), "ids": prompt + answer}
                handle.write(json.dumps(record) + "\n")
                records.append(record)
        if progress:
            progress(len(records), count)
    return records
