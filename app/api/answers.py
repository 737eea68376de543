"""An answer out to the client, streamed (server-sent events) or whole (one JSON object): both read the same events,
``Decoding.events``; a stream writes each as it comes, a whole answer is built from the last, the ``Outcome``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request
from fastapi.responses import JSONResponse

from app.api.decoding import Decoding
from app.api.errors import error_response
from app.api.responses import (answered_by, choice, chunk, finish_reason, legacy_logprobs, ppd_figures, sse,
                               text_choice, usage)
from app.api.schemas import Job, Outcome
from app.tools import HeldText, parse


async def outcome_of(decoding: Decoding, request: Request) -> Outcome | JSONResponse:
    """The answer's ``Outcome`` once it is done, or what the request gets instead: a client that left, the 499 no one
    reads (and it stops the answer); an answer ppd's shutdown cut short, a 503. Every whole answer reads it."""
    async with aclosing(decoding.events(request.is_disconnected)) as events:
        async for kind, value in events:
            if kind == "error":
                raise value
            if kind == "gone":
                return error_response(499, "the client closed the request", code="client_closed")
            if kind == "done":
                outcome: Outcome = value
    if outcome.finish_reason == "cancelled":  # ppd is quitting: the answer was cut short, or never began
        return error_response(503, "ppd is shutting down: the answer was cut short; ask again once it is back",
                              code="server_shutting_down", kind="server_error")
    return outcome


async def whole(decoding: Decoding, job: Job, request: Request):
    """The answer as one object once it is done (``outcome_of``)."""
    outcome = await outcome_of(decoding, request)
    if not isinstance(outcome, Outcome):
        return outcome
    if job.completion:
        return {"id": job.id, "object": "text_completion", "created": job.created,
                "model": answered_by(job, outcome),
                "choices": text_choice(job.echo + (outcome.text or ""), finish_reason(outcome),
                                       legacy_logprobs(outcome.logprobs, len(job.echo))),
                "usage": usage(job, outcome), "ppd": ppd_figures(job, outcome)}
    message, reason = {"role": "assistant", "content": outcome.text}, finish_reason(outcome)
    if job.tools is not None and outcome.text is not None:
        content, calls = parse(outcome.text, job.tools.names)
        message["content"] = content
        if calls:
            message["tool_calls"], reason = [call.openai() for call in calls], "tool_calls"
    return {
        "id": job.id, "object": "chat.completion", "created": job.created, "model": answered_by(job, outcome),
        "choices": [{"index": 0, "message": message,
                     "logprobs": None if outcome.logprobs is None else {"content": outcome.logprobs, "refusal": None},
                     "finish_reason": reason}],
        "usage": usage(job, outcome),
        "ppd": ppd_figures(job, outcome),
    }


async def streamed(decoding: Decoding, job: Job) -> AsyncIterator[str]:
    """Server-sent events, labelled with the job's model; a disconnect cancels this generator, which stops the
    decoding."""
    model, offset = job.model, len(job.echo)
    held, waiting = (HeldText(job.tools.names) if job.tools is not None else None), []  # text and logprobs held back
    try:
        if not job.completion:
            yield chunk(job, model, choice({"role": "assistant", "content": ""}))
        elif job.echo:
            yield chunk(job, model, text_choice(job.echo))
        async with aclosing(decoding.events()) as events:
            async for kind, value in events:
                if kind == "text" and job.completion:
                    text, entries = value
                    yield chunk(job, model, text_choice(text, logprobs=legacy_logprobs(entries, offset)))
                    offset += len(text)
                elif kind == "text" and held is not None:  # what may still be a tool call waits
                    text, entries = value
                    waiting += entries or []
                    text = held.feed(text)
                    if text:
                        yield chunk(job, model, choice({"content": text}, logprobs=waiting if entries is not None else None))
                        waiting = []
                elif kind == "text":
                    text, entries = value
                    yield chunk(job, model, choice({"content": text}, logprobs=entries))
                elif kind == "error":
                    yield sse({"error": {"message": value.message, "type": value.kind, "param": value.param,
                                         "code": value.code}})
                else:
                    for event in last_chunks(job, value, held, waiting):
                        yield event
        yield sse("[DONE]")
    finally:
        decoding.cancel()  # also when the client left before the events began


def last_chunks(job: Job, outcome: Outcome, held: HeldText | None, waiting: list[dict]) -> list[str]:
    """A stream's end: text held back for a tool call and the calls, the finish reason with ppd's figures, then the
    usage when asked for."""
    model, reason, chunks = job.model, finish_reason(outcome), []
    if held is not None:
        rest, calls = held.finish()
        if rest or waiting:
            chunks.append(chunk(job, model, choice({"content": rest}, logprobs=waiting or None)))
        for index, call in enumerate(calls):  # OpenAI's shape: the name, then the arguments
            start = {**call.openai(index), "function": {"name": call.name, "arguments": ""}}
            chunks.append(chunk(job, model, choice({"tool_calls": [start]})))
            chunks.append(chunk(job, model, choice({"tool_calls": [{"index": index, "function": {"arguments": call.arguments}}]})))
        reason = "tool_calls" if calls else reason
    last = text_choice("", reason) if job.completion else choice({}, reason)
    chunks.append(chunk(job, model, last, ppd=ppd_figures(job, outcome)))
    if job.include_usage:  # OpenAI's last chunk: no choices, the usage
        chunks.append(chunk(job, model, [], usage=usage(job, outcome)))
    return chunks
