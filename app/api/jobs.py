"""A request made a ``Job`` (``make_job``): checked field by field, its sampling, stops, grammar and tools settled, its
prompt tokenized and measured against the context. Runs off the event loop; every mistake is an ``ApiError``."""

from __future__ import annotations

import uuid

from app.api.errors import ApiError, not_ready
from app.api.messages import chat_messages, encodable
from app.api.prompts import completion_prompt
from app.api.schemas import ChatCompletionRequest, CompletionRequest, Job, RequestFields
from app.model_host import ModelHost
from app.structured import FieldError, response_grammar
from app.tools import ToolPlan, call_grammar, plan_tools, template_format
from app.tools import prompt as tool_prompt
from ppd_core import MAX_TOP_LOGPROBS, ChosenSampling, PromptTooLongError, RequestError, SamplingParams
from ppd_core.sampling.fields import NAMES
from ppd_core.sampling.params import SamplingError
from ppd_core.errors import PpdError

MAX_STOP_STRINGS = 4  # as OpenAI


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


SAMPLING_FIELDS = NAMES  # every sampling field (``ppd_core.sampling.fields``): the request's own, by the same names


def sampling_of(request: RequestFields, defaults: ChosenSampling) -> SamplingParams:
    """The request's sampling: its own fields, ``defaults`` (the model's) for those it leaves unset; each field checked
    here, once, by its declared rule (``ppd_core.sampling.fields``: OpenAI's range where OpenAI has the field,
    llama-server's else), a 400 naming it."""
    try:
        return defaults.params(**{name: getattr(request, name) for name in SAMPLING_FIELDS},
                               acceptance=request.acceptance, seed=request.seed)
    except SamplingError as error:
        raise ApiError(f"{error.field} {error.problem}", error.field) from None


def stop_strings(request: RequestFields) -> list[str]:
    stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(f"stop takes at most {MAX_STOP_STRINGS} strings, got {len(stops)}", "stop")
    if any(not s for s in stops):
        raise ApiError("stop strings must not be empty", "stop")
    return [encodable(s, "stop" if isinstance(request.stop, str) else f"stop[{i}]") for i, s in enumerate(stops)]


MAX_TOKENS_FIELD = 2**31 - 1  # llama-server's n_predict is a 32-bit int; up to it, a limit past the context is cut there
COMPLETION_DEFAULT_TOKENS = 16  # OpenAI's default max_tokens on /v1/completions
MAX_COMPLETION_LOGPROBS = 5


def check_completion(request: CompletionRequest) -> None:
    if request.logprobs is not None and not 0 <= request.logprobs <= MAX_COMPLETION_LOGPROBS:
        raise ApiError(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {request.logprobs}", "logprobs")


def make_job(service: ModelHost, request: ChatCompletionRequest | CompletionRequest) -> Job:
    """A chat request's job (or, for a ``CompletionRequest``, the raw prompt's, tokenized as llama-server does): its
    fields checked, then the answer's own request checked once by the model (``Engine.check``)."""
    completion = isinstance(request, CompletionRequest)
    check_unsupported(request)
    if completion:
        check_completion(request)
        messages, field = None, "prompt"
    else:
        messages, field = chat_messages(request), "messages"
    stops = stop_strings(request)
    limit, limit_field = answer_limit(request)
    try:
        engine = service.engine  # a switch may have begun since the request was let in
        snapshot = service.snapshot()
    except PpdError as error:
        raise not_ready(service, error) from None
    sampling = sampling_of(request, snapshot.sampling_defaults)
    grammar, json_answer, tools, messages, variables = answer_rules(request, engine, messages)
    prompt = completion_prompt(engine.tokenizer, request.prompt, request.suffix, bool(request.echo)) \
        if isinstance(request, CompletionRequest) else None
    try:
        ids = prompt.ids if prompt is not None else engine.chat_ids(messages or [], **variables)
    except PpdError as error:
        raise ApiError(str(error), field) from None
    if completion and limit is None:
        limit = COMPLETION_DEFAULT_TOKENS
    if completion:
        logprobs = request.logprobs
    else:
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
    param = grammar_param(request, tools) if grammar is not None else None
    fields = {"ids": field, "max_new_tokens": limit_field, "grammar": param, "logprobs": "top_logprobs"}
    try:
        answer = engine.check(ids, limit, sampling=sampling, logprobs=logprobs, grammar=grammar, chat=not completion)
    except PromptTooLongError as error:
        raise ApiError(
            f"this model's maximum context length is {error.context} tokens; the {field} takes {error.prompt_tokens} "
            f"tokens, leaving no room for an answer. Shorten the {field}.", field, "context_length_exceeded") from None
    except RequestError as error:
        raise ApiError(str(error), fields.get(error.field)) from None
    return Job(
        id=f"{'cmpl' if completion else 'chatcmpl'}-{uuid.uuid4().hex}", answer=answer, stop=stops,
        include_usage=bool(request.stream_options and request.stream_options.include_usage), model=snapshot.name,
        json_content=json_answer, tools=tools, completion=completion, echo=prompt.echo if prompt is not None else "",
        grammar_param=param)


def answer_limit(request: RequestFields) -> tuple[int | None, str]:
    """The answer's token limit (None: the rest of the context) and the field that set it."""
    limit = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    param = "max_completion_tokens" if request.max_completion_tokens is not None else "max_tokens"
    if limit is not None and not 1 <= limit <= MAX_TOKENS_FIELD:
        raise ApiError(f"{param} must be from 1 to {MAX_TOKENS_FIELD}, got {limit}", param)
    return limit, param


def answer_rules(request: RequestFields, engine, messages: list[dict] | None
                 ) -> tuple[str | None, bool, ToolPlan | None, list[dict] | None, dict]:
    """What the answer must follow: the grammar (a response_format's, llama-server's ``grammar``, or a forced tool
    call's), whether its content is a response_format's JSON, the tools offered, and a chat's messages with the tools
    put in them (and the template's variables); ``messages`` None: a ``/v1/completions`` prompt."""
    completion = messages is None
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
    except FieldError as error:
        raise ApiError(str(error), error.param) from None
    return grammar, json_answer, tools, messages, variables


def grammar_param(request: RequestFields, tools: ToolPlan | None) -> str:
    """The field whose grammar the answer follows: a forced tool call's, ``grammar``, else ``response_format``."""
    if tools is not None and tools.forced:
        return "tool_choice"
    return "grammar" if request.grammar is not None else "response_format"
