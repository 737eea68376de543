"""The OpenAI-compatible HTTP API: ``GET /v1/models[/{id}]``, ``POST /v1/chat/completions``, ``GET /health``.

One job: turn OpenAI chat-completion requests into ``Engine.stream`` calls and the answers
back into OpenAI's JSON and server-sent events. ``ppd serve`` runs it alone (``create_api``);
``ppd chat`` puts its routes (``api_routes``) in front of the Gradio app's, on one server, so the
page and the API share one model and one ``ChatService.queue``: an API answer waits for a
page's answer and the other way round.

API answers never reuse the KV cache (``reuse_cache=False``): each request prefills its whole
conversation into a cache of its own, so the UI's kept cache for its next turn stays valid.

A request is validated and tokenized off the event loop, then takes a place in ``ChatService``'s
line for the model (a full line: 503 with ``Retry-After``) and decodes on a worker of a fixed pool
(one worker per place in line), through ``ChatService.decode``: a client that goes away gives up
its place, or stops the decoding within one step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Literal

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Mount, Route

from app.chat_service import ChatService, ModelChanged
from app.model_catalog import available, public_name
from app.model_queue import Busy, Queued
from app.structured import FieldError, JsonContent, json_content, response_grammar
from app.tools import HeldText, ToolPlan, call_grammar, parse, plan_tools, template_format
from app.tools import prompt as tool_prompt
from ppd_core.engine import (MAX_TOP_LOGPROBS, ChosenSampling, ModelSnapshot, SamplingParams, UnencodableText,
                             live_llama_cpp_models, utf8)
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)

MAX_STOP_STRINGS = 4  # as OpenAI
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
DISCONNECT_POLL_SECONDS = 0.25  # how often a non-streamed request checks its client
MAX_BODY_BYTES = 1 << 20  # request bodies beyond 1 MB are refused with 413
DRAIN_BYTES = 16 << 20  # an oversized body is read (and dropped) up to this much before the 413, so the client sees it


class ApiError(Exception):
    """A request the client must fix (400), a missing key (401), or a full line (503): OpenAI's error shape."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.status, self.kind = message, param, code, status, kind
        self.headers = headers


def not_ready(service: ChatService, error: PpdError) -> ApiError:
    """The 503 for a model that is loading (``NotReady``), with Retry-After while retrying can help."""
    return ApiError(str(error), code="model_not_ready", status=503, kind="server_error", headers=retry_header(service))


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   kind: str = "invalid_request_error", headers: dict | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    headers = {"WWW-Authenticate": "Bearer", **(headers or {})} if status == 401 else headers
    return JSONResponse(body, status_code=status, headers=headers)


# ---- the request, as OpenAI defines it (the fields ppd uses; others are ignored) ----


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: Any = None  # a string or a list of text parts: checked by ``message_text``, with a clearer message
    tool_calls: Any = None  # an assistant's earlier calls (``app.tools``): checked by ``tool_calls_of``
    tool_call_id: Any = None  # a tool message's: the call it answers
    name: Any = None  # a tool message's: the function's name (optional)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class RequestFields(BaseModel):
    """The fields both endpoints take."""

    model_config = ConfigDict(extra="ignore")  # clients send fields such as `user` or `metadata`
    model: str | None = None  # answered by the loaded model (as llama-server does), unless it names another one ppd has
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None  # unset: the model's recommendation, else llama-server's (``sampling_defaults``)
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens; wins if both are given
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # 0 to 20 alternatives per token; needs logprobs
    tools: list[Any] | None = None  # OpenAI's function tools (``app.tools``); chat only
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", "function": {"name": ...}}
    functions: list[Any] | None = None  # the deprecated form of tools: refused
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (``structured``)
    grammar: str | None = None  # llama-server's: GBNF the answer follows
    # ppd's extensions (llama-server accepts top_k and the repeat penalty too, with the same meaning)
    top_k: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    acceptance: Literal["lossless", "typical"] | None = None


class ChatCompletionRequest(RequestFields):
    messages: list[Message]


class CompletionRequest(RequestFields):
    """``/v1/completions``: text in, text out (the legacy endpoint editors' completion still uses)."""

    prompt: str | list[str]
    logprobs: int | None = None  # 0 to 5 alternatives per token (the legacy shape)
    echo: bool | None = None
    suffix: str | None = None


