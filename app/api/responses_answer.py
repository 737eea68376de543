"""``POST /v1/responses`` out: a chat job's answer as OpenAI's Responses API gives it, whole (a ``response`` object)
or streamed (its typed server-sent events: ``response.created``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ..., ``response.completed`` or ``response.incomplete``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from fastapi import Request

from app.api.answers import outcome_of
from app.api.decoding import Decoding
from app.api.responses import answered_by, ppd_figures
from app.api.responses_request import ResponsesRequest
from app.api.schemas import Job, Outcome
from app.tools import HeldText, ToolCall, parse


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [output_text(text)]}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call: ToolCall, status: str = "completed") -> dict:
    return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id,
            "name": call.name, "arguments": call.arguments if status == "completed" else "", "status": status}


def response_object(job: Job, request: ResponsesRequest, outcome: Outcome | None, output: list[dict]) -> dict:
    """The ``response`` object: in progress (no ``outcome`` yet), completed, or incomplete at the token limit."""
    status = "in_progress" if outcome is None else ("incomplete" if outcome.finish_reason == "length" else "completed")
    body = {
        "id": "resp_" + job.id.removeprefix("chatcmpl-"), "object": "response", "created_at": job.created,
        "status": status, "model": job.model if outcome is None else answered_by(job, outcome), "output": output,
        "error": None, "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions, "max_output_tokens": request.max_output_tokens, "metadata": {},
        "parallel_tool_calls": True, "temperature": job.sampling.temperature, "top_p": job.sampling.top_p,
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": request.tools or [], "text": request.text or {"format": {"type": "text"}}, "store": False,
        "previous_response_id": None, "reasoning": None, "truncation": "disabled", "usage": None,
    }
    if outcome is not None:
        prompt, answer = len(job.ids), outcome.completion_tokens
        body["usage"] = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": answer, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": prompt + answer}
        body["ppd"] = ppd_figures(job, outcome)
    return body


def final_output(job: Job, text: str, message_id: str) -> list[dict]:
    """The answer's output items: its text as a message (unless it is only calls), then its function calls."""
    content, calls = parse(text, job.tools.names) if job.tools is not None else (text, [])
    items = [message_item(message_id, content or "")] if content or not calls else []
    return items + [call_item(call) for call in calls]


async def whole_response(decoding: Decoding, job: Job, http: Request, request: ResponsesRequest):
    outcome = await outcome_of(decoding, http)
    if not isinstance(outcome, Outcome):
        return outcome
    return response_object(job, request, outcome, final_output(job, outcome.text or "", new_id("msg")))


class EventWriter:
    """Numbered server-sent events of one streamed response."""

    def __init__(self):
        self.number = 0

    def __call__(self, kind: str, **fields) -> str:
        body = {"type": kind, "sequence_number": self.number, **fields}
        self.number += 1
        return f"event: {kind}\ndata: {json.dumps(body)}\n\n"


class TextItem:
    """The streamed message item: opened with its first text, closed at the end."""

    def __init__(self, write: EventWriter, index: int = 0):
        self.write, self.index, self.id, self.text, self.open = write, index, new_id("msg"), "", False

    def delta(self, piece: str) -> list[str]:
        events = [] if self.open or not piece else self.start()
        if piece:
            self.text += piece
            events.append(self.write("response.output_text.delta", item_id=self.id, output_index=self.index,
                                     content_index=0, delta=piece, logprobs=[]))
        return events

    def start(self) -> list[str]:
        self.open = True
        return [self.write("response.output_item.added", output_index=self.index,
                           item=message_item(self.id, "", "in_progress")),
                self.write("response.content_part.added", item_id=self.id, output_index=self.index, content_index=0,
                           part=output_text(""))]

    def close(self) -> list[str]:
        if not self.open:
            return []
        item = message_item(self.id, self.text)
        return [self.write("response.output_text.done", item_id=self.id, output_index=self.index, content_index=0,
                           text=self.text, logprobs=[]),
                self.write("response.content_part.done", item_id=self.id, output_index=self.index, content_index=0,
                           part=output_text(self.text)),
                self.write("response.output_item.done", output_index=self.index, item=item)]


def call_events(write: EventWriter, call: ToolCall, index: int) -> list[str]:
    item = call_item(call)
    return [write("response.output_item.added", output_index=index, item=call_item(call, "in_progress")),
            write("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                  delta=call.arguments),
            write("response.function_call_arguments.done", item_id=item["id"], output_index=index, name=call.name,
                  arguments=call.arguments),
            write("response.output_item.done", output_index=index, item=item)]


async def streamed_response(decoding: Decoding, job: Job, request: ResponsesRequest) -> AsyncIterator[str]:
    """The response's events as the answer grows; text that may still be a tool call is held back (as on the chat
    endpoint), the calls go out whole at the end."""
    write = EventWriter()
    text, held = TextItem(write), (HeldText(job.tools.names) if job.tools is not None else None)
    started = response_object(job, request, None, [])
    try:
        yield write("response.created", response=started)
        yield write("response.in_progress", response=started)
        async with aclosing(decoding.events()) as events:
            async for kind, value in events:
                if kind == "text":
                    for event in text.delta(held.feed(value[0]) if held is not None else value[0]):
                        yield event
                elif kind == "error":
                    yield write("error", code="server_error", message=value.message, param=None)
                    return
                else:
                    for event in ending(write, text, held, job, request, value):
                        yield event
    finally:
        decoding.cancel()


def ending(write: EventWriter, text: TextItem, held: HeldText | None, job: Job, request: ResponsesRequest,
           outcome: Outcome) -> list[str]:
    """The last events: the rest of the text, the message closed, the calls, then the whole response."""
    rest, calls = held.finish() if held is not None else ("", [])
    events = text.delta(rest)
    if not calls and not text.open:
        events += text.start()  # an empty answer is still one message
    events += text.close()
    offset = 1 if text.open else 0
    for index, call in enumerate(calls):
        events += call_events(write, call, index + offset)
    output = ([message_item(text.id, text.text)] if text.open else []) + [call_item(call) for call in calls]
    final = response_object(job, request, outcome, output)
    kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    return events + [write(kind, response=final)]
