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
from app.model_host import ModelHost
from app.model_queue import COMPARISON, Queued
from app.readout import SPEED_DEFINITION, AnswerSpeed, compare_verdict, penalties_line
from ppd_core import Engine, GenerationEvent, GenerationResult, GenerationStats, Mode, SamplingParams
from ppd_core.calibration.prices import LiveEstimate, StepPrices
from ppd_core.errors import PpdError


@dataclass
class Unfinished:
    """An answer that ended at the length limit: its text, and the ids its model (``engine``) decoded it from and into
    (the prompt, then the answer's tokens), so that Continue goes on from exactly those tokens."""

    text: str
    ids: list[int]
    engine: Engine


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


Make = Callable[[Engine], tuple[list[int], str]]  # the prompt's ids as a model makes them, and the trimming note


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

    def prepare(self, messages: list[dict], settings: ChatSettings, engine: Engine | None = None) -> tuple[list[int], str]:
        """Chat-template ids for the conversation, dropping the oldest turns until prompt + answer fit; made by
        ``engine`` (default: the one loaded now), the only one that may decode them."""
        if not messages or messages[-1]["role"] != "user" or not messages[-1]["content"].strip():
            raise PpdError("the message is empty")
        engine = engine or self.host.engine
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
        engine = self.host.engine
        grammar = self.checked_grammar(settings, engine)
        ids, note = self.prepare(messages, settings, engine)
        self.host.queue.check_room()
        return self._answer(ids, engine, lambda now: self.prepare(messages, settings, now), settings, note, stop,
                            grammar)

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

        def made(now: Engine) -> tuple[list[int], str]:
            ids, note = self.prepare(messages[:-1], settings, now)
            if known is not None and known.engine is now and known.text == partial and known.ids[:len(ids)] == ids:
                return list(known.ids), note  # the tokens it was decoded as: greedy goes on exactly
            return ids + now.tokenizer.encode(partial, add_special_tokens=False), note

        engine = self.host.engine
        grammar = self.checked_grammar(settings, engine)
        ids, note = made(engine)
        self.host.queue.check_room()
        updates = self._answer(ids, engine, made, settings, note, stop, grammar, partial)
        return (update if update.queued else replace(update, text=partial + update.text) for update in updates)

    @staticmethod
    def checked_grammar(settings: ChatSettings, engine: Engine) -> str | None:
        """The settings' grammar (``ChatSettings.grammar``), checked as the API checks one: one line where ``engine``
        cannot follow it."""
        grammar = settings.grammar()
        if grammar is not None:
            engine.check_grammar(grammar)
        return grammar

    def _answer(self, ids: list[int], engine: Engine, make: Make, settings: ChatSettings, note: str,
                stop: Callable[[], bool] | None, grammar: str | None = None,
                before: str = "") -> Iterator[AnswerUpdate]:
        """The answer's updates; ``make`` makes the ids again for another model switched in before its turn;
        ``before``: the answer's text before these ids' end (a continued answer)."""
        mode = "ppd" if settings.ppd else "plain"
        event: GenerationEvent | None = None
        reading: Reading | None = None
        notes, prompt = [note], [ids]  # the trimming note of the ids that are decoded, and those ids

        def remake(now: Engine) -> list[int]:  # another model was switched in before this answer's turn
            prompt[0], notes[0] = make(now)
            return prompt[0]

        events = self.host.decode(ids, mode, int(settings.max_new_tokens), settings.sampling(), reuse_cache=True,
                                  stop=stop, made_for=engine, remake=remake, grammar=grammar, chat=True)
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
                    update.unfinished = Unfinished(before + event.text, prompt[0] + event.tokens, self.host.engine)
                yield update
        if event is None or isinstance(event, Queued):
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
        grammar = self.checked_grammar(settings, engine)
        ids, _ = self.prepare(messages, settings, engine)  # refused before waiting where it does not fit
        order = ("plain", "ppd") if self._comparisons % 2 == 0 else ("ppd", "plain")
        self._comparisons += 1
        with self.host.turn(COMPARISON):
            if self.host.engine is not engine:  # another model was switched in before this turn: its own ids
                engine = self.host.engine
                grammar = self.checked_grammar(settings, engine)
                ids, _ = self.prepare(messages, settings, engine)
            greedy, max_new = SamplingParams(**settings.penalties()), int(settings.max_new_tokens)

            def run(mode: Mode) -> GenerationResult:
                def told(tokens: int) -> None:
                    if progress is not None:
                        progress(COMPARED[mode], tokens, max_new)
                return generated(engine.stream(ids, mode, max_new, sampling=greedy, grammar=grammar, chat=True), told)

            results = {mode: run(mode) for mode in order}
        plain, ppd = results["plain"], results["ppd"]
        first = "plain" if order[0] == "plain" else "PPD"
        comparison = Comparison(plain.text, ppd.text, plain.stats, ppd.stats, plain.tokens == ppd.tokens, first,
                                engine.loaded.backend.bitwise)
        self._last = comparison, self.host.calibrations
        return comparison


COMPARED = {"plain": "plain decoding", "ppd": "PPD"}


def generated(events: Iterator[GenerationEvent], step: Callable[[int], object]) -> GenerationResult:
    """``Engine.generate`` of the stream ``events``, calling ``step(tokens so far)`` after each event."""
    steps, event = [], None
    for event in events:
        steps.append(event.step)
        step(event.stats.new_tokens)
    return GenerationResult(event.text, event.tokens, event.stats, event.stop_reason, steps)
