"""What the chat UI does, without the UI: answers, trimming, speed readout, comparison, calibration.

The Gradio layer (``app/ui.py``) only wires these to components, so all of it is testable
without a browser.
"""

from __future__ import annotations

import html
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import NoReturn

from app.model_catalog import remember
from app.model_queue import ModelQueue, Queued
from app.readout import SPEED_DEFINITION, AnswerSpeed, compare_verdict, penalties_line
from app.startup import Progress, Startup, failure_line
from app.structured import FieldError, checked_schema_grammar
from app.training_job import TrainingJob
from ppd_core.engine import (Engine, GenerationEvent, GenerationResult, GenerationStats, LiveEstimate, ModelSnapshot,
                             SamplingParams, StepPrices, text_stream)
from ppd_core.errors import PpdError

DEFAULT_SPEC = "default"  # the embedded model: what a failed switch falls back to when the previous model fails too
log = logging.getLogger(__name__)


@dataclass
class ChatSettings:
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    ppd: bool = True
    acceptance: str = "lossless"  # or "typical" (faster, not distribution-preserving)
    highlight: bool = False  # mark the tokens that came from accepted guesses
    top_k: int = 0  # 0: off
    repeat_penalty: float = 1.0  # llama.cpp's repetition penalties (``PENALTY_FIELDS``): off at these values
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    schema: str = ""  # the page's JSON schema box: empty for free text

    def __post_init__(self):  # values straight from the UI's widgets
        self.system_prompt = self.system_prompt or ""
        self.temperature, self.top_p, self.top_k = float(self.temperature), float(self.top_p), int(self.top_k or 0)
        self.max_new_tokens, self.ppd, self.highlight = int(self.max_new_tokens), bool(self.ppd), bool(self.highlight)
        for name in PENALTY_FIELDS:  # a cleared number box sends None: the field's default (off)
            if getattr(self, name) is None:
                setattr(self, name, type(self).__dataclass_fields__[name].default)
        self.repeat_penalty, self.repeat_last_n = float(self.repeat_penalty), int(self.repeat_last_n)
        self.presence_penalty, self.frequency_penalty = float(self.presence_penalty), float(self.frequency_penalty)
        self.schema = self.schema or ""

    def penalties(self) -> dict:
        return {name: getattr(self, name) for name in PENALTY_FIELDS}

    def grammar(self) -> str | None:
        """The GBNF the answers follow (the API's conversion, ``app/structured.py``), None for free text; a PpdError
        (one line) for text that is not JSON or a schema the converter refuses."""
        return schema_box_grammar(self.schema)

    @property
    def constrained(self) -> bool:
        """The answers follow a JSON schema (``grammar`` refuses a box it cannot use before anything runs)."""
        return bool(self.schema.strip())

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, acceptance=self.acceptance,
                              **self.penalties())


PENALTY_FIELDS = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")
SCHEMA_BOX = "the JSON schema box"


def schema_box_grammar(text: str) -> str | None:
    """``ChatSettings.grammar`` of the box's ``text``."""
    if not text.strip():
        return None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as error:
        raise FieldError(f"{SCHEMA_BOX} does not hold JSON: {error}", SCHEMA_BOX) from None
    try:
        return checked_schema_grammar(schema, SCHEMA_BOX)
    except FieldError as error:
        raise FieldError(f"{SCHEMA_BOX}: {error}", SCHEMA_BOX) from None


@dataclass
class AnswerUpdate:
    text: str  # the answer so far
    marked: str  # the same as HTML, accepted guesses marked, when asked (else "")
    readout: str  # Markdown speed line
    note: str  # e.g. that early turns were trimmed
    stats: GenerationStats | None  # None while waiting for the model
    stop_reason: str | None = None
    queued: int = 0  # calls ahead of this one while it waits for the model


