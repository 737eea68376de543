"""The requests, as OpenAI defines them (the fields ppd uses; others are ignored), and the plain values a request
becomes: its ``Job`` and, once answered, its ``Outcome``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, create_model

from app.tools import ToolPlan
from ppd_core import AnswerRequest, ModelSnapshot, SamplingParams
from ppd_core.sampling.fields import FIELDS


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


# Every sampling field (``ppd_core.sampling.fields``) as an optional request field of its type: unset, the model's
# recommendation, else llama-server's default (``sampling_defaults``); ranges checked once, by ``SamplingParams`` (``jobs.sampling_of``). The
# OpenAI names where OpenAI has the field; llama-server's (the same meaning) else.
if TYPE_CHECKING:
    SamplingFields = BaseModel  # what a type checker sees: the fields are read by name (``sampling_fields``)
else:
    SamplingFields = create_model("SamplingFields", __config__=ConfigDict(extra="ignore"),
                                  **{field.name: (field.kind | None, None) for field in FIELDS})


def sampling_fields(request: BaseModel) -> dict:
    """A request's sampling fields (``SamplingFields``), None where unset."""
    return {field.name: getattr(request, field.name) for field in FIELDS}


class RequestFields(SamplingFields):
    """The fields both endpoints take (the sampling fields from ``SamplingFields``)."""

    model_config = ConfigDict(extra="ignore")  # clients send fields such as `user` or `metadata`
    model: str | None = None  # answered by the loaded model (as llama-server does), unless it names another one ppd has
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens; wins if both are given
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None  # 0 to 20 alternatives per token; needs logprobs
    tools: list[Any] | None = None  # OpenAI's function tools (``app.tools``); chat only
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", "function": {"name": ...}}
    functions: list[Any] | None = None  # the deprecated form of tools: refused
    response_format: dict[str, Any] | None = None  # text, json_object or json_schema (``structured``)
    grammar: str | None = None  # llama-server's: GBNF the answer follows
    acceptance: Literal["lossless", "typical"] | None = None


class ChatCompletionRequest(RequestFields):
    messages: list[Message]


class CompletionRequest(RequestFields):
    """``/v1/completions``: text in, text out (the legacy endpoint editors' completion still uses)."""

    prompt: Any = None  # a string, token ids, or a list holding one of either (``prompts``: checked there)
    logprobs: int | None = None  # 0 to 5 alternatives per token (the legacy shape)
    echo: bool | None = None  # the answer begins with the prompt
    suffix: Any = None  # the text after the completion: fill-in-the-middle (``prompts``)


@dataclass
class Job:
    """A validated request, ready for the model."""

    id: str
    answer: AnswerRequest  # what the model answers, checked (``Engine.check``)
    stop: list[str]
    include_usage: bool
    model: str  # the name of the model the ids were made for: a streamed answer's label
    grammar_param: str | None = None  # the field that set the answer's grammar: named when it leaves no token
    json_content: bool = False  # a chat's response_format: the content is the answer's JSON (``structured.json_content``)
    tools: ToolPlan | None = None  # the tools offered: the answer is parsed for calls (``app.tools.parse``)
    completion: bool = False  # a ``/v1/completions`` job: its answers are text_completion objects
    echo: str = ""  # a completion's prompt, echoed before its answer (``echo``)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def ids(self) -> tuple[int, ...]:
        return self.answer.ids

    @property
    def max_new_tokens(self) -> int:
        return self.answer.max_new_tokens

    @property
    def sampling(self) -> SamplingParams:
        return self.answer.sampling

    @property
    def logprobs(self) -> int | None:
        """The alternatives per token asked for (``top_logprobs``); None: no logprobs."""
        return self.answer.logprobs


@dataclass
class Outcome:
    """How a job ended; ``stats`` and ``text`` are None when it was cancelled before reaching the model."""

    finish_reason: str  # "stop", "length", or "cancelled" (the client went away, or ppd is quitting)
    text: str | None = None  # the answer, cut before a stop string
    completion_tokens: int = 0
    stats: Any = None  # GenerationStats
    queued_seconds: float = 0.0  # waiting for the model: until the job's turn began (its prompt's prefill not counted)
    started_at: float = 0.0  # unix times of taking and releasing the model
    finished_at: float = 0.0
    steps_after_cancel: int = 0  # forward passes that ran after the cancel flag was set (at most one)
    model: ModelSnapshot | None = None  # the model that answered, taken with the first step (under the job's turn)
    logprobs: list[dict] | None = None  # OpenAI's ``logprobs.content`` entries, one per answer token (asked for)
