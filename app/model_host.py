"""The model host: the one loaded model every browser tab, the chat's Compare and Calibrate and the HTTP API share.

It holds the engine, the line for it (``ModelQueue``), switching to another model with its fallback, the background
calibration of a model with no profile, and the trainings of PPD tokens; the chat (``app/chat.py``) answers through it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import NoReturn, cast

from app.background_calibration import Abandoned, BackgroundCalibration
from app.model_catalog import DEFAULT_SPEC, remember
from app.model_queue import ANSWER, CALIBRATION, QUITTING, SWITCH, ModelQueue, Queued
from app.startup import Progress, Startup, failure_line
from app.training_job import TrainingJob
from ppd_core import AnswerRequest, Engine, GenerationEvent, ModelSnapshot
from ppd_core.engine_calibration import calibrate_engine
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)


class ModelHost:
    """The one door to the engine for every browser tab (answers and Compare through ``Chat``, Calibrate) and the HTTP
    API (``app/api/``).

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
        self.calibrations = 0  # calibrations finished: a comparison measured before one is stale
        self.queue = ModelQueue(max_waiting, stamp=lambda: self._latest)  # each ticket: the model loaded as it joined
        self.calibrates_in_background = calibrate_in_background  # a model without a profile: calibrate beside answers
        self._calibration: BackgroundCalibration | None = None  # a first launch's, while it runs
        self._background_note: str | None = None  # why the last one failed
        self._background_thread: threading.Thread | None = None
        self._stopping = threading.Event()  # set by ``shutdown``
        self.last_answer: tuple[Engine, object] | None = None  # (engine, its last answer's stats): a measured speed

    @property
    def quitting(self) -> bool:
        """Whether ``shutdown`` has begun: answers end now, within its time."""
        return self._stopping.is_set()

    @property
    def ready(self) -> bool:
        return self._engine is not None

    @property
    def background(self) -> str | None:
        """What runs in the background (a first launch's calibration, with its progress), for the page; or why it
        failed; None when nothing does."""
        job = self._calibration
        return job.line() if job is not None else self._background_note

    @property
    def calibration_paused_for(self) -> int:
        """Calls the background calibration running now gave the model to (0 when none runs)."""
        job = self._calibration
        return job.paused_for if job is not None else 0

    @property
    def engine(self) -> Engine:
        """The engine; ``NotReady`` (a PpdError: one line on the page, 503 on the API) while it loads."""
        if self._engine is None:
            raise self.startup.refusal()
        return self._engine

    def forget_answers(self) -> None:
        """The user deleted saved answers: the loaded model's guess sources forget the answers they keep
        (``Engine.forget_answers``), at once, without waiting for the model's line; nothing while none is loaded."""
        engine = self._engine
        if engine is not None:
            engine.forget_answers()

    def snapshot(self) -> ModelSnapshot:
        """What the page and the API show of the loaded model, now (``NotReady`` while it loads)."""
        return self.engine.snapshot()

    def attach(self, engine: Engine) -> None:
        """The model (``spec``) is loaded: answers may start (and, where asked, its calibration runs beside them)."""
        calibrates = self.calibrates_in_background and needs_calibration(engine)
        if calibrates:  # said before the page can see the model, so its timer keeps ticking until the calibration ends
            self._calibration = self._background_job(engine)
        self._engine = self._latest = engine
        self.startup.ready = True
        remember(self.spec)
        if calibrates:
            self.calibrate_in_background()

    def calibrate_in_background(self) -> threading.Thread | None:
        """A model with no profile for this device: answers start at once, decoding plainly, while its calibration
        runs between them (``BackgroundCalibration``: at each of its pause points it gives the model to any call
        waiting); the page says so until it is done. None where there is nothing to calibrate."""
        engine = self._engine
        if engine is None or not needs_calibration(engine):
            return None
        if self._calibration is None or self._calibration.engine is not engine:
            self._calibration = self._background_job(engine)
        thread = self._background_thread = threading.Thread(
            target=self._calibrate_beside_answers, args=(self._calibration,), daemon=True,
            name="ppd-background-calibration")
        thread.start()
        return thread

    def _background_job(self, engine: Engine) -> BackgroundCalibration:
        self._background_note = None
        return BackgroundCalibration(engine, self.queue, lambda: self._engine, self._stopping, calibrate_engine,
                                     self.calibration_options, IDLE_BEFORE_CALIBRATION)

    def _calibrate_beside_answers(self, job: BackgroundCalibration) -> None:
        try:
            job.run()
            self.calibrations += 1  # comparisons were measured with the previous tree
        except Abandoned:
            pass  # the switch cleared the line, or ppd quits
        except BaseException as error:  # noqa: BLE001 - any failure (an interruption too): one line on the page;
            # answers go on decoding plainly
            self._background_note = f"The calibration failed ({failure_line(error)}); answers decode plainly."
        finally:
            if self._calibration is job:
                self._calibration = None

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
        ticket = self.queue.hold(stop=lambda: time.monotonic() > deadline, what=QUITTING)
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
        with self.turn(SWITCH):
            previous, old = self.spec, self._engine
            self._engine, self.startup, self.switch_note = None, Startup(), ""
            self._calibration = self._background_note = None
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

    def decode(self, request: AnswerRequest, *, stop: Callable[[], bool] | None = None, ticket: int | None = None,
               made_for: Engine | None = None, remake: Callable[[Engine], AnswerRequest] | None = None
               ) -> Generator[Queued | GenerationEvent, None, None]:
        """``Queued`` while waiting, then the engine's events answering ``request``; ends right after the event during
        which ``stop()`` turned true. Close it (``contextlib.closing``) when leaving it early.

        ``ticket``: a place in line taken beforehand (``queue.join``); else one is taken here (``Busy`` if full).

        A request means something only to the model that checked it (its ids, its grammar), and a switch waiting
        ahead in line may replace that model before this call's turn. ``made_for``: the engine that checked it
        (default: the model loaded when the ticket was taken; check it just before). Where another one holds the model
        by this call's turn, ``remake(engine)`` makes and checks it again with that one (it may refuse it: a PpdError,
        one line); without ``remake`` the call is refused in one line.
        """
        ticket = self.queue.join() if ticket is None else ticket
        made_for = made_for if made_for is not None else cast("Engine | None", self.queue.stamp_of(ticket))
        try:
            quitting = self._stopping.is_set
            if not (yield from self.queue.wait(ticket, lambda: (stop is not None and stop()) or quitting())):
                return  # stopped while waiting (the user, or ppd quitting: its answers must end before it does)
            engine = self.engine  # no switch until this call's turn ends
            if made_for is not None and made_for is not engine:
                if remake is None:
                    raise ModelChanged(f"the model changed while this request waited for it (now {engine.loaded.name}): "
                                       "ask again")
                request = remake(engine)
            stream = engine.answer(request)
            try:
                for event in stream:
                    self.last_answer = (engine, event.stats)
                    yield event
                    if (stop is not None and stop()) or self._stopping.is_set():  # the user, or ppd quitting
                        return
            finally:
                stream.close()  # between steps: the engine is left ready for the next call
        finally:
            self.queue.leave(ticket)

    @contextmanager
    def turn(self, what: str = ANSWER):
        """Hold the model for a call of kind ``what`` that does not stream (Compare, Calibrate, a switch); ``Busy`` if
        the line is full."""
        ticket = self.queue.hold(what=what)
        try:
            yield
        finally:
            self.queue.leave(ticket)

    def calibrate(self, progress: Callable[[str, int, int], None] | None = None):
        with self.turn(CALIBRATION):
            profile = calibrate_engine(self.engine, progress, **self.calibration_options)
        self.calibrations += 1  # comparisons were measured with the previous tree
        return profile



def needs_calibration(engine: Engine) -> bool:
    """No profile for this device and no tree asked for (``--tree auto``): it decodes plainly until calibrated."""
    return engine.plan.awaiting_calibration  # else a static tree or a budget was asked for


IDLE_BEFORE_CALIBRATION = 2.0  # seconds with no answer asked for before a background calibration starts


class ModelChanged(PpdError):
    """Ids made for a model another one replaced before their turn, with no way to make them again; one line."""


class SwitchBusy(PpdError):
    """A switch was asked for while another model loads; one line."""


class SwitchFailed(PpdError):
    """A model failed to load; the line says which model is loaded instead (or that none is)."""


