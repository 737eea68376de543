"""OpenAI tool calling for the chat API: tool definitions in, prompt variables (and a grammar) out; the model's text
in, tool calls out.

A chat template that renders tools itself (its source mentions ``tools``) gets them as its ``tools`` variable and the
tool-call history as is. One that does not (the default SmolLM2's, the ChatML fallback) gets llama.cpp's *generic*
tool-call format: a system text listing the tools as JSON and asking for ``{"tool_call": {"name": ..., "arguments":
{...}}}`` or ``{"response": "..."}``; earlier calls are written back as that JSON and tool results as a user message
``{"tool_response": {...}}`` (every template takes a user message).

The answer is parsed in any of these formats (whichever the model used): Hermes / Qwen 2.5 ``<tool_call>{...}
</tool_call>`` (one or more), Llama 3.x JSON ``{"name": ..., "parameters": {...}}`` (after ``<|python_tag|>`` or
bare), Mistral ``[TOOL_CALLS][{...}]`` (the marker is a control token a decoded answer drops: a bare array of calls
counts too), and the generic JSON. ``tool_choice`` "required" or a named function constrains the answer with a
grammar over the call's JSON in the template's own format, so that it always parses.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from app.structured import FieldError, checked_schema_grammar

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for a function's name
FORMATS = ("generic", "hermes", "llama3", "mistral")
GENERIC_SYSTEM = (
    "You can call the following tools (JSON schemas of their arguments):\n{tools}\n\n"
    "Reply in JSON only: to call a tool, {{\"tool_call\": {{\"name\": \"<tool name>\", \"arguments\": {{...}}}}}}; "
    "to answer the user, {{\"response\": \"<your answer>\"}}."
)
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")  # text that begins a call anywhere in an answer


@dataclass
class ToolPlan:
    """The tools a request offers and how this model's chat template takes them."""

    tools: list[dict]  # OpenAI's tool entries, checked
    choice: str  # "auto", "required", or "function" (``name`` names it)
    name: str | None = None
    format: str = "generic"  # the format calls are asked for in (``FORMATS``)
    native: bool = False  # the template renders ``tools`` itself
    names: set[str] = field(default_factory=set)

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")


# ---- the request's fields ----


def check_tools(tools: Any, tool_choice: Any) -> tuple[list[dict], str, str | None]:
    """The request's ``tools`` (checked) and its ``tool_choice`` as (kind, name); FieldError naming the field."""
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise FieldError("tools must be a list of {'type': 'function', 'function': {...}}", "tools")
    names = []
    for index, tool in enumerate(tools):
        param = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise FieldError(f"{param}: only function tools ({{'type': 'function', 'function': {{...}}}}) are supported",
                             f"{param}.type")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise FieldError(f"{param}.function must be an object with a name", f"{param}.function")
        name = function.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise FieldError(f"{param}.function.name must be 1 to 64 letters, digits, underscores, dots or dashes",
                             f"{param}.function.name")
        if name in names:
            raise FieldError(f"{param}.function.name: two tools are named {name!r}", f"{param}.function.name")
        names.append(name)
        if not isinstance(function.get("description", ""), str):
            raise FieldError(f"{param}.function.description must be a string", f"{param}.function.description")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise FieldError(f"{param}.function.parameters must be a JSON schema object", f"{param}.function.parameters")
        try:
            json.dumps(function, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError):
            raise FieldError(f"{param}.function has text UTF-8 cannot encode", f"{param}.function") from None
    kind, name = choice_of(tool_choice, names)
    return tools, kind, name


def choice_of(tool_choice: Any, names: list[str]) -> tuple[str, str | None]:
    """``tool_choice`` as ("none" | "auto" | "required" | "function", the function's name)."""
    if tool_choice is None:
        return ("auto" if names else "none"), None
    if tool_choice in ("none", "auto", "required"):
        if tool_choice == "required" and not names:
            raise FieldError("tool_choice 'required' needs tools", "tool_choice")
        return tool_choice, None
    if isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and \
            isinstance(tool_choice.get("function"), dict):
        name = tool_choice["function"].get("name")
        if name in names:
            return "function", name
        raise FieldError(f"tool_choice names {name!r:.80}, which is not among the tools", "tool_choice")
    raise FieldError("tool_choice must be 'none', 'auto', 'required' or {'type': 'function', 'function': {'name': ...}}",
                     "tool_choice")