@dataclass
class Job:
    """A validated request, ready for the model."""

    id: str
    ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stop: list[str]
    include_usage: bool
    model: str  # the name of the model the ids were made for: a streamed answer's label
    logprobs: int | None = None  # the alternatives per token asked for (``top_logprobs``); None: no logprobs
    grammar: str | None = None  # GBNF the answer follows (``structured.response_grammar``)
    json_content: bool = False  # a chat's response_format: the content is the answer's JSON (``structured.json_content``)
    tools: ToolPlan | None = None  # the tools offered: the answer is parsed for calls (``app.tools.parse``)
    completion: bool = False  # a ``/v1/completions`` job: its answers are text_completion objects
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass
class Outcome:
    """How a job ended; ``stats`` and ``text`` are None when it was cancelled before reaching the model."""

    finish_reason: str  # "stop", "length", or "cancelled" (the client went away)
    text: str | None = None  # the answer, cut before a stop string
    completion_tokens: int = 0
    stats: Any = None  # GenerationStats
    queued_seconds: float = 0.0  # waiting for the model: until the job's turn began (its prompt's prefill not counted)
    started_at: float = 0.0  # unix times of taking and releasing the model
    finished_at: float = 0.0
    steps_after_cancel: int = 0  # forward passes that ran after the cancel flag was set (at most one)
    model: ModelSnapshot | None = None  # the model that answered, taken with the first step (under the job's turn)
    logprobs: list[dict] | None = None  # OpenAI's ``logprobs.content`` entries, one per answer token (asked for)


class StopCutter:
    """Cuts a growing answer at the first stop string, holding back text that may begin one."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.sent = 0  # characters of the answer handed out so far
        self.hit = False  # a stop string was reached

    def feed(self, text: str, final: bool) -> tuple[str, bool]:
        """The text to hand out now, and whether a stop string was reached."""
        hits = [i for i in (text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            end, hit = min(hits), True
        elif final:
            end, hit = len(text), False
        else:
            end, hit = len(text) - self._held(text), False
        piece = text[self.sent : end]
        self.sent, self.hit = max(self.sent, end), self.hit or hit
        return piece, hit

    def _held(self, text: str) -> int:
        """Length of the longest end of ``text`` (not yet sent) that begins a stop string."""
        room = len(text) - self.sent
        return max((k for s in self.stops for k in range(min(len(s) - 1, room), 0, -1) if text.endswith(s[:k])), default=0)


# ---- validation: every client mistake is an ApiError before the response starts ----


def encodable(text: str, param: str) -> str:
    """``text``, or a 400 naming ``param`` where it holds a lone UTF-16 surrogate (what JSON's ``"\\ud800"`` escape
    decodes to). Text UTF-8 cannot encode is the client's mistake: a 400, not a 500 from the tokenizer, and not a
    U+FFFD put in its place behind the client's back."""
    try:
        utf8(text, param)
    except UnencodableText as error:
        raise ApiError(str(error), param, "invalid_text") from None
    return text


def message_text(message: Message, index: int) -> str:
    """A message's text: its string content, or its text parts joined."""
    param = f"messages[{index}].content"
    content = message.content
    if content is None or isinstance(content, str):
        return encodable(content or "", param)
    if not isinstance(content, list):
        raise ApiError(f"{param} must be a string or a list of text parts", param)
    parts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise ApiError(f"{param}: only text parts ({{'type': 'text', 'text': ...}}) are supported, got {part!r:.60}", param)
        parts.append(encodable(part["text"], f"{param}[{number}].text"))
    return "".join(parts)


def optional_text(value: Any, param: str) -> str | None:
    """An optional string field of a message (a tool call's id), checked."""
    if value is not None and not isinstance(value, str):
        raise ApiError(f"{param} must be a string", param)
    return None if value is None else encodable(value, param)


def tool_calls_of(message: Message, index: int) -> list[dict]:
    """An assistant message's earlier tool calls, their arguments as objects (what chat templates expect)."""
    param = f"messages[{index}].tool_calls"
    if not isinstance(message.tool_calls, list) or not message.tool_calls:
        raise ApiError(f"{param} must be a list of {{'id': ..., 'type': 'function', 'function': {{...}}}}", param)
    calls = []
    for number, call in enumerate(message.tool_calls):
        at = f"{param}[{number}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ApiError(f"{at} must be {{'id': ..., 'type': 'function', 'function': {{'name': ..., 'arguments': ...}}}}", at)
        name = function.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(f"{at}.function.name must be a function's name", f"{at}.function.name")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        if not isinstance(arguments, dict):
            raise ApiError(f"{at}.function.arguments must be a JSON object (as text)", f"{at}.function.arguments")
        try:
            json.dumps(arguments, ensure_ascii=False).encode("utf-8")
        except (UnicodeEncodeError, ValueError):
            raise ApiError(f"{at}.function.arguments has text UTF-8 cannot encode", f"{at}.function.arguments",
                           "invalid_text") from None
        calls.append({"id": optional_text(call.get("id"), f"{at}.id") or f"call_{number}", "type": "function",
                      "function": {"name": encodable(name, f"{at}.function.name"), "arguments": arguments}})
    return calls


