"""The chat, without the page: a conversation trimmed to the model's context, answered (streamed, its accepted
guesses highlighted, its speed read out) or compared with plain decoding, through the model host's line.

The Gradio layer (``app/ui.py``) only wires these to components, so all of it is testable without a browser.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, replace

from app.chat_settings import ChatSettings
from app.highlight import Highlighter
from app.history import Unfinished
from app.model_host import ModelHost
from app.model_queue import COMPARISON, Queued
from app.readout import SPEED_DEFINITION, AnswerSpeed, compare_verdict, penalties_line
from ppd_core import (AnswerRequest, Engine, GenerationEvent, GenerationResult, GenerationStats, Mode,
                      PromptTooLongError, SamplingParams)
from ppd_core.calibration.prices import LiveEstimate, StepPrices
from ppd_core.errors import PpdError



@dataclass
class AnswerUpdate:
    text: str  # the answer so far
    marked: str  # the same as HTML, accepted guesses marked, when asked (else "")
    readout: str  # Markdown speed line
    note: str  # e.g. that early turns were trimmed
    stats: GenerationStats | None  # None while waiting for the model
    stop_reason: str | None = None
    queued: int = 0  # calls ahead of this one while it waits for the model
    model: str = ""  # the name of the model answering
    unfinished: Unfinished | None = None  # on the last update of an answer that ended at the length limit


Make = Callable[[Engine], tuple[AnswerRequest, str]]  # the request as a model makes and checks it, and the trimming note


@dataclass
class Comparison:
    plain_text: str
    ppd_text: str
    plain_stats: GenerationStats
    ppd_stats: GenerationStats
    identical: bool
    first: str  # "plain" or "PPD": the order alternates between comparisons
    bitwise: bool = True  # the path promises identical greedy output (else only up to near-ties)

    @property
    def speedup(self) -> float:
        return self.ppd_stats.tok_s / self.plain_stats.tok_s if self.plain_stats.tok_s else 0.0

    def verdict(self) -> str:
        """In words, the figures behind a toggle: "PPD was 1.42x faster on this answer; identical text."."""
        if self.bitwise:
            differs = "on this path they should be identical: please report this"
        else:
            differs = ("on this path tree steps round differently from single steps, and a near-tie between two tokens "
                       "resolved the other way")
        second = "PPD" if self.first == "plain" else "plain"
        details = (f"Times: PPD {self.ppd_stats.seconds:.2f} s, plain {self.plain_stats.seconds:.2f} s "
                   f"({SPEED_DEFINITION}, greedy, no cache reuse on either side; {self.first} ran first, {second} "
                   f"second: the order alternates between comparisons); {self.ppd_stats.mean_accepted:.2f} tokens per "
                   f"PPD step.")
        return compare_verdict(self.speedup, self.ppd_stats.tok_s, self.plain_stats.tok_s, self.identical, differs,
                               details)


BACKEND_NAMES = {"llamacpp": "llama.cpp", "torch": "torch"}


@dataclass
class Reading:
    """One answer's running readings, made at its first step."""

    estimate: LiveEstimate | None  # the live speed estimate (PPD on)
    highlighter: Highlighter | None  # its accepted guesses marked (when asked)
    backend: str  # what decodes, as the readout names it
    model: str = ""  # the model's name

    def add(self, step) -> None:
        if self.estimate is not None:
            self.estimate.add(step)
        if self.highlighter is not None:
            self.highlighter.add(step.tokens, step.sources)


