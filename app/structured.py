"""The API's structured-answer fields as one GBNF grammar: ``response_format`` (OpenAI's json_object and json_schema)
and llama-server's raw ``grammar``; bad ones are a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from app.json_close import closed, held
from app.schema_bounds import schema_problem
from ppd_core import GrammarError, json_grammar, schema_grammar
from ppd_core.errors import PpdError

MAX_SCHEMA_CHARS = 100_000  # a schema's JSON text
MAX_SCHEMA_DEPTH = 64  # nested objects and arrays
MAX_GRAMMAR_CHARS = 100_000
MAX_COUNT = 1000  # a repetition bound: the grammar spells each repetition out
COUNTS = ("minItems", "maxItems", "minLength", "maxLength")


class FieldError(PpdError):
    """A structured-answer field that cannot be used; ``param`` names it."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def depth(value: Any, limit: int) -> int:
    """How deeply ``value`` nests (stops counting past ``limit``)."""
    level, frontier = 0, [value]
    while frontier and level <= limit:
        frontier = [child for item in frontier if isinstance(item, (dict, list))
                    for child in (item.values() if isinstance(item, dict) else item)]
        level += 1
    return level


def keyed(value: Any):
    """Every (key, value) pair of every object nested in ``value``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
            yield from item.items()
        elif isinstance(item, list):
            stack.extend(item)


def response_grammar(response_format: dict[str, Any] | None, grammar: str | None, chat: bool = True) -> str | None:
    """The GBNF the answer must follow, or None for free text. A chat's ``response_format`` gets llama-server's chat
    grammar (the JSON bare or in a ```json fence: ``json_content`` takes it out), a completion's the schema's own."""
    kind = (response_format or {}).get("type", "text")
    if grammar is not None and kind != "text":
        raise FieldError("give either grammar or a response_format with a schema, not both", "grammar")
    if grammar is not None:
        if not isinstance(grammar, str) or not grammar.strip():
            raise FieldError("grammar must be GBNF text with a `root` rule", "grammar")
        if len(grammar) > MAX_GRAMMAR_CHARS:
            raise FieldError(f"grammar is longer than {MAX_GRAMMAR_CHARS} characters", "grammar")
        return grammar
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")  # llama-server also takes a schema here
        if schema is None:
            return json_grammar() if chat else checked_schema_grammar({}, "response_format")
        return checked_schema_grammar(schema, "response_format.schema", chat)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise FieldError("response_format json_schema needs {'json_schema': {'name': ..., 'schema': {...}}}",
                             "response_format.json_schema")
        return checked_schema_grammar(spec["schema"], "response_format.json_schema.schema", chat)
    raise FieldError(f"response_format type must be text, json_object or json_schema, got {kind!r}",
                     "response_format.type")


def checked_schema_grammar(schema: Any, param: str, response_format: bool = False) -> str:
    """``schema_grammar`` for a schema from a request (its ``param``), a FieldError where it cannot be used."""
    if not isinstance(schema, (dict, bool)):
        raise FieldError("a JSON schema is an object", param)
    if len(json.dumps(schema)) > MAX_SCHEMA_CHARS:
        raise FieldError(f"the schema is longer than {MAX_SCHEMA_CHARS} characters as JSON", param)
    if depth(schema, MAX_SCHEMA_DEPTH) > MAX_SCHEMA_DEPTH:
        raise FieldError(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels", param)
    counted = [value for key, value in keyed(schema) if key in COUNTS and not isinstance(value, dict)]  # not a property
    if any(not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT for value in counted):
        raise FieldError(f"minItems, maxItems, minLength and maxLength must be whole numbers from 0 to {MAX_COUNT}",
                         param)
    if problem := schema_problem(schema):
        raise FieldError(problem, param)
    try:
        # llama-server's rule: an empty schema means any object
        return schema_grammar(schema or {"type": "object"}, response_format)
    except GrammarError as error:
        raise FieldError(str(error), param) from None


FENCE_OPEN, FENCE_CLOSE = "```json", "```"


def json_content(text: str, final: bool = True, complete: bool = True) -> str:
    """The JSON of a chat answer to a ``response_format`` (llama-server's content): without the whitespace around it
    and the ```json fence it may be in; an answer cut short (not ``complete``: a length limit or a stop string)
    inside its JSON is closed (``json_close.closed``: its open string, arrays and objects ended, nothing taken away),
    so that a client's ``json.loads`` takes it; its ``finish_reason`` still says "length". Before the answer's end
    (``final`` False), what may still turn out to be fence or whitespace is left out, so each result begins with the
    one before it."""
    body = text.lstrip()
    if FENCE_OPEN.startswith(body):
        return ""  # a fence, or nothing yet
    fenced = body.startswith(FENCE_OPEN)
    if fenced:
        body = body[len(FENCE_OPEN):].lstrip()
    stripped = body.rstrip()
    if fenced:  # the closing fence, or as much of it as came
        stripped = (stripped[: -len(FENCE_CLOSE)] if stripped.endswith(FENCE_CLOSE) else stripped.rstrip("`")).rstrip()
    if not final:
        return held(stripped)
    if complete or parses(stripped):
        return stripped
    return closed(body)  # cut short inside the JSON


def parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


class JsonContent:
    """``json_content`` for a streamed answer: ``emit`` hears the JSON as it grows (``feed``), the rest at ``close``."""

    def __init__(self, emit: Callable[[str, Any], None]):
        self.emit, self.text, self.sent = emit, "", 0

    def feed(self, piece: str, extra: Any = None) -> None:
        self.text += piece
        self._send(False, extra)

    def close(self, complete: bool = True) -> str:
        """Send what is left; the whole JSON (``json_content``'s ``complete``)."""
        return self._send(True, None, complete)

    def _send(self, final: bool, extra: Any, complete: bool = True) -> str:
        content = json_content(self.text, final, complete)
        piece, self.sent = content[self.sent:], max(self.sent, len(content))
        if piece or extra:
            self.emit(piece, extra)
        return content