def chat_messages(request: ChatCompletionRequest) -> list[dict]:
    if not request.messages:
        raise ApiError("messages is empty: send at least one user message", "messages")
    messages = []
    for index, message in enumerate(request.messages):
        if message.role not in ROLES:
            roles = ", ".join(sorted(ROLES))
            raise ApiError(f"messages[{index}].role: unknown role {message.role!r}; use one of {roles}",
                           f"messages[{index}].role")
        text = message_text(message, index)
        entry = {"role": ROLES[message.role], "content": text}
        if message.role == "assistant" and message.tool_calls is not None:
            entry["tool_calls"] = tool_calls_of(message, index)
        elif message.role == "tool":
            entry["tool_call_id"] = optional_text(message.tool_call_id, f"messages[{index}].tool_call_id") or ""
            if message.name is not None:
                entry["name"] = optional_text(message.name, f"messages[{index}].name")
        elif not text.strip():
            raise ApiError(f"messages[{index}].content is empty", f"messages[{index}].content")
        messages.append(entry)
    if not any(m["role"] == "user" for m in messages):
        raise ApiError("messages has no user message", "messages")
    return messages


def check_unsupported(request: RequestFields) -> None:
    if request.n not in (None, 1):
        raise ApiError(f"n must be 1 (ppd answers one choice per request), got {request.n}", "n")
    if request.top_logprobs is not None and isinstance(request, ChatCompletionRequest):
        if not request.logprobs:
            raise ApiError("top_logprobs needs logprobs set to true", "top_logprobs")
        if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ApiError(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {request.top_logprobs}",
                           "top_logprobs")
    if request.functions:
        raise ApiError("functions (the deprecated form of tools) is not supported: use tools", "functions")
    if isinstance(request, CompletionRequest) and (request.tools or request.tool_choice is not None):
        raise ApiError("tools need /v1/chat/completions", "tools" if request.tools else "tool_choice")


SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "repeat_penalty", "repeat_last_n", "presence_penalty",
                   "frequency_penalty")


def check_sampling(request: RequestFields) -> None:
    """The sampling fields a request sets, in range (OpenAI's ranges where it has the field, llama-server's else)."""
    checks = {"temperature": (lambda v: 0.0 <= v <= 2.0, "must be between 0 and 2"),
              "top_p": (lambda v: 0.0 < v <= 1.0, "must be greater than 0 and at most 1"),
              "top_k": (lambda v: v >= 0, "must be 0 (off) or positive"),
              "repeat_penalty": (lambda v: 0.0 < v <= 100.0, "must be greater than 0 (1: off)"),
              "repeat_last_n": (lambda v: v >= -1, "must be -1 (the whole context), 0 (off) or positive"),
              "presence_penalty": (lambda v: -2.0 <= v <= 2.0, "must be between -2 and 2"),
              "frequency_penalty": (lambda v: -2.0 <= v <= 2.0, "must be between -2 and 2")}
    for name, (fine, rule) in checks.items():
        value = getattr(request, name)
        if value is not None and not fine(value):
            raise ApiError(f"{name} {rule}, got {value}", name)


def sampling_of(request: RequestFields, defaults: ChosenSampling) -> SamplingParams:
    """The request's sampling: its own fields, ``defaults`` (the model's) for those it leaves unset."""
    try:
        return defaults.params(**{name: getattr(request, name) for name in SAMPLING_FIELDS},
                               acceptance=request.acceptance, seed=request.seed)
    except PpdError as error:
        raise ApiError(str(error), "seed" if str(error).startswith("seed") else None) from None


def stop_strings(request: RequestFields) -> list[str]:
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise ApiError("stop strings must not be empty", "stop")
    return [encodable(s, "stop" if isinstance(request.stop, str) else f"stop[{i}]") for i, s in enumerate(stops)]


COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default max_tokens on /v1/completions
MAX_COMPLETION_LOGPROBS = 5


