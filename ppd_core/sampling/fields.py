"""Every sampling field, declared once (``SamplingField``): everything else is derived from ``FIELDS`` (the checks
and ``describe`` of ``SamplingParams``, the defaults a request gets, a GGUF's recommendation, the command line's
options, the API's request fields and their errors, the page's settings, the llama-server peer's request). Plain
data, no NumPy: the command line reads it before any model.

A new field is one ``SamplingField`` here, its attribute on ``SamplingParams`` (``params.py``) and what it does to
the distribution (``verify.adjusted_probs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The smallest temperature and repeat penalty above 0: logits are divided by them (in float32 for the penalty), and
# a subnormal one (1e-320) made them infinite: junk answers, and a token the grammar forbids. 0.001 scales a logit
# of 100 to 1e5, far inside float32.
MIN_SCALE = 0.001


@dataclass(frozen=True)
class SamplingField:
    """One sampling field. ``name`` is ``SamplingParams``' attribute and the field's name in the API (OpenAI's where
    ``openai``), in llama-server's request and in ``/v1/models``; the command line's option is ``flag``."""

    name: str
    kind: type  # float or int
    default: Any  # of ``kind``: SamplingParams' (the command line's): off, or greedy for the temperature
    fine: Callable[[float], bool]  # whether a (finite) value is allowed
    rule: str  # the rule in words: "must be ..."
    help: str  # what it does: the command line's help
    label: str  # the page's label
    server_default: Any  # of ``kind``: llama-server's default (common/common.h, ``common_params_sampling``)
    page: tuple[float, float | None, float]  # the page's slider (low, high, step); high None: a number box from low
    penalty: bool = False  # one of llama.cpp's repetition penalties (its ``penalties`` sampler; their own section)
    openai: bool = False  # OpenAI's API has the field (then its range is OpenAI's; llama-server's otherwise)
    gguf: str | None = None  # the GGUF key of a model's recommendation (llama.cpp's ``general.sampling.*``)
    config_name: str | None = None  # its name in ``generation_config.json`` (transformers'), where it has one
    sampled: bool = False  # a model's recommendation sets it only where the model samples (``do_sample``)

    @property
    def flag(self) -> str:
        """The command line's option, which its errors name."""
        return "--" + self.name.replace("_", "-")

    def problem(self, value) -> str | None:
        """What is wrong with ``value`` ("must be ..., got ..."), or None if it is fine."""
        try:
            if math.isfinite(value) and self.fine(value):
                return None
        except (TypeError, OverflowError):  # not a number, or an int too large for a float
            if isinstance(value, int) and not isinstance(value, bool) and self.fine(value):
                return None
        return f"{self.rule}, got {value}"


TEMPERATURE = SamplingField(
    "temperature", float, 0.0, lambda v: v == 0.0 or MIN_SCALE <= v <= 2.0,
    f"must be 0 (greedy) or between {MIN_SCALE} and 2", "0 = greedy (default)", "Temperature (0 = greedy)",
    server_default=0.8, page=(0.0, 2.0, 0.05), openai=True, gguf="general.sampling.temp", sampled=True)
TOP_P = SamplingField(
    "top_p", float, 1.0, lambda v: 0.0 < v <= 1.0, "must be greater than 0 and at most 1",
    "nucleus: keep the likeliest tokens up to this probability mass (1 = off)", "Top-p",
    server_default=0.95, page=(0.05, 1.0, 0.05), openai=True, gguf="general.sampling.top_p", sampled=True)
TOP_K = SamplingField(
    "top_k", int, 0, lambda v: v >= 0, "must be 0 (off) or positive", "keep the k likeliest tokens (0 = off)",
    "Top-k (0 = off)", server_default=40, page=(0, 200, 1), gguf="general.sampling.top_k", sampled=True)
MIN_P = SamplingField(
    "min_p", float, 0.0, lambda v: 0.0 <= v <= 1.0, "must be between 0 (off) and 1",
    "keep the tokens at least this fraction as likely as the likeliest (llama.cpp's min-p; 0 = off)", "Min-p (0 = off)",
    server_default=0.05, page=(0.0, 1.0, 0.01), gguf="general.sampling.min_p", sampled=True)
REPEAT_PENALTY = SamplingField(
    "repeat_penalty", float, 1.0, lambda v: MIN_SCALE <= v <= 100.0, f"must be between {MIN_SCALE} and 100 (1: off)",
    "divide the logit of a token seen in the window by this (1 = off; 1.1 is usual)", "Repeat penalty (1 = off)",
    server_default=1.0, page=(0.5, 2.0, 0.01), penalty=True, gguf="general.sampling.penalty_repeat",
    config_name="repetition_penalty")
REPEAT_LAST_N = SamplingField(
    "repeat_last_n", int, 64, lambda v: v >= -1, "must be -1 (the whole context), 0 (off) or positive",
    "the window: the last N tokens of the context (-1: all of it; 0: no penalties)",
    "Repeat window: how many recent tokens the penalties look at", server_default=64, page=(-1, None, 1), penalty=True,
    gguf="general.sampling.penalty_last_n")
PRESENCE_PENALTY = SamplingField(
    "presence_penalty", float, 0.0, lambda v: -2.0 <= v <= 2.0, "must be between -2 and 2",
    "take this off a seen token's logit", "Presence penalty", server_default=0.0, page=(-2.0, 2.0, 0.05),
    penalty=True, openai=True)
FREQUENCY_PENALTY = SamplingField(
    "frequency_penalty", float, 0.0, lambda v: -2.0 <= v <= 2.0, "must be between -2 and 2",
    "take this off per time it was seen", "Frequency penalty", server_default=0.0, page=(-2.0, 2.0, 0.05),
    penalty=True, openai=True)

# in the order the page shows them (the samplers, then the penalties) and ``describe`` reports them
FIELDS: tuple[SamplingField, ...] = (TEMPERATURE, TOP_P, TOP_K, MIN_P, REPEAT_PENALTY, REPEAT_LAST_N,
                                     PRESENCE_PENALTY, FREQUENCY_PENALTY)
BY_NAME = {field.name: field for field in FIELDS}
NAMES = tuple(BY_NAME)
PENALTIES = tuple(field.name for field in FIELDS if field.penalty)