def template_format(source: str | None) -> tuple[bool, str]:
    """Whether a chat template renders tools itself, and the call format it teaches."""
    source = source if isinstance(source, str) else ""
    if "tools" not in source:
        return False, "generic"
    if "<tool_call>" in source:
        return True, "hermes"
    if "[TOOL_CALLS]" in source or "[AVAILABLE_TOOLS]" in source:
        return True, "mistral"
    if "<|python_tag|>" in source or "<|start_header_id|>" in source:
        return True, "llama3"
    return True, "generic"


def plan_tools(tools: Any, tool_choice: Any, template: str | None) -> ToolPlan | None:
    """The request's plan; None where no tools are offered to the model (none given, or tool_choice 'none')."""
    tools, kind, name = check_tools(tools, tool_choice)
    if kind == "none" or not tools:
        return None
    native, form = template_format(template)
    return ToolPlan(tools, kind, name, form, native, {tool["function"]["name"] for tool in tools})


# ---- the prompt ----


def functions(tools: list[dict]) -> list[dict]:
    return [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "parameters": t["function"].get("parameters", {"type": "object", "properties": {}})} for t in tools]


def prompt(messages: list[dict], plan: ToolPlan | None, native: bool) -> tuple[list[dict], dict]:
    """The messages and template variables for the model: ``native`` templates get the history as is and the tools
    as ``tools``; others the generic format's system text and the history as text. With no tools offered, the history
    goes to the template as is, as llama-server gives it (a template that knows no calls shows their turns' text):
    JSON calls written into the history would teach the model to answer in that JSON."""
    if native or plan is None:
        return messages, ({"tools": plan.tools} if plan is not None else {})
    shown = history_as_text(messages)
    text = GENERIC_SYSTEM.format(tools=json.dumps(functions(plan.tools), indent=2, ensure_ascii=False))
    if shown and shown[0]["role"] == "system":
        return [{**shown[0], "content": shown[0]["content"] + "\n\n" + text}, *shown[1:]], {}
    return [{"role": "system", "content": text}, *shown], {}


def history_as_text(messages: list[dict]) -> list[dict]:
    """Tool calls and tool results as plain text messages (a template that knows neither); consecutive tool results
    become one user message."""
    shown: list[dict] = []
    names: dict[str, str] = {}
    for message in messages:
        calls = message.get("tool_calls")
        if message["role"] == "assistant" and calls:
            for call in calls:
                names[call.get("id") or ""] = call["function"]["name"]
            parts = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
            body = {"tool_call": parts[0]} if len(parts) == 1 else {"tool_calls": parts}
            shown.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        elif message["role"] == "tool":
            response = {"name": message.get("name") or names.get(message.get("tool_call_id") or "", ""),
                        "content": message["content"]}
            text = json.dumps({"tool_response": response}, ensure_ascii=False)
            if shown and shown[-1].get("tool_result"):
                shown[-1] = {**shown[-1], "content": shown[-1]["content"] + "\n" + text}
            else:
                shown.append({"role": "user", "content": text, "tool_result": True})
        else:
            shown.append({key: value for key, value in message.items() if key in ("role", "content")})
    return [{"role": m["role"], "content": m["content"]} for m in shown]


# ---- the grammar of a forced call ----


def call_schema(function: dict, arguments_key: str = "arguments") -> dict:
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    return {"type": "object", "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
            "required": ["name", arguments_key]}


def call_grammar(plan: ToolPlan) -> str | None:
    """GBNF for the answer of a forced call (tool_choice 'required' or a named function), in the plan's format; None
    when the answer is free."""
    if not plan.forced:
        return None
    chosen = [t["function"] for t in plan.tools if plan.choice == "required" or t["function"]["name"] == plan.name]
    key = "parameters" if plan.format == "llama3" else "arguments"
    schemas = [call_schema(function, key) for function in chosen]
    one = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if plan.format == "generic":
        return checked_schema_grammar({"type": "object", "properties": {"tool_call": one}, "required": ["tool_call"]},
                                      "tools")
    if plan.format == "mistral":
        one = {"type": "array", "items": one, "minItems": 1, "maxItems": 1}
    body = checked_schema_grammar(one, "tools")
    body = re.sub(r"^root ::=", "ppd-tool-call ::=", body, count=1, flags=re.MULTILINE)
    wrap = {"hermes": r'"<tool_call>\n" ppd-tool-call "\n</tool_call>"', "llama3": "ppd-tool-call",
            "mistral": "ppd-tool-call"}[plan.format]
    return f"root ::= {wrap}\n{body}"