def completion_prompt(request: CompletionRequest) -> str:
    prompts = [request.prompt] if isinstance(request.prompt, str) else request.prompt
    if len(prompts) != 1:
        raise ApiError(f"prompt must be one string (ppd answers one prompt per request), got {len(prompts)}", "prompt")
    if request.echo:
        raise ApiError("echo is not supported", "echo")
    if request.suffix:
        raise ApiError("suffix (fill-in-the-middle) is not supported", "suffix")
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise ApiError(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {request.logprobs}", "logprobs")
    text = encodable(prompts[0], "prompt")
    if not text:
        raise ApiError("prompt is empty", "prompt")
    return text


def make_job(service: ChatService, request: ChatCompletionRequest | CompletionRequest) -> Job:
    """A chat request's job (or, for a ``CompletionRequest``, the raw prompt's, tokenized as llama-server does)."""
    completion = isinstance(request, CompletionRequest)
    check_unsupported(request)
    if completion:
        prompt, field = completion_prompt(request), "prompt"
    else:
        messages, field = chat_messages(request), "messages"
    check_sampling(request)
    stops = stop_strings(request)
    limit = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    if limit is not None and limit < 1:
        raise ApiError(f"{param} must be at least 1, got {limit}", param)
    try:
        engine = service.engine  # a switch may have begun since the request was let in
        snapshot = service.snapshot()
    except PpdError as error:
        raise not_ready(service, error) from None
    model, sampling = snapshot.name, sampling_of(request, snapshot.sampling_defaults)
    tools, variables = None, {}
    try:
        grammar = response_grammar(request.response_format, request.grammar, chat=not completion)
        json_answer = grammar is not None and request.grammar is None and not completion
        if not completion:
            tools = plan_tools(request.tools, request.tool_choice, engine.chat_template)
            messages, variables = tool_prompt(messages, tools, template_format(engine.chat_template)[0])
        if tools is not None and tools.forced:
            if grammar is not None:
                raise FieldError("tool_choice 'required' or a named function cannot be combined with response_format "
                                 "or grammar", "tool_choice")
            grammar = call_grammar(tools)
        if grammar is not None:
            engine.check_grammar(grammar)
    except FieldError as error:
        raise ApiError(str(error), error.param) from None
    except PpdError as error:
        named = "tool_choice" if tools is not None and tools.forced else None
        raise ApiError(str(error), named or ("grammar" if request.grammar is not None else "response_format")) from None
    try:
        ids = engine.tokenizer.encode(prompt) if completion else engine.chat_ids(messages, **variables)
    except PpdError as error:
        raise ApiError(str(error), field) from None
    if completion and limit is None:
        limit = COMPLETION_DEFAULT_TOKENS
    context = engine.max_context
    if len(ids) >= context or (limit is not None and len(ids) + limit > context):
        asked = f" and {limit} tokens for the answer ({len(ids) + limit} in all)" if limit is not None else ""
        raise ApiError(
            f"this model's maximum context length is {context} tokens; the {field} takes {len(ids)} tokens{asked}. "
            f"Shorten the {field} or lower {param}.", field, "context_length_exceeded")
    if completion:
        logprobs = request.logprobs
    else:
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
    return Job(
        id=f"{'cmpl' if completion else 'chatcmpl'}-{uuid.uuid4().hex}", ids=ids,
        max_new_tokens=limit if limit is not None else context - len(ids), sampling=sampling, stop=stops,
        include_usage=bool(request.stream_options and request.stream_options.include_usage), model=model,
        logprobs=logprobs, grammar=grammar, json_content=json_answer, tools=tools, completion=completion,
    )


def legacy_logprobs(entries: list[dict] | None, start: int = 0) -> dict | None:
    """Chat-style logprobs entries in /v1/completions' shape; ``start``: the text offset of the first."""
    if entries is None:
        return None
    offsets, at = [], start
    for entry in entries:
        offsets.append(at)
        at += len(entry["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
            "text_offset": offsets}


# ---- decoding: on a worker of the pool, in ChatService's line for the model ----


class ApiState:
    """What the API keeps between requests: finished jobs (newest last), running ones (for /health and tests)
    and the worker pool, one worker per place in the model's line (so a request never waits for a worker)."""

    def __init__(self, workers: int):
        self.created = int(time.time())
        self.workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ppd-api")
        self.finished: deque[tuple[Job, Outcome]] = deque(maxlen=64)
        self.running = 0  # requests whose decoding thread has not ended (answering or waiting for the model)
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            self.running += 1

    def ended(self) -> None:
        with self._lock:
            self.running -= 1


Emit = Callable[[str, list[dict] | None], None]  # (text, the logprobs entries of the tokens it completes)


def decode(service: ChatService, job: Job, ticket: int, cancelled: threading.Event, emit: Emit) -> Outcome:
    """Answer ``job`` in its place in line (``ticket``), handing text to ``emit`` as it grows; gives up its place, or
    stops within one step, once ``cancelled`` is set. The model that answers is read with the first step, under the
    job's turn (``Outcome.model``): a switch after the answer can neither relabel it nor fail it."""
    queued = time.monotonic()
    outcome = Outcome("cancelled")
    cutter = StopCutter(job.stop)
    content = JsonContent(emit) if job.json_content else None  # a response_format's JSON, out of its fence
    emit = content.feed if content is not None else emit
    entries = None  # the answer's logprobs entries (asked for), and how many went out with text so far
    event = None
    events = service.decode(job.ids, "ppd", job.max_new_tokens, job.sampling, reuse_cache=False, stop=cancelled.is_set,
                            ticket=ticket, logprobs=job.logprobs, grammar=job.grammar)
    with closing(events):
        for event in events:
            if isinstance(event, Queued):
                continue
            if outcome.model is None:  # the first step: no switch can happen until this job's turn ends
                outcome.queued_seconds, outcome.started_at = turn_taken(queued, event)
                outcome.model = service.snapshot()
                entries = None if job.logprobs is None else LogprobEntries(service.engine.token_bytes)
            if entries is not None:
                entries.add(event.step.logprobs)
            if not answer_step(event, outcome, cutter, cancelled, emit, entries):
                break
        finished = time.time()  # before the turn ends (closing ``events``): the next job starts after it
    complete = outcome.finish_reason == "stop" and not cutter.hit  # ended by the model, not cut short
    if content is not None and not cancelled.is_set():
        content.close(complete)
    if entries is not None and (rest := entries.take()) and not cancelled.is_set():
        emit("", rest)  # tokens that added no text of their own (the end-of-turn token)
    if outcome.started_at == 0.0:  # never reached the model
        outcome.queued_seconds = time.monotonic() - queued
    elif event is not None and not isinstance(event, Queued):
        outcome.text = event.text[: cutter.sent]
        if job.json_content:
            outcome.text = json_content(outcome.text, complete=complete)
        outcome.completion_tokens = len(event.tokens)
        outcome.stats = event.stats
        outcome.logprobs = entries.all if entries is not None else None
        outcome.finished_at = finished
    return outcome


def turn_taken(queued: float, first) -> tuple[float, float]:
    """The seconds from ``queued`` (a ``time.monotonic()``) until the job took the model, and that moment's unix time,
    at its ``first`` event: the time until then less the first step's own (the prompt's prefill). What is left beside
    the wait is the engine setting the answer up, well under a millisecond."""
    now = time.monotonic()
    taken = max(queued, now - first.step.seconds)
    return taken - queued, time.time() - (now - taken)


class LogprobEntries:
    """OpenAI's ``logprobs.content`` entries of an answer's tokens (``ppd_core.logprobs.TokenLogprob``s), handed out
    with the text that completes them."""

    def __init__(self, token_bytes: Callable[[int], bytes]):
        self.token_bytes = token_bytes
        self.all: list[dict] = []
        self.sent = 0

    def add(self, reported) -> None:
        self.all.extend({**self.entry(item.token, item.logprob),
                         "top_logprobs": [self.entry(token, logprob) for token, logprob in item.top]}
                        for item in reported or ())

    def entry(self, token: int, logprob: float) -> dict:
        data = self.token_bytes(token)
        return {"token": data.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(data)}

    def take(self) -> list[dict]:
        """The entries not handed out yet."""
        taken, self.sent = self.all[self.sent:], len(self.all)
        return taken


def answer_step(event, outcome: Outcome, cutter: StopCutter, cancelled: threading.Event, emit: Emit,
                entries: LogprobEntries | None = None) -> bool:
    """One step's text out to ``emit`` (with the logprobs entries since the last text, when asked for); False once the
    answer is over (cancelled, a stop string, its end)."""
    if cancelled.is_set():
        outcome.steps_after_cancel += 1  # this step ran before the flag was seen
        return False
    piece, hit = cutter.feed(event.text, event.stop_reason is not None)
    if piece:
        emit(piece, entries.take() if entries is not None else None)
    if hit or event.stop_reason is not None:
        outcome.finish_reason = "stop" if hit or event.stop_reason == "eos" else "length"
        return False
    return True


class Decoding:
    """One request's decoding, on a worker of the pool, and the asyncio queue its text arrives on."""

    def __init__(self, service: ChatService, job: Job, ticket: int, state: ApiState):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.state = state
        state.started()
        state.workers.submit(self._run, service, job, ticket)

    def _put(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shut down)
            self.cancelled.set()

    def _run(self, service: ChatService, job: Job, ticket: int) -> None:
        try:
            outcome = decode(service, job, ticket, self.cancelled, lambda piece, entries: self._put("text", (piece, entries)))
        except BaseException as error:  # noqa: BLE001 - the response reports it; the model is already free
            log.exception("answering an API request failed")
            self.state.ended()
            self._put("error", error)
            return
        self.state.finished.append((job, outcome))
        self.state.ended()
        self._put("done", outcome)

    async def next(self, timeout: float | None = None) -> tuple[str, Any]:
        return await asyncio.wait_for(self.queue.get(), timeout)

    def cancel(self) -> None:
        self.cancelled.set()


# ---- responses ----


def finish_reason(outcome: Outcome) -> str:
    return "length" if outcome.finish_reason == "length" else "stop"


def usage(job: Job, outcome: Outcome) -> dict:
    return {"prompt_tokens": len(job.ids), "completion_tokens": outcome.completion_tokens,
            "total_tokens": len(job.ids) + outcome.completion_tokens}


def ppd_figures(job: Job, outcome: Outcome) -> dict:
    """ppd's own numbers, in a field standard clients ignore: of the model that answered (``outcome.model``)."""
    stats, sampling = outcome.stats, job.sampling
    if stats is None or outcome.model is None:  # never reached the model
        return {"queued_seconds": round(outcome.queued_seconds, 4)}
    return {
        "tokens_per_second": round(stats.tok_s, 3),  # answer tokens per second, prompt processing included
        "tokens_per_step": round(stats.mean_accepted, 4),
        "acceptance": "greedy" if sampling.greedy else sampling.acceptance,
        "distribution_preserving": sampling.lossless,
        "tree": outcome.model.tree["name"],
        "steps": stats.steps,
        "new_tokens": stats.new_tokens,
        "prefill_seconds": round(stats.prefill_seconds, 4),
        "seconds": round(stats.seconds, 4),
        "queued_seconds": round(outcome.queued_seconds, 4),
        "started_at": outcome.started_at,
        "finished_at": outcome.finished_at,
    }


def answered_by(job: Job, outcome: Outcome) -> str:
    """The name of the model that answered (read under the job's turn), else the one the job was made for."""
    return outcome.model.name if outcome.model is not None else job.model


def sse(body: dict | str) -> str:
    """One server-sent event."""
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


def chunk(job: Job, model: str, choices: list[dict], **extra) -> str:
    kind = "text_completion" if job.completion else "chat.completion.chunk"
    return sse({"id": job.id, "object": kind, "created": job.created, "model": model, "choices": choices, **extra})


def text_choice(text: str, reason: str | None = None, logprobs: dict | None = None) -> list[dict]:
    """/v1/completions' choice (a whole answer or a streamed piece of one)."""
    return [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}]


def choice(delta: dict, reason: str | None = None, logprobs: list[dict] | None = None) -> list[dict]:
    return [{"index": 0, "delta": delta, "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
             "finish_reason": reason}]


def unloaded_card(name: str, created: int) -> dict:
    """A model ppd has but has not loaded (named by ``public_name``)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "ppd", "ppd": {"loaded": False}}


def model_card(model: ModelSnapshot, spec: str, created: int) -> dict:
    tokens = model.prompt_tokens
    return {
        "id": model.name, "object": "model", "created": created, "owned_by": "ppd",
        "ppd": {
            "loaded": True,
            "model": public_name(spec),  # as --model names it (a local path: its file name)
            "quant": model.quant,
            "dtype": model.dtype,
            "device": model.device,
            "backend": model.backend,
            "chat_template": model.template_note or "the model's own",
            "plain_only": model.plain_only,
            "forward": model.forward,
            "max_context": model.max_context,
            "prompt_tokens": {"count": tokens.count, "ensemble_size": tokens.ensemble_size, "trained": tokens.trained,
                              "base_model": tokens.base_model, "bytes": tokens.bytes},
            "tree": model.tree,
            "calibration": model.calibration,
            "sampling_defaults": model.sampling_defaults.describe(),  # what a request leaving a field unset gets
        },
    }


def add_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; FastAPI's validation errors (422) become 400s."""

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError):
        return error_response(error.status, error.message, error.param, error.code, error.kind, error.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_: Request, error: RequestValidationError):
        first = (error.errors() or [{}])[0]
        if first.get("type") == "json_invalid":
            reason = (first.get("ctx") or {}).get("error", "")
            return error_response(400, f"the request body is not valid JSON ({reason})".replace(" ()", ""), code="invalid_json")
        param = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first.get("loc", ())[1:]).lstrip(".")
        message = first.get("msg", "invalid request")
        return error_response(400, f"{param or 'the request body'}: {message}", param or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(error.status_code)
        return error_response(error.status_code, str(error.detail), code=code)

    @app.exception_handler(Exception)
    async def server_error(_: Request, error: Exception):  # a bug: still an OpenAI-shaped answer
        return error_response(500, f"ppd failed while answering: {type(error).__name__}", kind="server_error")


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes is answered 413 in OpenAI's shape before any route
    parses it (declared by Content-Length or counted as it arrives); smaller bodies are passed on whole."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        chunks, size, more = [], 0, True
        while more and size <= DRAIN_BYTES:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            size += len(message.get("body", b""))
            if size <= self.limit:
                chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        if size > self.limit or (declared.isdigit() and int(declared) > self.limit):
            refusal = error_response(413, f"the request body is {size:,} bytes; the limit is {self.limit:,}",
                                     code="request_too_large")
            return await refusal(scope, receive, send)
        body, replayed = b"".join(chunks), False

        async def replay():  # the body once, then the client's own messages (a disconnect)
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class OpenAIApi:
    """The routes: ``/health`` and ``/v1`` (an app of its own, with its own error handlers).

    ``routes()`` go into ``ppd serve``'s app (``create_api``) or, for ``ppd chat``, in front of
    the Gradio app's own routes. ``api_key`` set: /v1 needs ``Authorization: Bearer <key>``.
    """

    def __init__(self, service: ChatService, api_key: str | None = None):
        self.service = service
        self.api_key = api_key
        self.state = ApiState(workers=service.queue.max_waiting + 1)
        self.v1 = self._v1()

    def snapshot(self) -> ModelSnapshot:
        """The loaded model; 503 (``model_not_ready``) while another one loads."""
        try:
            return self.service.snapshot()
        except PpdError as error:
            raise not_ready(self.service, error) from None

    def loaded_ids(self, loaded: ModelSnapshot) -> set[str]:
        """The ids that name the loaded model: its name, its spec, and the spec as listed (``public_name``)."""
        return {loaded.name, self.service.spec, public_name(self.service.spec)}

    async def others(self, loaded: ModelSnapshot) -> list[str]:
        """The ids of the models ppd could load instead (``model_catalog.available``; local ones by name only). A
        request naming one is refused (``model_not_loaded``); one naming anything else, a local path included, is
        answered by the loaded model, as llama-server answers any name."""
        specs = await run_in_threadpool(available, self.service.spec)  # reads the Hub cache: off the event loop
        names = dict.fromkeys(public_name(spec) for spec in specs if spec.isprintable())  # no undecodable file names
        return [name for name in names if name not in self.loaded_ids(loaded)]

    def routes(self) -> list:
        return [Route("/health", self.health, methods=["GET"]), Mount("/v1", app=BodyLimit(self.v1))]

    async def health(self, _: Request) -> JSONResponse:
        try:
            model = self.service.snapshot().name
        except PpdError:  # as llama-server: 503 while the model loads
            startup = self.service.startup
            return JSONResponse({"status": "error" if startup.error else "loading", "detail": startup.line()},
                                status_code=503, headers=retry_header(self.service))
        queue = self.service.queue
        return JSONResponse({"status": "ok", "model": model, "busy": queue.busy, "waiting": queue.waiting,
                             "max_waiting": queue.max_waiting, "running": self.state.running,
                             "background": self.service.background,  # e.g. a first launch's calibration
                             "llama_cpp_models": live_llama_cpp_models()})  # one while a GGUF is loaded: none leaked

    async def check_ready(self) -> None:
        if not self.service.ready:
            startup = self.service.startup
            raise ApiError(startup.line(), code="model_not_ready", status=503, kind="server_error",
                           headers=retry_header(self.service))

    async def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            raise ApiError("missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                           status=401)

    def _v1(self) -> FastAPI:
        service, state = self.service, self.state
        v1 = FastAPI(title="ppd", docs_url=None, redoc_url=None, openapi_url=None, dependencies=[Depends(self.authorize), Depends(self.check_ready)])
        v1.state.ppd = state
        add_error_handlers(v1)

        @v1.get("/models")
        async def models():
            loaded = self.snapshot()
            return {"object": "list", "data": [model_card(loaded, service.spec, state.created)] + [
                unloaded_card(name, state.created) for name in await self.others(loaded)]}

        @v1.get("/models/{model_id:path}")
        async def model(model_id: str):
            """The loaded model's card for its name, its spec (``default``, ``hf:...``) or its listed id; another
            listed model's (not loaded) card; else 404."""
            loaded = self.snapshot()
            if model_id in self.loaded_ids(loaded):
                return model_card(loaded, service.spec, state.created)
            if model_id in await self.others(loaded):
                return unloaded_card(model_id, state.created)
            raise ApiError(f"the model {model_id!r} does not exist; this server has {loaded.name!r}", "model",
                           "model_not_found", status=404)

        @v1.post("/chat/completions")
        async def chat_completions(body: ChatCompletionRequest, request: Request):
            return await self._answer(body, request)

        @v1.post("/completions")
        async def completions(body: CompletionRequest, request: Request):
            return await self._answer(body, request)

        return v1

    async def _answer(self, body: ChatCompletionRequest | CompletionRequest, request: Request):
        """Either endpoint's answer, streamed or whole; every client mistake is a 400 here, before the model is
        asked; tokenizing is off the event loop."""
        service, state = self.service, self.state
        loaded = self.snapshot()
        if body.model is not None and encodable(body.model, "model") not in self.loaded_ids(loaded) and \
                body.model in await self.others(loaded):
            raise ApiError(f"the model {body.model!r} is available but not loaded: this server answers with "
                           f"{loaded.name!r} (switch models on the page)", "model", "model_not_loaded")
        job = await run_in_threadpool(make_job, service, body)
        try:
            ticket = service.queue.join()
        except Busy as busy:
            raise ApiError(str(busy), code="server_busy", status=503, kind="server_error",
                           headers={"Retry-After": str(busy.retry_after)}) from None
        decoding = Decoding(service, job, ticket, state)
        if body.stream:
            # the background task runs when the response ends, also after a disconnect (even one before
            # the first event, when the generator's own ``finally`` never runs)
            return StreamingResponse(self._events(decoding, job), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                                     background=BackgroundTask(decoding.cancel))
        try:
            checked = time.monotonic()
            while True:
                try:
                    kind, value = await decoding.next(DISCONNECT_POLL_SECONDS)
                except (asyncio.TimeoutError, TimeoutError):
                    kind = value = None
                if kind == "error":
                    raise failure(value)
                if kind == "done":
                    outcome = value
                    break
                if time.monotonic() - checked >= DISCONNECT_POLL_SECONDS:  # text keeps coming: check anyway
                    checked = time.monotonic()
                    if await request.is_disconnected():
                        return error_response(499, "the client closed the request", code="client_closed")
        finally:
            decoding.cancel()  # a no-op once it ended; stops it when the client left or this task was cancelled
        if job.completion:
            return {"id": job.id, "object": "text_completion", "created": job.created,
                    "model": answered_by(job, outcome),
                    "choices": text_choice(outcome.text, finish_reason(outcome), legacy_logprobs(outcome.logprobs)),
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

    async def _events(self, decoding: Decoding, job: Job) -> AsyncIterator[str]:
        """Server-sent events, labelled with the job's model; a disconnect cancels this generator, and ``finally`` stops
        the decoding."""
        model, offset = job.model, 0
        held, waiting = (HeldText(job.tools.names) if job.tools is not None else None), []  # text and logprobs held back
        try:
            if not job.completion:
                yield chunk(job, model, choice({"role": "assistant", "content": ""}))
            while True:
                kind, value = await decoding.next()
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
                    message = failure(value).message
                    yield sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})
                    break
                else:
                    outcome, reason = value, finish_reason(value)
                    if held is not None:
                        rest, calls = held.finish()
                        if rest or waiting:
                            yield chunk(job, model, choice({"content": rest}, logprobs=waiting or None))
                        for index, call in enumerate(calls):  # OpenAI's shape: the name, then the arguments
                            start = {**call.openai(index), "function": {"name": call.name, "arguments": ""}}
                            yield chunk(job, model, choice({"tool_calls": [start]}))
                            yield chunk(job, model, choice({"tool_calls": [
                                {"index": index, "function": {"arguments": call.arguments}}]}))
                        reason = "tool_calls" if calls else reason
                    last = text_choice("", reason) if job.completion else choice({}, reason)
                    yield chunk(job, model, last, ppd=ppd_figures(job, outcome))
                    if job.include_usage:  # OpenAI's last chunk: no choices, the usage
                        yield chunk(job, model, [], usage=usage(job, outcome))
                    break
            yield sse("[DONE]")
        finally:
            decoding.cancel()


def failure(error: BaseException) -> ApiError:
    """An answer that failed on the model's side: a refusal in one line (the model was switched while the request
    waited: 503, ask again), else a bug (500, its type only)."""
    if isinstance(error, ModelChanged):
        return ApiError(str(error), code="model_changed", status=503, kind="server_error", headers={"Retry-After": "1"})
    return ApiError(f"ppd failed while answering: {type(error).__name__}", status=500, kind="server_error")


def retry_header(service: ChatService) -> dict:
    """Retry-After while the model loads; none after a failed load (retrying will not help)."""
    refusal = service.startup.refusal()
    return {"Retry-After": str(refusal.retry_after)} if refusal.retry_after else {}


def api_routes(service: ChatService, api_key: str | None = None) -> list:
    """The API's routes, for ``ppd chat`` to put in front of the Gradio app's."""
    return OpenAIApi(service, api_key).routes()


def create_api(service: ChatService, api_key: str | None = None) -> FastAPI:
    """``ppd serve``'s app: /health and /v1 (``app.state.ppd`` holds the finished jobs)."""
    api = OpenAIApi(service, api_key)
    app = FastAPI(title="ppd", docs_url=None, redoc_url=None, openapi_url=None, routes=api.routes())
    app.state.ppd = api.state
    add_error_handlers(app)
    return app
