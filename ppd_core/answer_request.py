"""One answer asked of a model, checked once (``check_answer``, ``Engine.check``) and then passed whole: the API, the
page, Compare, ``ppd generate`` and ``ppd bench`` build one; ``Engine.answer`` and ``decoding.generate`` read it and
check nothing again.

    request = engine.check(engine.chat_ids(messages), 256, sampling=SamplingParams(temperature=0.7), grammar=gbnf)
    for event in engine.answer(request): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ppd_core.errors import PpdError
from ppd_core.sampling.logits import MAX_TOP_LOGPROBS
from ppd_core.sampling.params import GREEDY, SamplingParams

if TYPE_CHECKING:
    from ppd_core.sampling.constraint import Grammar

Mode = Literal["ppd", "plain"]  # PPD's trees, or plain decoding (one token a step)
MODES: tuple[Mode, ...] = ("ppd", "plain")


class RequestError(PpdError):
    """A request the model cannot answer as asked; ``field`` names what is wrong ("ids", "max_new_tokens",
    "logprobs", "grammar", "mode"), so a caller can name its own field for it (the API's ``param``)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


class PromptTooLongError(RequestError):
    """The prompt leaves no room in the model's context for an answer."""

    def __init__(self, prompt_tokens: int, context: int):
        super().__init__(f"the prompt has {prompt_tokens} tokens but the model's context holds {context} "
                         "(prompt and answer together)", "ids")
        self.prompt_tokens, self.context = prompt_tokens, context


@dataclass(frozen=True)
class AnswerRequest:
    """Everything one answer needs, checked: the prompt fits the context with room for at least one token, the limit
    is at least 1, the grammar compiled for this model and able to begin an answer. Build it with ``check_answer``."""

    ids: tuple[int, ...]  # the whole prompt: a chat in the model's template, or raw text's tokens
    max_new_tokens: int  # >= 1; decoding also stops at the context's end (stop reason "context")
    context: int  # the model's context: prompt and answer together
    mode: Mode = "ppd"
    sampling: SamplingParams = GREEDY
    logprobs: int | None = None  # report each token's log-probability and this many alternatives; None: none
    grammar: Grammar | None = None  # compiled once, before any token: each answer decodes with a clone of it
    chat: bool = False  # ``ids`` are a chat in the template: its turn markers written as text end the answer
    reuse_cache: bool = False  # go on from the cache of the last such answer (multi-turn chat)

    def grammar_state(self) -> Grammar | None:
        """A fresh state of the request's grammar for one answer (the request stays as it was)."""
        return None if self.grammar is None else self.grammar.clone()


def check_answer(ids: Sequence[int], max_new_tokens: int | None, context: int, *, mode: Mode = "ppd",
                 sampling: SamplingParams = GREEDY, logprobs: int | None = None, grammar: str | None = None,
                 compile_grammar: Callable[[str], Any] | None = None, chat: bool = False,
                 reuse_cache: bool = False) -> AnswerRequest:
    """The checked request (each check made here, once): ``max_new_tokens`` None is the rest of the context;
    ``compile_grammar(text)`` makes the model's grammar state for GBNF ``grammar``. A ``RequestError`` names the field
    at fault."""
    if mode not in MODES:
        raise RequestError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}", "mode")
    if not ids:
        raise RequestError("the prompt is empty", "ids")
    if len(ids) >= context:
        raise PromptTooLongError(len(ids), context)
    if max_new_tokens is None:
        max_new_tokens = context - len(ids)
    if max_new_tokens < 1:
        raise RequestError(f"max_new_tokens must be at least 1, got {max_new_tokens}", "max_new_tokens")
    if logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {logprobs}", "logprobs")
    return AnswerRequest(tuple(ids), max_new_tokens, context, mode, sampling, logprobs,  # type: ignore[arg-type]
                         compiled(grammar, compile_grammar), chat, reuse_cache)


def compiled(grammar: str | None, compile_grammar: Callable[[str], Any] | None):
    """GBNF ``grammar`` compiled (None: none), checked to begin an answer; a ``RequestError`` ("grammar") if not."""
    if grammar is None:
        return None
    if compile_grammar is None:
        raise RequestError("this model has no grammar engine", "grammar")
    try:
        state = compile_grammar(grammar)
    except RequestError:
        raise
    except PpdError as error:
        raise RequestError(str(error), "grammar") from None
    try:
        state.check_opening()
    except PpdError as error:
        state.close()
        raise RequestError(str(error), "grammar") from None
    return state
