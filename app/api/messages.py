"""A chat request's messages, checked and made plain (``chat_messages``): every client mistake is an ``ApiError``
naming its field, before the model is asked."""

from __future__ import annotations

import json
from typing import Any

from app.api.errors import ApiError
from app.api.schemas import ChatCompletionRequest, Message
from ppd_core import UnencodableText
from ppd_core.text import utf8

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


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