class Chat:
    """Answers and comparisons for every page, each call waiting its turn in ``host``'s line for the model."""

    def __init__(self, host: ModelHost):
        self.host = host
        self._comparisons = 0  # alternates which mode a comparison runs first
        self._last: tuple[Comparison, int] | None = None  # the last comparison, with the host's calibrations then

    @property
    def last_comparison(self) -> Comparison | None:
        """The last comparison; None once a calibration has finished since (it was measured with the previous tree)."""
        if self._last is None or self._last[1] != self.host.calibrations:
            return None
        return self._last[0]

    def prepare(self, messages: list[dict], settings: ChatSettings, engine: Engine | None = None,
                mode: Mode | None = None, sampling: SamplingParams | None = None) -> tuple[AnswerRequest, str]:
        """The answer's request, checked by ``engine`` (default: the one loaded now, the only one that may answer it):
        the conversation in the chat template, dropping the oldest turns until prompt + answer fit, with the
        settings' limit, sampling (or ``sampling``), mode (or ``mode``) and JSON schema; and the trimming note."""
        engine = engine or self.host.engine
        ids, note = self.trimmed(messages, settings, engine)
        return self.checked(ids, settings, engine, mode, sampling), note

    @staticmethod
    def trimmed(messages: list[dict], settings: ChatSettings, engine: Engine) -> tuple[list[int], str]:
        """The conversation's ids in ``engine``'s chat template, the oldest turns dropped until prompt + answer fit,
        and the note saying so (not checked yet: ``checked``)."""
        if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            raise PpdError("the message is empty")
        system = [{"role": "system", "content": settings.system_prompt}] if settings.system_prompt.strip() else []
        limit = engine.max_context
        kept = list(messages)
        ids = engine.chat_ids(system + kept)
        while len(ids) + settings.max_new_tokens > limit and len(kept) > 1:
            kept = kept[2:] if len(kept) > 2 else kept[1:]  # a user turn and its answer
            ids = engine.chat_ids(system + kept)
        dropped = len(messages) - len(kept)
        return ids, f"Trimmed the {dropped} earliest messages to fit the model's {limit}-token context." if dropped else ""

    @staticmethod
    def checked(ids: list[int], settings: ChatSettings, engine: Engine, mode: Mode | None = None,
                sampling: SamplingParams | None = None) -> AnswerRequest:
        """``ids`` answered with the settings, checked by ``engine`` (``Engine.check``, once): a conversation too long
        for the context, or a JSON schema the model cannot follow, is refused in one line."""
        try:
            return engine.check(ids, int(settings.max_new_tokens), mode=mode or ("ppd" if settings.ppd else "plain"),
                                sampling=sampling or settings.sampling(), grammar=settings.grammar(), chat=True,
                                reuse_cache=True)
        except PromptTooLongError as error:
            raise PpdError(f"the message is too long: {error.prompt_tokens} tokens, but the model's context holds "
                           f"{error.context}") from None

    def answer(self, messages: list[dict], settings: ChatSettings, stop: Callable[[], bool] | None = None) -> Iterator[AnswerUpdate]:
        """Stream the answer to the last user message; ends within one decoding step of ``stop()`` turning true.

        Refused (``PpdError``) before anything runs when the conversation does not fit (for the model loaded now), the
        JSON schema box holds what cannot be used, or the line is full; a model switched in before its turn makes the
        request again (and may refuse it then).
        """
        engine = self.host.engine
        request, note = self.prepare(messages, settings, engine)
        self.host.queue.check_room()
        return self._answer(request, engine, lambda now: self.prepare(messages, settings, now), settings, note, stop)

    def resume(self, messages: list[dict], settings: ChatSettings, stop: Callable[[], bool] | None = None,
               known: Unfinished | None = None) -> Iterator[AnswerUpdate]:
        """Continue the last message, an answer cut at the length limit, where it stopped (Continue): the model's
        prompt is the conversation with that partial answer, not a new turn, so a greedy answer goes on as it would
        have with a larger limit. ``known``: the answer as last decoded (its ids used where its model is still loaded
        and it is this conversation's answer); else the partial answer's text is encoded. The updates' text is the
        whole answer. Refused (``PpdError``) as ``answer`` is."""
        if len(messages) < 2 or messages[-1]["role"] != "assistant":
            raise PpdError("there is no answer to continue")
        partial = messages[-1]["content"]

        def made(now: Engine) -> tuple[AnswerRequest, str]:
            ids, note = self.trimmed(messages[:-1], settings, now)
            if known is not None and known.engine is now and known.text == partial and known.ids[:len(ids)] == ids:
                ids = list(known.ids)  # the tokens it was decoded as: greedy goes on exactly
            else:
                ids += now.tokenizer.encode(partial, add_special_tokens=False)
            return self.checked(ids, settings, now), note  # checked once, as the request the answer goes on from

        engine = self.host.engine
        request, note = made(engine)
        self.host.queue.check_room()
        updates = self._answer(request, engine, made, settings, note, stop, partial)
        return (update if update.queued else replace(update, text=partial + update.text) for update in updates)

    def _answer(self, request: AnswerRequest, engine: Engine, make: Make, settings: ChatSettings, note: str,
                stop: Callable[[], bool] | None, before: str = "") -> Iterator[AnswerUpdate]:
        """The answer's updates; ``make`` makes the request again for another model switched in before its turn;
        ``before``: the answer's text before these ids' end (a continued answer)."""
        event: Queued | GenerationEvent | None = None
        reading: Reading | None = None
        notes, asked = [note], [request]  # the trimming note of the request that is answered, and that request

        def remake(now: Engine) -> AnswerRequest:  # another model was switched in before this answer's turn
            asked[0], notes[0] = make(now)
            return asked[0]

        events = self.host.decode(request, stop=stop, made_for=engine, remake=remake)
        with closing(events):
            for event in events:
                if isinstance(event, Queued):
                    yield AnswerUpdate("", "", "", event.line(), None, queued=event.ahead)
                    continue
                note, step = notes[0], event.step
                if reading is None or event.stats.new_tokens == len(step.tokens):  # the first event: the model that
                    reading = self._reading(settings)  # answers, read in its turn
                reading.add(step)
                update = self._update(event, settings, note, reading, event.stop_reason)
                if event.stop_reason == "length":  # Continue goes on from these tokens
                    update.unfinished = Unfinished(before + event.text, list(asked[0].ids) + event.tokens,
                                                   self.host.engine)
                yield update
        if event is None or isinstance(event, Queued) or reading is None:
            yield AnswerUpdate("", "", "", "Stopped before the answer began.", None, "stopped")
        elif event.stop_reason is None:  # stopped by the user
            yield self._update(event, settings, note, reading, "stopped")

    def _reading(self, settings: ChatSettings) -> Reading:
        """What an answer's updates read of the model answering it: its live speed estimate, its highlighter (each
        where asked), the backend's name."""
        engine = self.host.engine
        prices = StepPrices.of(engine.plan.profile) if settings.ppd else None
        backend = self.host.snapshot().backend
        return Reading(LiveEstimate(prices) if prices is not None else None,
                       Highlighter(engine.tokenizer) if settings.highlight else None, BACKEND_NAMES.get(backend, backend),
                       engine.loaded.name)

    def _update(self, event: GenerationEvent, settings: ChatSettings, note: str, reading: Reading,
                stop_reason) -> AnswerUpdate:
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
        speed = AnswerSpeed(event.stats, finished, settings.ppd, reading.estimate, reading.backend,
                            penalties_line(settings.sampling()))
        return AnswerUpdate(
            text=event.text,
            marked=reading.highlighter.html if reading.highlighter is not None else "",
            readout=speed.markdown(),
            note=" ".join(notes),
            stats=event.stats,
            stop_reason=stop_reason,
            model=reading.model,
        )

    def compare(self, messages: list[dict], settings: ChatSettings,
                progress: Callable[[str, int, int], None] | None = None) -> Comparison:
        """The last user message answered greedily both ways (with the settings' penalties and JSON schema), timed the
        same way and with no cache reuse; ``progress(mode, tokens, max_new_tokens)`` after each step ("plain decoding"
        or "PPD").

        Which mode runs first alternates between comparisons, so neither always gets the warmer caches.
        """
        engine = self.host.engine
        greedy = SamplingParams(**settings.penalties())
        request, _ = self.prepare(messages, settings, engine, sampling=greedy)  # refused before waiting where it does not fit
        order: tuple[Mode, Mode] = ("plain", "ppd") if self._comparisons % 2 == 0 else ("ppd", "plain")
        self._comparisons += 1
        with self.host.turn(COMPARISON):
            if self.host.engine is not engine:  # another model was switched in before this turn: its own request
                engine = self.host.engine
                request, _ = self.prepare(messages, settings, engine, sampling=greedy)
            request, max_new = replace(request, reuse_cache=False), request.max_new_tokens

            def run(mode: Mode) -> GenerationResult:
                def told(tokens: int) -> None:
                    if progress is not None:
                        progress(COMPARED[mode], tokens, max_new)
                return GenerationResult.of(engine.answer(replace(request, mode=mode)), told)

            results = {mode: run(mode) for mode in order}
        plain, ppd = results["plain"], results["ppd"]
        first = "plain" if order[0] == "plain" else "PPD"
        comparison = Comparison(plain.text, ppd.text, plain.stats, ppd.stats, plain.tokens == ppd.tokens, first,
                                engine.loaded.info.bitwise)
        self._last = comparison, self.host.calibrations
        return comparison


COMPARED = {"plain": "plain decoding", "ppd": "PPD"}

