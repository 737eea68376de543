"""llama-server's ``POST /infill`` (what editors' fill-in-the-middle plugins such as llama.vim and llama.vscode call):
``input_prefix``, ``input_suffix``, ``prompt`` (text typed after the prefix) and ``input_extra`` (other files'
chunks) made llama-server's infill prompt (``format_prompt_infill``), and the answer in llama-server's own
``/completion`` shape (``content``, ``stop``, ``tokens_predicted``, ...), whole or streamed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request
from pydantic import ConfigDict

from app.api.answers import outcome_of
from app.api.decoding import Decoding
from app.api.errors import ApiError
from app.api.prompts import fim_tokens, token_ids
from app.api.responses import answered_by
from app.api.schemas import CompletionRequest, Job, Outcome, SamplingFields, sampling_fields

BATCH = 2048  # llama-server's default n_batch: the prefix keeps its last 3/4 of it, the suffix what is left
SNIPPET = "\n\n--- snippet ---\n\n"  # llama-server's separator of extra chunks where the vocabulary has no FIM_SEP


class InfillRequest(SamplingFields):
    """The sampling fields (``SamplingFields``: every one ppd has, by llama-server's names), and infill's own."""

    model_config = ConfigDict(extra="ignore")  # llama-server's other sampler fields
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[Any] = []
    prompt: str = ""
    n_predict: int | None = None
    max_tokens: int | None = None
    stream: bool = False
    seed: int | None = None
    stop: list[str] | None = None


def extra_ids(tokenizer, extra: list[Any]) -> list[int]:
    """The other files' chunks, as llama-server lays them before the prefix: after ``<|repo_name|>``, each behind
    ``<|file_sep|>`` and its file name where the vocabulary has those tokens, else behind a snippet line."""
    llama, vocab = getattr(tokenizer, "llama", None), getattr(tokenizer, "vocab", None)
    rep = int(llama.llama_vocab_fim_rep(vocab)) if llama is not None else -1
    sep = int(llama.llama_vocab_fim_sep(vocab)) if llama is not None else -1
    ids = [rep, *token_ids(tokenizer, ["myproject\n"], first=False)] if rep >= 0 else []
    for index, chunk in enumerate(extra):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str):
            raise ApiError("input_extra holds {'filename': ..., 'text': ...} chunks", f"input_extra[{index}]")
        name = chunk.get("filename") if isinstance(chunk.get("filename"), str) else "tmp"
        head = [sep, *token_ids(tokenizer, [name + "\n"], first=False)] if sep >= 0 else \
            token_ids(tokenizer, [SNIPPET], first=False)
        ids += head + token_ids(tokenizer, [chunk.get("text", "")], first=False)
    if sep >= 0:
        ids += [sep, *token_ids(tokenizer, ["filename\n"], first=False)]
    return ids


def infill_ids(tokenizer, request: InfillRequest, context: int) -> list[int]:
    """llama-server's infill prompt: extra chunks, BOS (where the vocabulary adds one), ``<PRE>`` prefix (its last
    1,536 tokens) prompt ``<SUF>`` suffix (what fits in the rest of a quarter batch) ``<MID>``."""
    fim = fim_tokens(tokenizer)
    if fim is None:
        raise ApiError("input_suffix: this model has no fill-in-the-middle tokens (<fim_prefix>, <fim_suffix>, "
                       "<fim_middle>), so it cannot complete between a prefix and a suffix", "input_suffix")
    pre, suf, mid = fim
    typed = token_ids(tokenizer, [request.prompt], first=False) if request.prompt else []
    prefix = token_ids(tokenizer, [request.input_prefix], first=False)[-(3 * BATCH // 4):] if request.input_prefix else []
    suffix = token_ids(tokenizer, [request.input_suffix], first=False) if request.input_suffix else []
    suffix = suffix[: max(0, BATCH // 4 - (2 + len(typed)))]
    bos = getattr(tokenizer, "bos_token_id", None)
    head = [t for t in tokenizer.encode("", add_special_tokens=True) if t == bos][:1] if bos is not None else []
    extra = extra_ids(tokenizer, request.input_extra)
    room = max(0, context - BATCH - 2 * (request.n_predict or 0))
    return [*(extra[max(0, len(extra) - room):] if room else []), *head, pre, *prefix, *typed, suf, *suffix, mid]


def completion_request(request: InfillRequest, ids: list[int]) -> CompletionRequest:
    """The ``/v1/completions`` request that answers it (``n_predict`` -1 or unset: the rest of the context)."""
    limit = request.max_tokens if request.max_tokens is not None else request.n_predict
    return CompletionRequest(prompt=ids, max_tokens=None if limit is None or limit < 0 else limit,
                             seed=request.seed, stop=request.stop, **sampling_fields(request))


def final(job: Job, outcome: Outcome, content: str) -> dict:
    reason = {"length": "limit"}.get(outcome.finish_reason, "eos")
    return {"content": content, "stop": True, "model": answered_by(job, outcome), "stop_type": reason,
            "stopping_word": "", "tokens_predicted": outcome.completion_tokens, "tokens_evaluated": len(job.ids),
            "truncated": False, "has_new_line": "\n" in (outcome.text or "")}


async def whole_infill(decoding: Decoding, job: Job, http: Request):
    outcome = await outcome_of(decoding, http)
    return final(job, outcome, outcome.text or "") if isinstance(outcome, Outcome) else outcome


async def streamed_infill(decoding: Decoding, job: Job) -> AsyncIterator[str]:
    """llama-server's stream: ``{"content": piece, "stop": false}`` events, then the final one (no ``[DONE]``)."""
    try:
        async with aclosing(decoding.events()) as events:
            async for kind, value in events:
                if kind == "text":
                    yield f"data: {json.dumps({'content': value[0], 'stop': False})}\n\n"
                elif kind == "error":
                    yield f"data: {json.dumps({'error': {'message': value.message, 'type': 'server_error'}})}\n\n"
                else:
                    yield f"data: {json.dumps(final(job, value, ''))}\n\n"
    finally:
        decoding.cancel()
