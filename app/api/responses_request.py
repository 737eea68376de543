"""``POST /v1/responses`` (OpenAI's Responses API) in: its request made the chat request ppd already answers.

``input`` (a string, or a list of messages, ``function_call`` and ``function_call_output`` items), ``instructions``
(a system message first), ``max_output_tokens``, ``text.format`` (``json_object`` / ``json_schema``: the chat's
``response_format``), function ``tools`` and ``tool_choice`` in the Responses shapes. Stored responses
(``previous_response_id``) are refused: ppd keeps no conversations on the server. Every mistake is an ``ApiError``
naming its field."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict

from app.api.errors import ApiError
from app.api.messages import ROLES
from app.api.schemas import ChatCompletionRequest, Message, SamplingFields, sampling_fields

TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(SamplingFields):
    """OpenAI's fields ppd uses, and the sampling fields (``SamplingFields``: llama-server's extensions, as on the
    chat endpoint)."""

    model_config = ConfigDict(extra="ignore")  # store, metadata, reasoning, truncation, user, ...
    model: str | None = None
    input: Any = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    tools: list[Any] | None = None
    tool_choice: Any = None
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    seed: int | None = None


def content_text(content: Any, param: str) -> str:
    """A message's content: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"{param} must be a string or a list of text parts", param)
    texts = []
    for number, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise ApiError(f"{param}[{number}]: only text parts ({{'type': 'input_text', 'text': ...}}) are supported",
                           f"{param}[{number}]")
        texts.append(part["text"])
    return "".join(texts)


def call_of(item: dict, param: str) -> dict:
    """A ``function_call`` item as a chat tool call."""
    name, arguments = item.get("name"), item.get("arguments", "{}")
    if not isinstance(name, str) or not isinstance(arguments, str):
        raise ApiError(f"{param} needs a name and its arguments as JSON text", param)
    return {"id": item.get("call_id") or item.get("id") or "call_0", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def messages_of(request: ResponsesRequest) -> list[dict]:
    """``instructions`` and ``input`` as chat messages; consecutive function calls become one assistant turn."""
    messages = [{"role": "system", "content": request.instructions}] if request.instructions else []
    items = request.input
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ApiError("input must be a string or a list of input items (messages, function calls and their outputs)",
                       "input")
    for index, item in enumerate(items):
        param = f"input[{index}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            if item.get("role") not in ROLES:
                raise ApiError(f"{param}.role must be one of {', '.join(sorted(ROLES))}", f"{param}.role")
            messages.append({"role": item["role"], "content": content_text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = call_of(item, param)
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output, f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind != "reasoning":  # a reasoning model's summaries: not for this model's prompt
            raise ApiError(f"{param}.type {kind!r}: ppd takes messages, function_call and function_call_output items",
                           f"{param}.type")
    return messages


def tools_of(tools: list[Any] | None) -> list[dict] | None:
    """Responses' function tools (``{"type": "function", "name": ..., "parameters": ...}``) in the chat's shape."""
    if tools is None:
        return None
    chat = []
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ApiError(f"tools[{index}]: only function tools ({{'type': 'function', 'name': ...}}) are supported",
                           f"tools[{index}].type")
        function = {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}
        chat.append({"type": "function", "function": function})
    return chat


def tool_choice_of(choice: Any) -> Any:
    """Responses' ``{"type": "function", "name": ...}`` in the chat's shape; the strings as they are."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def format_of(text: dict[str, Any] | None) -> dict | None:
    """``text.format`` as the chat's ``response_format``."""
    form = (text or {}).get("format")
    if form is None:
        return None
    if not isinstance(form, dict):
        raise ApiError("text.format must be {'type': 'text' | 'json_object' | 'json_schema', ...}", "text.format")
    if form.get("type") == "json_schema":
        if not isinstance(form.get("schema"), dict):
            raise ApiError("text.format json_schema needs its schema", "text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": form.get("name", "answer"), "schema": form["schema"],
                                                       "strict": form.get("strict")}}
    return {key: value for key, value in form.items() if key in ("type", "schema")}


def chat_request(request: ResponsesRequest) -> ChatCompletionRequest:
    """The chat request that answers ``request``."""
    if request.previous_response_id is not None:
        raise ApiError("previous_response_id: ppd stores no responses; send the whole conversation in input",
                       "previous_response_id")
    if request.max_output_tokens is not None and request.max_output_tokens < 1:
        raise ApiError(f"max_output_tokens must be at least 1, got {request.max_output_tokens}", "max_output_tokens")
    messages = [Message(**message) for message in messages_of(request)]
    fields = {"model": request.model, "messages": messages, "max_tokens": request.max_output_tokens,
              "tools": tools_of(request.tools),
              "tool_choice": tool_choice_of(request.tool_choice), "response_format": format_of(request.text),
              "seed": request.seed, **sampling_fields(request)}
    return ChatCompletionRequest(**fields)
