"""The page's answer settings (``ChatSettings``): its widgets' values as sampling parameters and a grammar."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from app.structured import FieldError, checked_schema_grammar
from ppd_core import Acceptance, SamplingParams
from ppd_core.sampling.fields import FIELDS, NAMES, PENALTIES


@dataclass
class ChatSettings:
    system_prompt: str = ""
    max_new_tokens: int = 256
    ppd: bool = True
    acceptance: Acceptance = "lossless"  # or "typical" (faster, not distribution-preserving)
    highlight: bool = False  # mark the tokens that came from accepted guesses
    schema: str = ""  # the page's JSON schema box: empty for free text
    values: dict = field(default_factory=dict)  # every sampling field's value (``FIELDS``); unset or None: off

    def __post_init__(self):  # values straight from the UI's widgets
        self.system_prompt = self.system_prompt or ""
        self.max_new_tokens, self.ppd, self.highlight = int(self.max_new_tokens), bool(self.ppd), bool(self.highlight)
        unknown = set(self.values) - set(NAMES)
        if unknown:
            raise TypeError(f"unknown sampling fields {sorted(unknown)}")
        # a cleared number box sends None: the field's default (off)
        self.values = {f.name: f.default if self.values.get(f.name) is None else f.kind(self.values[f.name])
                       for f in FIELDS}
        self.schema = self.schema or ""

    @classmethod
    def of(cls, *widgets) -> ChatSettings:
        """The settings of the page's widgets' values, in ``SettingsPanel.inputs``' order: the fields above but
        ``values``, then every sampling field's (``FIELDS``' order)."""
        head = len(fields(cls)) - 1
        return cls(*widgets[:head], values=dict(zip(NAMES, widgets[head:])))

    @property
    def temperature(self) -> float:
        return self.values["temperature"]

    def penalties(self) -> dict:
        return {name: self.values[name] for name in PENALTY_FIELDS}

    def grammar(self) -> str | None:
        """The GBNF the answers follow (the API's conversion, ``app/structured.py``), None for free text; a PpdError
        (one line) for text that is not JSON or a schema the converter refuses."""
        return schema_box_grammar(self.schema)

    @property
    def constrained(self) -> bool:
        """The answers follow a JSON schema (``grammar`` refuses a box it cannot use before anything runs)."""
        return bool(self.schema.strip())

    def sampling(self) -> SamplingParams:
        return SamplingParams(acceptance=self.acceptance, **self.values)


PENALTY_FIELDS = PENALTIES  # llama.cpp's repetition penalties: the page's own section, and Compare's settings
SCHEMA_BOX = "the JSON schema box"


def schema_box_grammar(text: str) -> str | None:
    """``ChatSettings.grammar`` of the box's ``text``."""
    if not text.strip():
        return None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as error:
        raise FieldError(f"{SCHEMA_BOX} does not hold JSON: {error}", SCHEMA_BOX) from None
    try:
        return checked_schema_grammar(schema, SCHEMA_BOX)
    except FieldError as error:
        raise FieldError(f"{SCHEMA_BOX}: {error}", SCHEMA_BOX) from None