# ---- the answer ----


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: int | None = None) -> dict:
        entry = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return entry if index is None else {"index": index, **entry}


def _arguments(value: Any) -> str | None:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return None
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    return None


def _call(value: Any, names: set[str] | None) -> ToolCall | None:
    """A call object (``name`` and ``arguments`` or ``parameters``), else None."""
    if not isinstance(value, dict) or set(value) - {"name", "arguments", "parameters", "id", "type", "function"}:
        return None
    if isinstance(value.get("function"), dict):
        value = value["function"]
    name = value.get("name")
    arguments = _arguments(value.get("arguments", value.get("parameters", {})))
    if not isinstance(name, str) or not name or arguments is None or (names and name not in names):
        return None
    return ToolCall(name, arguments)


def _json_prefix(text: str) -> tuple[Any, str] | None:
    """The JSON value at the start of ``text`` (white space skipped) and the text after it."""
    text = text.lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(text)
    except ValueError:
        return None
    return value, text[end:]


def _calls(values: list, names: set[str] | None) -> list[ToolCall] | None:
    calls = [_call(v, names) for v in values]
    return calls if calls and all(calls) else None


def parse(text: str, names: set[str] | None = None) -> tuple[str | None, list[ToolCall]]:
    """An answer's text before any call (None if empty) and its tool calls; a text that is no call stays content.
    ``names``: the offered tools' (a bare JSON object naming another function is text)."""
    hermes = text.find("<tool_call>")
    if hermes >= 0:
        calls = []
        for body in re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text[hermes:], flags=re.DOTALL):
            found = _json_prefix(body)
            call = _call(found[0], None) if found and not found[1].strip() else None
            if call is None:
                return text, []
            calls.append(call)
        return (text[:hermes].strip() or None), calls
    for marker in ("[TOOL_CALLS]", "<|python_tag|>"):
        at = text.find(marker)
        if at >= 0:
            found = _json_prefix(text[at + len(marker):])
            values = found[0] if found else None
            rest = found[1].strip() if found else "x"
            while values is not None and rest.startswith(";"):  # Llama 3.1: several calls joined by ';'
                more = _json_prefix(rest[1:])
                if more is None:
                    break
                values = [*(values if isinstance(values, list) else [values]), more[0]]
                rest = more[1].strip()
            calls = _calls(values if isinstance(values, list) else [values], None) if not rest else None
            if calls:
                return (text[:at].strip() or None), calls
            return text, []
    found = _json_prefix(text)
    if found is None or found[1].strip():
        return text, []
    value = found[0]
    if isinstance(value, dict) and set(value) == {"response"} and isinstance(value["response"], str):
        return value["response"], []  # the generic format's answer
    if isinstance(value, dict) and set(value) == {"tool_call"}:
        calls = _calls([value["tool_call"]], None)
    elif isinstance(value, dict) and set(value) == {"tool_calls"} and isinstance(value["tool_calls"], list):
        calls = _calls(value["tool_calls"], None)
    elif isinstance(value, list):  # Mistral's calls, their [TOOL_CALLS] control token decoded away
        calls = _calls(value, names)
    else:
        calls = _calls([value], names)  # Llama 3's bare JSON
    return (None, calls) if calls else (text, [])


class HeldText:
    """A streamed answer's text with whatever may still become a tool call held back: from a call marker on, or all
    of it while it begins with a JSON value."""

    def __init__(self, names: set[str]):
        self.names = names
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> str:
        """The text that can go out now."""
        self.text += piece
        stripped = self.text.lstrip()
        if not stripped or stripped[0] in "{[":
            return ""
        end = len(self.text)
        for marker in MARKERS:
            at = self.text.find(marker, self.sent)
            if at >= 0:
                end = min(end, at)
            else:  # an end of the text that begins a marker
                for k in range(min(len(marker) - 1, len(self.text) - self.sent), 0, -1):
                    if self.text.endswith(marker[:k]):
                        end = min(end, len(self.text) - k)
                        break
        out = self.text[self.sent:max(end, self.sent)]
        self.sent = max(end, self.sent)
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """At the end: the rest of the content to send and the calls."""
        content, calls = parse(self.text, self.names)
        if not calls:
            if content != self.text:  # the generic format's {"response": ...}
                return (content if self.sent == 0 else ""), []
            return self.text[self.sent:], []
        before = content or ""
        return before[self.sent:] if before.startswith(self.text[:self.sent]) else "", calls
