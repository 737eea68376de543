"""``closed``: a JSON text cut short (an answer that hit its token limit inside its JSON) made valid JSON by appending
only: the open string, literal or number finished, a key given ``null``, the open arrays and objects closed (a comma
it ends with is left out). What a stream sent (``held``: without a comma it ends with) stays a prefix of the result,
so a stream can send the closing as its last piece."""

from __future__ import annotations

import json
import re

LITERALS = ("true", "false", "null")


def scan(text: str) -> tuple[list[str], str, bool, bool]:
    """The open containers (``{`` / ``[``), what the text ends inside ("string", "key", "escape" or ""), and whether
    an object is waiting for a key or for a value (after ``,`` or ``{``: a key; after ``:``: a value)."""
    stack, inside, want_key, want_value = [], "", False, False
    escape = False
    for char in text:
        if inside:
            if escape:
                escape = False
            elif char == "\\":
                escape = True
            elif char == '"':
                inside = ""
            continue
        if char == '"':
            inside, want_value = ("key" if want_key else "string"), False
            want_key = False
        elif char in "{[":
            stack.append(char)
            want_key, want_value = char == "{", char == "["
        elif char in "}]":
            stack.pop() if stack else None
            want_key = want_value = False
        elif char == ",":
            want_key, want_value = bool(stack) and stack[-1] == "{", bool(stack) and stack[-1] == "["
        elif char == ":":
            want_key, want_value = False, True
        elif not char.isspace():
            want_key = want_value = False
    return stack, ("escape" if inside and escape else inside), want_key, want_value


def tail_ending(text: str) -> str:
    """What finishes a literal or number the text ends in the middle of ("" where it ends between values)."""
    word = text[len(text.rstrip("0123456789.eE+-truefalsn")):]
    if word in LITERALS:
        return ""
    for literal in LITERALS:
        if word and literal.startswith(word) and word != literal:
            return literal[len(word):]
    if word and word[-1] in ".eE+-":
        return "0"
    return ""


def closing(text: str) -> str:
    """The characters to append to ``text`` (a JSON text cut short) to make it valid JSON."""
    stack, inside, want_key, want_value = scan(text)
    end = ""
    if inside == "escape":
        end += "\\"
    elif inside and (unicode := re.search(r"(?<!\\)(?:\\\\)*\\u([0-9a-fA-F]{0,3})$", text)):
        end += "0" * (4 - len(unicode.group(1)))
    if inside:
        end += '"' + (": null" if inside == "key" else "")
    elif want_key and text.rstrip().endswith(","):
        end += '"": null'
    elif want_value and (text.rstrip().endswith(":") or text.rstrip().endswith(",")):
        end += "null"
    else:
        end += tail_ending(text)
        if stack and stack[-1] == "{" and not want_key and text.rstrip().endswith('"') and is_key_end(text):
            end += ": null"
    return end + "".join("}" if c == "{" else "]" for c in reversed(stack))


def is_key_end(text: str) -> bool:
    """Whether the string the text ends with is an object's key (no ``:`` after it yet)."""
    try:
        json.loads(text + ": null" + "".join("}" if c == "{" else "]" for c in reversed(scan(text)[0])))
    except ValueError:
        return False
    return True


def closed(text: str) -> str:
    """``text`` with ``closing`` appended where that makes it valid JSON (a comma it ends with, outside a string,
    left out: ``held`` kept it back from a stream), else ``text`` as it is."""
    try:
        json.loads(text)
        return text
    except ValueError:
        pass
    if text.rstrip().endswith(",") and not scan(text)[1]:
        text = text.rstrip()[:-1]
    whole = text + closing(text)
    try:
        json.loads(whole)
    except ValueError:
        return text
    return whole


def held(text: str) -> str:
    """What of a growing JSON text can go out now: all but a comma it ends with, which ``closed`` may leave out."""
    return text[:-1] if text.endswith(",") else text
