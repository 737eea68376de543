"""The page's answer settings (``ChatSettings``): its widgets' values as sampling parameters and a grammar."""

from __future__ import annotations

import json
from dataclasses import dataclass

from app.structured import FieldError, checked_schema_grammar
from ppd_core import Acceptance, SamplingParams


@dataclass
class ChatSettings:
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    ppd: bool = True
    acceptance: Acceptance = "lossless"  # or "typical" (faster, not distribution-preserving)
    highlight: bool = False  # mark the tokens that came from accepted guesses
    top_k: int = 0  # 0: off
    repeat_penalty: float = 1.0  # llama.cpp's repetition penalties (``PENALTY_FIELDS``): off at these values
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    schema: str = ""  # the page's JSON schema box: empty for free text

    def __post_init__(self):  # values straight from the UI's widgets
        self.system_prompt = self.system_prompt or ""
        self.temperature, self.top_p, self.top_k = float(self.temperature), float(self.top_p), int(self.top_k or 0)
        self.max_new_tokens, self.ppd, self.highlight = int(self.max_new_tokens), bool(self.ppd), bool(self.highlight)
        for name in PENALTY_FIELDS:  # a cleared number box sends None: the field's default (off)
            if getattr(self, name) is None:
                setattr(self, name, type(self).__dataclass_fields__[name].default)
        self.repeat_penalty, self.repeat_last_n = float(self.repeat_penalty), int(self.repeat_last_n)
        self.presence_penalty, self.frequency_penalty = float(self.presence_penalty), float(self.frequency_penalty)
        self.schema = self.schema or ""

    def penalties(self) -> dict:
        return {name: getattr(self, name) for name in PENALTY_FIELDS}

    def grammar(self) -> str | None:
        """The GBNF the answers follow (the API's conversion, ``app/structured.py``), None for free text; a PpdError
        (one line) for text that is not JSON or a schema the converter refuses."""
        return schema_box_grammar(self.schema)

    @property
    def constrained(self) -> bool:
        """The answers follow a JSON schema (``grammar`` refuses a box it cannot use before anything runs)."""
        return bool(self.schema.strip())

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, acceptance=self.acceptance,
                              **self.penalties())


PENALTY_FIELDS = ("repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty")
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