@dataclass
class Comparison:
    vanilla_text: str
    ppd_text: str
    vanilla_stats: GenerationStats
    ppd_stats: GenerationStats
    identical: bool
    first: str  # "plain" or "PPD": the order alternates between comparisons
    bitwise: bool = True  # the path promises identical greedy output (else only up to near-ties)

    @property
    def speedup(self) -> float:
        return self.ppd_stats.tok_s / self.vanilla_stats.tok_s if self.vanilla_stats.tok_s else 0.0

    def verdict(self) -> str:
        """In words, the figures behind a toggle: "PPD was 1.42x faster on this answer; identical text."."""
        if self.bitwise:
            differs = "on this path they should be identical: please report this"
        else:
            differs = ("on this path tree steps round differently from single steps, and a near-tie between two tokens "
                       "resolved the other way")
        second = "PPD" if self.first == "plain" else "plain"
        details = (f"Times: PPD {self.ppd_stats.seconds:.2f} s, plain {self.vanilla_stats.seconds:.2f} s "
                   f"({SPEED_DEFINITION}, greedy, no cache reuse on either side; {self.first} ran first, {second} "
                   f"second: the order alternates between comparisons); {self.ppd_stats.mean_accepted:.2f} tokens per "
                   f"PPD step.")
        return compare_verdict(self.speedup, self.ppd_stats.tok_s, self.vanilla_stats.tok_s, self.identical, differs,
                               details)


BACKEND_NAMES = {"llamacpp": "llama.cpp", "torch": "torch"}
PROMPT_MARK = '<mark style="background-color: #ffe066">'  # guesses from the prompt tokens: yellow
LOOKUP_MARK = '<mark style="background-color: #bfe3ff">'  # guesses copied from the conversation: blue
GRAMMAR_MARK = '<mark style="background-color: #c8f0c0">'  # text the grammar forced: green
MARKS = {"prompt tokens": PROMPT_MARK, "lookup": LOOKUP_MARK, "grammar": GRAMMAR_MARK}


def step_sources(from_guesses: int, from_lookup: int = 0, from_grammar: int = 0) -> list[str]:
    """Where each of a step's accepted guesses came from, in path order: prompt tokens, lookup, grammar."""
    prompt = from_guesses - from_lookup - from_grammar
    return ["prompt tokens"] * prompt + ["lookup"] * from_lookup + ["grammar"] * from_grammar


class Highlighter:
    """Builds the answer text with the tokens that came from accepted guesses marked by source, token by token."""

    def __init__(self, tokenizer):
        self.text = text_stream(tokenizer)
        self.pieces: list[tuple[str, str | None]] = []  # (text, a ``MARKS`` source or None: the model's own)
        self.html = ""

    def add(self, tokens: Sequence[int], from_guesses: int, from_lookup: int = 0, from_grammar: int = 0) -> None:
        """A step's tokens: its accepted guesses first (``step_sources``' order), then the model's own."""
        sources = step_sources(from_guesses, from_lookup, from_grammar)
        for index, token in enumerate(tokens):
            piece = self.text.add(token)
            source = sources[index] if index < len(sources) else None
            self.pieces.append((piece, source))
            opening = MARKS.get(source)
            self.html += f"{opening}{html.escape(piece)}</mark>" if opening and piece.strip() else piece


