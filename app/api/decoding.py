"""Decoding a ``Job`` on a worker of the API's pool, in ``ModelHost``'s line for the model, and ``Decoding.events``:
the one event iterator both the streamed and the whole answer read.

A client that goes away gives up its place in line, or stops the decoding within one step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from typing import Any

from app.api.errors import failure
from app.api.schemas import Job, Outcome
from app.model_host import ModelHost
from app.model_queue import Queued
from app.structured import JsonContent, json_content
from ppd_core import GrammarError

log = logging.getLogger(__name__)

DISCONNECT_POLL_SECONDS = 0.25  # how often a non-streamed request checks its client
POLL_SECONDS = 0.1  # how often an answer waiting for its next text looks whether ppd is quitting
QUIT_GRACE_SECONDS = 0.4  # ppd quitting: how long an answer gets to end at its next step before it ends without it


class ApiState:
    """What the API keeps between requests: the service it answers with and its key (None: none needed), finished
    jobs (newest last), running ones (for /health and tests) and the worker pool, one worker per place in the model's
    line (so a request never waits for a worker)."""

    def __init__(self, service: ModelHost, api_key: str | None = None):
        self.service, self.api_key = service, api_key
        self.created = int(time.time())
        self.workers = ThreadPoolExecutor(max_workers=service.queue.max_waiting + 1, thread_name_prefix="ppd-api")
        self.finished: deque[tuple[Job, Outcome]] = deque(maxlen=64)
        self.running = 0  # requests whose decoding thread has not ended (answering or waiting for the model)
        self._lock = threading.Lock()

    def started(self) -> None:
        with self._lock:
            self.running += 1

    def ended(self) -> None:
        with self._lock:
            self.running -= 1


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


Emit = Callable[[str, list[dict] | None], None]  # (text, the logprobs entries of the tokens it completes)


def decode(service: ModelHost, job: Job, ticket: int, cancelled: threading.Event, emit: Emit) -> Outcome:
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
    events = service.decode(job.answer, stop=cancelled.is_set, ticket=ticket)
    with closing(events):
        for event in events:
            if isinstance(event, Queued):
                continue
            if outcome.model is None:  # the first step: no switch can happen until this job's turn ends
                outcome.queued_seconds, outcome.started_at = turn_taken(queued, event)
                outcome.model = service.snapshot()
                entries = None if job.logprobs is None else LogprobEntries(service.engine.token_bytes,
                                                                           service.engine.loaded.eos_token_ids)
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
    """OpenAI's ``logprobs.content`` entries of an answer's tokens (``ppd_core.sampling.logits.TokenLogprob``s), handed out
    with the text that completes them; the end-of-turn token that ends an answer (one of ``ends``) has none, as in
    llama-server's answers (its text is no part of the answer)."""

    def __init__(self, token_bytes: Callable[[int], bytes], ends: frozenset[int] = frozenset()):
        self.token_bytes, self.ends = token_bytes, ends
        self.all: list[dict] = []
        self.sent = 0

    def add(self, reported) -> None:
        self.all.extend({**self.entry(item.token, item.logprob),
                         "top_logprobs": [self.entry(token, logprob) for token, logprob in item.top]}
                        for item in reported or () if item.token not in self.ends)

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

    def __init__(self, state: ApiState, job: Job, ticket: int):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.state, self.grammar_param = state, job.grammar_param
        state.started()
        state.workers.submit(self._run, state.service, job, ticket)

    def _put(self, kind: str, value) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is gone (server shut down)
            self.cancelled.set()

    def _run(self, service: ModelHost, job: Job, ticket: int) -> None:
        try:
            outcome = decode(service, job, ticket, self.cancelled, lambda piece, entries: self._put("text", (piece, entries)))
        except GrammarError as error:  # the request's grammar left no token: its fault, one line
            log.warning("an API request's grammar left no token to go on with: %s", error)
            self.state.ended()
            self._put("error", error)
            return
        except BaseException as error:  # noqa: BLE001 - the response reports it; the model is already free
            log.exception("answering an API request failed")
            self.state.ended()
            self._put("error", error)
            return
        self.state.finished.append((job, outcome))
        self.state.ended()
        self._put("done", outcome)

    async def events(self, client_gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[tuple[str, Any]]:
        """The answer as it comes: ``("text", (piece, logprobs entries))`` while it grows, then one last event:
        ``("done", Outcome)``, ``("error", ApiError)`` (it failed on the model's side) or, with ``client_gone`` (a whole
        answer: nothing else notices a client leave), ``("gone", None)``, checked every ``DISCONNECT_POLL_SECONDS``.
        With ppd quitting, an answer still in a step (a long prompt's prefill on a busy CPU) after
        ``QUIT_GRACE_SECONDS`` ends without it (a "cancelled" ``Outcome``), so its stream gets its last chunk before
        the process ends. However it ends (a disconnect cancels a stream's reader), the decoding is stopped."""
        checked, quit_seen = time.monotonic(), None
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(self.queue.get(), POLL_SECONDS)
                except (asyncio.TimeoutError, TimeoutError):
                    kind = value = None
                if kind is not None:
                    yield (kind, failure(value, self.grammar_param)) if kind == "error" else (kind, value)
                    if kind != "text":
                        return
                if self.state.service.quitting:
                    quit_seen = quit_seen or time.monotonic()
                    if time.monotonic() - quit_seen >= QUIT_GRACE_SECONDS:
                        yield "done", Outcome("cancelled")
                        return
                if client_gone is not None and time.monotonic() - checked >= DISCONNECT_POLL_SECONDS:
                    checked = time.monotonic()  # text keeps coming: check anyway
                    if await client_gone():
                        yield "gone", None
                        return
        finally:
            self.cancel()  # a no-op once it ended

    def cancel(self) -> None:
        self.cancelled.set()
