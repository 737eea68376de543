"""Bounds a request's JSON schema must keep before llama.cpp's converter and grammar engine see it (``schema_problem``):
they are the oracle for what is valid, not a sandbox. A ``minLength`` above its ``maxLength`` became the repetition
``{5,1}``, which llama.cpp's parser expands into 2**64 rules (allocating until the process aborted); a 5,000-value
``enum`` is 5,000 grammar stacks at every token (the request hung); a 2,000-property object took 37 s of CPU and
logged its whole grammar. Each problem is one line naming the JSON pointer."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

RANGES = (("minLength", "maxLength"), ("minItems", "maxItems"), ("minProperties", "maxProperties"),
          ("minimum", "maximum"), ("exclusiveMinimum", "exclusiveMaximum"), ("minimum", "exclusiveMaximum"),
          ("exclusiveMinimum", "maximum"))
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
MAX_BOUND = 2**53  # a bound's size: the integers a double holds exactly (llama.cpp's converter casts to int64)
# Each enum value and each optional property is an alternative llama.cpp matches every token of the vocabulary
# against: the cost of one masked row grows with the enum's size, the converter's with the properties' count
# (benchmarks/scripts/grammar_limits.py; the figures are in benchmarks/README.md, issue 50's entry).
MAX_ENUM_VALUES = 200  # ``enum`` values in the whole schema
MAX_PROPERTIES = 200  # ``properties`` in the whole schema


DATA = ("enum", "const", "default", "examples")  # values, not schemas
NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")  # name -> schema maps


def objects(value: Any, pointer: str = "") -> Iterator[tuple[str, dict]]:
    """Every schema object nested in ``value`` (itself included), with its JSON pointer ("" for the root); what
    ``enum``, ``const``, ``default`` and ``examples`` hold are values, not schemas."""
    stack = [(pointer, value, False)]  # (pointer, item, whether item maps names to schemas)
    while stack:
        where, item, named = stack.pop()
        if isinstance(item, dict):
            if not named:
                yield where, item
            stack.extend((f"{where}/{escape(key)}", child, not named and key in NAMED) for key, child in item.items()
                         if named or key not in DATA)
        elif isinstance(item, list):
            stack.extend((f"{where}/{index}", child, False) for index, child in enumerate(item))


def escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def bound_problem(where: str, schema: dict) -> str | None:
    """An inverted range (``minLength`` above ``maxLength``, ...) or a bound no integer schema can use."""
    for key in BOUNDS:
        value = schema.get(key)
        if number(value) and not (math.isfinite(value) and abs(value) <= MAX_BOUND):
            return f"{key} at '{where or '/'}' must be a finite number of at most 2**53 in size, got {value}"
    for least, most in RANGES:
        low, high = schema.get(least), schema.get(most)
        if number(low) and number(high) and low > high:
            return f"{least} {low} is above {most} {high} at '{where or '/'}': nothing can match"
    return None


def schema_problem(schema: Any) -> str | None:
    """What makes ``schema`` too costly or impossible to turn into a grammar, in one line; None if nothing."""
    enum_values = properties = 0
    for where, item in objects(schema):
        if problem := bound_problem(where, item):
            return problem
        enum_values += len(item["enum"]) if isinstance(item.get("enum"), list) else 0
        properties += len(item["properties"]) if isinstance(item.get("properties"), dict) else 0
    if enum_values > MAX_ENUM_VALUES:
        return f"the schema has {enum_values:,} enum values; at most {MAX_ENUM_VALUES} are taken"
    if properties > MAX_PROPERTIES:
        return f"the schema has {properties:,} properties; at most {MAX_PROPERTIES} are taken"
    return None