class ChatService:
    """The one door to the engine for every browser tab, Compare, Calibrate and the HTTP API (``app/api.py``).

    Every model call waits its turn in ``queue`` (first come, first served; beyond its bound a call is
    refused with ``Busy``), gives up its place when its ``stop()`` turns true while waiting, ends within
    one decoding step of ``stop()`` while answering, and always closes the engine's stream and frees the
    model, whatever was raised.
    """

    def __init__(self, engine: Engine | None, calibration_options: dict | None = None, max_waiting: int = 8,
                 spec: str = "default", loader: Callable[[str, Progress], Engine] | None = None,
                 train_options: list[str] | None = None, calibrate_in_background: bool = False):
        self.startup = Startup(ready=engine is not None)  # ``ppd chat`` serves the page while the model loads
        self._engine = engine
        self._latest = engine  # the model loaded last: still the one replaced while a switch loads the next
        self.spec = spec  # the loaded model, as --model names it
        self.loader = loader  # loads a model by its --model name: what switching models calls
        self.switch_note = ""  # why the last switch did not happen, for the page
        self.switching = False  # a switch is waiting for the model or loading (one at a time: ``_switch_lock``)
        self._switching_to: str | None = None  # the spec it loads
        self._switch_lock = threading.Lock()
        self._switch_done = threading.Condition(self._switch_lock)
        self.train_options = train_options or []  # more `ppd train` arguments for the app's trainings (tests: tiny)
        self._jobs: dict[str, TrainingJob] = {}
        self.calibration_options = calibration_options or {}  # e.g. fewer prompts for a quick check
        self.last_comparison: Comparison | None = None
        self._comparisons = 0  # alternates which mode a comparison runs first
        self.queue = ModelQueue(max_waiting, stamp=lambda: self._latest)  # each ticket: the model loaded as it joined
        self.calibrates_in_background = calibrate_in_background  # a model without a profile: calibrate beside answers
        self.background: str | None = None  # what runs in the background (a first launch's calibration), for the page
        self._background_thread: threading.Thread | None = None
        self._stopping = threading.Event()  # set by ``shutdown``

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def engine(self) -> Engine:
        """The engine; ``NotReady`` (a PpdError: one line on the page, 503 on the API) while it loads."""
        if self._engine is None:
            raise self.startup.refusal()
        return self._engine

    def snapshot(self) -> ModelSnapshot:
        """What the page and the API show of the loaded model, now (``NotReady`` while it loads)."""
        return self.engine.snapshot()

    def attach(self, engine: Engine) -> None:
        """The model (``spec``) is loaded: answers may start (and, where asked, its calibration runs beside them)."""
        calibrates = self.calibrates_in_background and needs_calibration(engine)
        if calibrates:  # said before the page can see the model, so its timer keeps ticking until the calibration ends
            self.background = BACKGROUND_CALIBRATION.format(progress="")
        self._engine = self._latest = engine
        self.startup.ready = True
        remember(self.spec)
        if calibrates:
            self.calibrate_in_background()

    def calibrate_in_background(self) -> threading.Thread | None:
        """A model with no profile for this device: answers start at once, decoding plainly, while its calibration
        runs between them (between two latency probes it gives the model to any answer waiting); the page says so
        until it is done. None where there is nothing to calibrate."""
        engine = self._engine
        if engine is None or not needs_calibration(engine):
            return None
        self.background = BACKGROUND_CALIBRATION.format(progress="")
        thread = self._background_thread = threading.Thread(
            target=self._calibrate_beside_answers, args=(engine,), daemon=True, name="ppd-background-calibration")
        thread.start()
        return thread

    def _calibrate_beside_answers(self, engine: Engine) -> None:
        # a first answer is usually asked for as soon as the page opens: let it go first, then calibrate
        if not self._idle_for(IDLE_BEFORE_CALIBRATION, engine):
            self.background = None
            return
        ticket = [self.queue.hold()]

        def between() -> bool:
            """Before each timed step: an answer waiting goes first (True: the timing starts over)."""
            lent = False
            if self.queue.waiting:
                self.queue.leave(ticket[0])
                ticket[0] = self.queue.hold()
                lent = True
            if self._engine is not engine or self._stopping.is_set():  # another model, or ppd is quitting
                raise _Abandoned
            return lent

        def progress(phase: str, done: int, total: int) -> None:
            between()
            self.background = BACKGROUND_CALIBRATION.format(progress=f" ({phase} {done}/{total})" if total else "")

        try:
            engine.calibrate(progress, between=between, **self.calibration_options)
            self.last_comparison = None  # measured with the previous tree
            self.background = None
        except _Abandoned:
            pass  # the switch cleared the line
        except BaseException as error:  # noqa: BLE001 - any failure (an interruption too): one line on the page;
            # answers go on decoding plainly
            self.background = f"The calibration failed ({failure_line(error)}); answers decode plainly."
        finally:
            self.queue.leave(ticket[0])

    def _idle_for(self, seconds: float, engine: Engine) -> bool:
        """Wait until the model has had nothing to do for ``seconds``; False if ppd quits or the model changes first."""
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < seconds:
            if self._stopping.wait(0.1) or self._engine is not engine:
                return False
            if self.queue.busy or self.queue.waiting:
                quiet_since = time.monotonic()
        return True

    def shutdown(self, timeout: float = 30.0) -> None:
        """ppd is quitting, within ``timeout`` seconds: answers end at their next step (streams get their last
        chunk), trainings stop where they are (resumable, asking nothing), a background calibration stops at its next
        step, then the model is freed (llama.cpp must not be running when the interpreter exits). What has not stopped
        by then is left to the process's exit (``app.cli.entry`` ends it at once)."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        for job in list(self._jobs.values()):
            job.terminate()
        for job in list(self._jobs.values()):
            job.wait(max(deadline - time.monotonic(), 0.0))
        if self._background_thread is not None:
            self._background_thread.join(max(deadline - time.monotonic(), 0.0))
        ticket = self.queue.hold(stop=lambda: time.monotonic() > deadline)
        if ticket is None:
            log.warning("quitting while the model is still busy")
            return
        try:
            if self._engine is not None:
                self._engine.close()
        finally:
            self.queue.leave(ticket)

    def switch(self, spec: str) -> None:
        """Load ``spec`` in place of the loaded model, freeing that one's memory first (one model in memory); runs on
        the caller's thread once the answer in progress ends. One switch at a time: another model asked for meanwhile
        is refused in one line (``SwitchBusy``), the same one waits for the switch under way. A model that fails to
        load, whatever it raises: the previous one loads again (else the default), and ``switch_note`` says why, as
        does the ``SwitchFailed`` raised."""
        if self._reserve(spec):
            self._run_switch(spec)
        else:
            with self._switch_done:
                self._switch_done.wait_for(lambda: not self.switching)

    def start_switch(self, spec: str) -> threading.Thread | None:
        """``switch`` on a thread of its own (the page's; ``switching`` is set on return); None where the same switch
        is already under way (the page follows that one); ``SwitchBusy`` where another is."""
        if not self._reserve(spec):
            return None
        return self._switch_thread(spec)

    def apply_training(self, job: TrainingJob) -> bool:
        """Load a finished training's prompt tokens (the loaded model again: the engine finds them) exactly once,
        whichever page asks first; False where it was applied already or another switch is under way."""
        with self._switch_lock:
            if job.applied or self.switching or self.loader is None:
                return False
            job.applied = True
            self.switching, self._switching_to = True, self.spec
        self._switch_thread(self.spec)
        return True

    def _reserve(self, spec: str) -> bool:
        """Take the one switch for ``spec``: True; False where a switch to ``spec`` is under way; SwitchBusy (one
        line) where a switch to another model is."""
        if self.loader is None:
            raise PpdError("this server cannot switch models")
        with self._switch_lock:
            if self.switching:
                if spec == self._switching_to:
                    return False
                raise SwitchBusy(f"{self._switching_to} is loading: load {spec} once it is ready")
            self.switching, self._switching_to = True, spec
        return True

    def _switch_thread(self, spec: str) -> threading.Thread:
        def run():
            try:
                self._run_switch(spec)
            except PpdError as error:  # a model is back (or none could load): the page shows why
                log.warning("%s", error)
            except BaseException:  # noqa: BLE001 - a bug past the load (the page goes on): its traceback, logged
                log.exception("switching to %s failed", spec)

        thread = threading.Thread(target=run, name="ppd-switch-model", daemon=True)
        thread.start()
        return thread

    def _run_switch(self, spec: str) -> None:
        """The reserved switch to ``spec``; the reservation ends with it, whatever happens."""
        try:
            self._switch(spec)
        finally:
            with self._switch_done:
                self.switching, self._switching_to = False, None
                self._switch_done.notify_all()

    def _switch(self, spec: str) -> None:
        with self.turn():
            previous, old = self.spec, self._engine
            self._engine, self.startup, self.switch_note, self.background = None, Startup(), "", None
            try:
                if old is not None:
                    old.close()
                engine = self.startup.run(lambda progress: self.loader(spec, progress))
            except BaseException as error:  # noqa: BLE001 - whatever it was (MemoryError, an interruption too)
                self._fall_back(spec, previous, error)
            self.spec = spec
            self.attach(engine)

    def _fall_back(self, spec: str, previous: str, error: BaseException) -> NoReturn:
        """``spec`` failed with ``error``: ``previous`` loads again, else the default model; SwitchFailed says which.
        Where none loads, the startup line says so too (the page and the API answer with it) and nothing is loaded."""
        failures = [(spec, failure_line(error))]
        for fallback in dict.fromkeys([previous, DEFAULT_SPEC]):
            self.startup = Startup()
            try:
                engine = self.startup.run(lambda progress: self.loader(fallback, progress))  # noqa: B023 - called here
            except BaseException as again:  # noqa: BLE001
                failures.append((fallback, failure_line(again)))
                continue
            note = f"Could not load {spec}: {failures[0][1]}."
            if fallback == previous:
                note += f" Back on {previous}."
            else:
                note += f" {previous} failed to load again ({failures[-1][1]}): back on the default model."
            self.switch_note, self.spec = note, fallback
            self.attach(engine)
            raise SwitchFailed(note) from error
        self.startup.error = ", nor ".join(f"{name} ({line})" for name, line in failures) + ". Pick a model to load."
        self.switch_note = self.startup.line()
        raise SwitchFailed(self.switch_note) from error

    def training(self) -> TrainingJob:
        """The training of PPD tokens for the loaded model (one per model, started or not)."""
        name = self.engine.loaded.name
        if name not in self._jobs:
            self._jobs[name] = TrainingJob(self.spec, name, self.train_options)
        return self._jobs[name]

    def decode(self, ids: list[int], mode: str, max_new_tokens: int, sampling: SamplingParams, *, reuse_cache: bool,
               stop: Callable[[], bool] | None = None, ticket: int | None = None,
               logprobs: int | None = None, made_for: Engine | None = None, grammar: str | None = None,
               remake: Callable[[Engine], list[int]] | None = None) -> Iterator[Queued | GenerationEvent]:
        """``Queued`` while waiting, then the engine's events; ends right after the event during which ``stop()``
        turned true. Close it (``contextlib.closing``) when leaving it early.

        ``ticket``: a place in line taken beforehand (``queue.join``); else one is taken here (``Busy`` if full).
        ``logprobs``: the engine's (each step's tokens' log-probabilities and that many alternatives).

        Ids mean something only to the model that made them, and a switch waiting ahead in line may replace it before
        this call's turn. ``made_for``: the engine that made ``ids`` (default: the model loaded when the ticket was
        taken; make the ids just before). Where another one holds the model by this call's turn, ``remake(engine)``
        makes them again with it (it may refuse them: a PpdError, one line); without ``remake`` the call is refused in
        one line.
        """
        ticket = self.queue.join() if ticket is None else ticket
        made_for = made_for if made_for is not None else self.queue.stamp_of(ticket)
        try:
            if not (yield from self.queue.wait(ticket, stop)):
                return  # stopped while waiting
            engine = self.engine  # no switch until this call's turn ends
            if made_for is not None and made_for is not engine:
                if remake is None:
                    raise ModelChanged(f"the model changed while this request waited for it (now {engine.loaded.name}): "
                                       "ask again")
                ids = remake(engine)
            stream = engine.stream(ids, mode, max_new_tokens, reuse_cache=reuse_cache, sampling=sampling,
                                   logprobs=logprobs, grammar=grammar)
            try:
                for event in stream:
                    yield event
                    if (stop is not None and stop()) or self._stopping.is_set():  # the user, or ppd quitting
                        return
            finally:
                stream.close()  # between steps: the engine is left ready for the next call
        finally:
            self.queue.leave(ticket)

    @contextmanager
    def turn(self):
        """Hold the model for a call that does not stream (Compare, Calibrate); ``Busy`` if the line is full."""
        ticket = self.queue.hold()
        try:
            yield
        finally:
            self.queue.leave(ticket)

    def prepare(self, messages: list[dict], settings: ChatSettings, engine: Engine | None = None) -> tuple[list[int], str]:
        """Chat-template ids for the conversation, dropping the oldest turns until prompt + answer fit; made by
        ``engine`` (default: the one loaded now), the only one that may decode them."""
        if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            raise PpdError("the message is empty")
        engine = engine or self.engine
        system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
        limit = engine.max_context
        kept = list(messages)
        ids = engine.chat_ids(system + kept)
        while len(ids) + settings.max_new_tokens > limit and len(kept) > 1:
            kept = kept[2:] if len(kept) > 2 else kept[1:]  # a user turn and its answer
            ids = engine.chat_ids(system + kept)
        if len(ids) >= limit:
            raise PpdError(f"the message is too long: {len(ids)} tokens, but the model's context holds {limit}")
        dropped = len(messages) - len(kept)
        note = f"Trimmed the {dropped} earliest messages to fit the model's {limit}-token context." if dropped else ""
        return ids, note

    def answer(self, messages: list[dict], settings: ChatSettings, stop: Callable[[], bool] | None = None) -> Iterator[AnswerUpdate]:
        """Stream the answer to the last user message; ends within one decoding step of ``stop()`` turning true.

        Refused (``PpdError``) before anything runs when the conversation does not fit (for the model loaded now), the
        JSON schema box holds what cannot be used, or the line is full; a model switched in before its turn makes the
        ids again (and may refuse them then).
        """
        engine = self.engine
        grammar = self.checked_grammar(settings, engine)
        ids, note = self.prepare(messages, settings, engine)
        self.queue.check_room()
        return self._answer(ids, engine, messages, settings, note, stop, grammar)

    @staticmethod
    def checked_grammar(settings: ChatSettings, engine: Engine) -> str | None:
        """The settings' grammar (``ChatSettings.grammar``), checked as the API checks one: one line where ``engine``
        cannot follow it."""
        grammar = settings.grammar()
        if grammar is not None:
            engine.check_grammar(grammar)
        return grammar

    def _answer(self, ids: list[int], engine: Engine, messages: list[dict], settings: ChatSettings, note: str,
                stop: Callable[[], bool] | None, grammar: str | None = None) -> Iterator[AnswerUpdate]:
        mode = "ppd" if settings.ppd else "vanilla"
        event: GenerationEvent | None = None
        highlighter: Highlighter | None = None
        estimate: LiveEstimate | None = None
        notes = [note]  # the trimming note of the ids that are decoded

        def remake(now: Engine) -> list[int]:  # another model was switched in before this answer's turn
            remade, notes[0] = self.prepare(messages, settings, now)
            return remade

        events = self.decode(ids, mode, int(settings.max_new_tokens), settings.sampling(), reuse_cache=True, stop=stop,
                             made_for=engine, remake=remake, grammar=grammar)
        with closing(events):
            for event in events:
                if isinstance(event, Queued):
                    yield AnswerUpdate("", "", "", f"Waiting for the model: {_answers(event.ahead)} ahead.", None,
                                       queued=event.ahead)
                    continue
                note, step = notes[0], event.step
                if event.stats.new_tokens == len(step.tokens):  # the first event: the model that answers, read in its turn
                    prices = StepPrices.of(self.engine.profile) if settings.ppd else None
                    estimate = LiveEstimate(prices) if prices is not None else None
                    highlighter = Highlighter(self.engine.tokenizer) if settings.highlight else None
                if estimate is not None:
                    estimate.add(step)
                if highlighter is not None:
                    highlighter.add(step.tokens, step.from_guesses, step.from_lookup, step.from_grammar)
                yield self._update(event, settings, note, highlighter, estimate, event.stop_reason)
        if event is None or isinstance(event, Queued):
            yield AnswerUpdate("", "", "", "Stopped before the answer began.", None, "stopped")
        elif event.stop_reason is None:  # stopped by the user
            yield self._update(event, settings, note, highlighter, estimate, "stopped")

    def _update(self, event: GenerationEvent, settings: ChatSettings, note: str, highlighter: Highlighter | None,
                estimate: LiveEstimate | None, stop_reason) -> AnswerUpdate:
        finished = stop_reason is not None
        notes = [note] if note else []
        if stop_reason == "context":
            notes.append("The answer stopped at the end of the model's context window.")
        if stop_reason == "stopped":
            notes.append("Stopped.")
        if settings.temperature > 0 and settings.acceptance == "typical" and settings.ppd:
            notes.append("Typical acceptance: faster, but does not follow the model's distribution exactly.")
        if settings.constrained:
            notes.append("The answer follows the JSON schema.")
        backend = self.engine.loaded.backend.name
        speed = AnswerSpeed(event.stats, finished, settings.ppd, estimate, BACKEND_NAMES.get(backend, backend),
                            penalties_line(settings.sampling()), settings.constrained)
        return AnswerUpdate(
            text=event.text,
            marked=highlighter.html if highlighter is not None else "",
            readout=speed.markdown(),
            note=" ".join(notes),
            stats=event.stats,
            stop_reason=stop_reason,
        )

    def compare(self, messages: list[dict], settings: ChatSettings,
                progress: Callable[[str, int, int], None] | None = None) -> Comparison:
        """The last user message answered greedily both ways (with the settings' penalties and JSON schema), timed the
        same way and with no cache reuse; ``progress(mode, tokens, max_new_tokens)`` after each step ("plain decoding"
        or "PPD").

        Which mode runs first alternates between comparisons, so neither always gets the warmer caches.
        """
        engine = self.engine
        grammar = self.checked_grammar(settings, engine)
        ids, _ = self.prepare(messages, settings, engine)  # refused before waiting where it does not fit
        order = ("vanilla", "ppd") if self._comparisons % 2 == 0 else ("ppd", "vanilla")
        self._comparisons += 1
        with self.turn():
            if self.engine is not engine:  # another model was switched in before this turn: its own ids
                engine = self.engine
                grammar = self.checked_grammar(settings, engine)
                ids, _ = self.prepare(messages, settings, engine)
            greedy, max_new = SamplingParams(**settings.penalties()), int(settings.max_new_tokens)

            def run(mode: str) -> GenerationResult:
                def told(tokens: int) -> None:
                    if progress is not None:
                        progress(COMPARED[mode], tokens, max_new)
                return generated(engine.stream(ids, mode, max_new, sampling=greedy, grammar=grammar), told)

            results = {mode: run(mode) for mode in order}
        plain, ppd = results["vanilla"], results["ppd"]
        first = "plain" if order[0] == "vanilla" else "PPD"
        self.last_comparison = Comparison(plain.text, ppd.text, plain.stats, ppd.stats, plain.tokens == ppd.tokens, first,
                                          engine.loaded.backend.bitwise)
        return self.last_comparison

    def calibrate(self, progress: Callable[[str, int, int], None] | None = None):
        with self.turn():
            profile = self.engine.calibrate(progress, **self.calibration_options)
        self.last_comparison = None  # measured with the previous tree
        return profile


COMPARED = {"vanilla": "plain decoding", "ppd": "PPD"}


def generated(events: Iterator[GenerationEvent], step: Callable[[int], object]) -> GenerationResult:
    """``Engine.generate`` of the stream ``events``, calling ``step(tokens so far)`` after each event."""
    steps, event = [], None
    for event in events:
        steps.append(event.step)
        step(event.stats.new_tokens)
    return GenerationResult(event.text, event.tokens, event.stats, event.stop_reason, steps)


def needs_calibration(engine: Engine) -> bool:
    """No profile for this device and no tree asked for (``--tree auto``): it decodes plainly until calibrated."""
    return (engine.profile is None and not engine.plain_only and engine.tree_budget is None
            and engine.family.name == "vanilla")  # else a static tree was asked for


IDLE_BEFORE_CALIBRATION = 2.0  # seconds with no answer asked for before a background calibration starts
BACKGROUND_CALIBRATION = ("Calibrating this device in the background{progress}: answers decode plainly until it is "
                          "done.")


class ModelChanged(PpdError):
    """Ids made for a model another one replaced before their turn, with no way to make them again; one line."""


class SwitchBusy(PpdError):
    """A switch was asked for while another model loads; one line."""


class SwitchFailed(PpdError):
    """A model failed to load; the line says which model is loaded instead (or that none is)."""


class _Abandoned(Exception):
    """The model being calibrated in the background was replaced."""


def _answers(count: int) -> str:
    return f"{count} answer{'s' if count != 1 else ''}"
