"""Sampling settings and the defaults a request gets: plain data, checked on creation, no NumPy at import (the
command line reads them before any model).

Temperature 0 means greedy decoding. ``acceptance`` picks how guesses are verified when sampling: "lossless" keeps
the model's distribution exactly; "typical" is the paper's faster rule that does not.

A request's unset fields come from the model's recommendation (its GGUF's ``general.sampling.*`` keys or its
``generation_config.json``), else ppd's measured repeat penalty, else llama-server's default for that field.
llama-server leaves repetition unguarded (``repeat_penalty`` 1.0) and the embedded default model then loops: ppd's
default is the penalty Ollama and LM Studio apply (1.1 over the last 64 tokens), kept because it was measured to stop
the loops (``benchmarks/scripts/loop_rate.py``; the figures: docs/sampling.md, "Repetition penalties").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ppd_core.errors import PpdError
from ppd_core.sampling.fields import (
    BY_NAME, FREQUENCY_PENALTY, MIN_P, NAMES, PRESENCE_PENALTY, REPEAT_LAST_N, REPEAT_PENALTY, TEMPERATURE, TOP_K,
    TOP_P,
)
from ppd_core.sampling.fields import FIELDS as SAMPLING_FIELDS

if TYPE_CHECKING:
    import numpy as np


Acceptance = Literal["lossless", "typical"]  # how sampled guesses are verified
ACCEPTANCE_RULES: tuple[Acceptance, ...] = ("lossless", "typical")
# The one rule for every sampling field, whoever sets it (the API, the command line, the page, a model's
# recommendation): field -> (whether a value is fine, the rule in words). Values are finite numbers.
RANGES = {field.name: (field.fine, field.rule) for field in SAMPLING_FIELDS}


def out_of_range(name: str, value) -> str | None:
    """What is wrong with ``value`` for sampling field ``name`` ("must be ..., got ..."), or None if it is fine."""
    return BY_NAME[name].problem(value)


class SamplingError(PpdError):
    """A sampling value its field's rule refuses; ``field`` names the field, ``problem`` says what is wrong."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field.replace('_', '-')} {problem}")
        self.field, self.problem = field, problem


@dataclass(frozen=True)
class SamplingParams:
    # the sampling fields (``fields.py`` declares them: ranges, defaults, names); then how guesses are verified
    temperature: float = TEMPERATURE.default  # 0: greedy
    top_p: float = TOP_P.default  # nucleus: keep the smallest set of tokens with at least this mass
    top_k: int = TOP_K.default  # keep the k most likely tokens; 0: all
    acceptance: Acceptance = "lossless"
    seed: int | None = None  # reproducible sampling
    typical_epsilon: float = 0.09  # typical acceptance: p(candidate) > min(epsilon, alpha * exp(-entropy))
    typical_alpha: float = 0.3
    # llama.cpp's repetition penalties (``ppd_core/sampling/penalties.py``): off at these values
    repeat_penalty: float = REPEAT_PENALTY.default  # a seen token's logit divided by it (multiplied when <= 0)
    repeat_last_n: int = REPEAT_LAST_N.default  # the window: the sequence's last n tokens; -1: all; 0: no penalties
    presence_penalty: float = PRESENCE_PENALTY.default  # taken off a seen token's logit
    frequency_penalty: float = FREQUENCY_PENALTY.default  # taken off per time it was seen
    min_p: float = MIN_P.default  # keep the tokens at least this fraction as likely as the likeliest; 0: off

    def __post_init__(self):
        for field in SAMPLING_FIELDS:
            problem = field.problem(getattr(self, field.name))
            if problem:
                raise SamplingError(field.name, problem)
        if self.acceptance not in ACCEPTANCE_RULES:
            raise PpdError(f"unknown acceptance {self.acceptance!r}; choose one of {', '.join(ACCEPTANCE_RULES)}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:  # a 64-bit seed, as the OpenAI API takes
            raise SamplingError("seed", f"must be a 64-bit integer, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any repetition penalty changes the logits (llama.cpp's test)."""
        return self.repeat_last_n != 0 and (self.repeat_penalty != 1.0 or self.presence_penalty != 0.0
                                            or self.frequency_penalty != 0.0)

    @property
    def lossless(self) -> bool:
        """Whether the output follows the model's distribution exactly."""
        return self.greedy or self.acceptance == "lossless"

    def describe(self) -> dict:
        """The settings as reported in JSON output."""
        return {**self.values(), "acceptance": self.acceptance, "distribution_preserving": self.lossless}

    def values(self) -> dict:
        """{field: value} of every sampling field (``fields.FIELDS``' names and order)."""
        return {name: getattr(self, name) for name in NAMES}

    def generator(self) -> np.random.Generator:
        """NumPy's PCG64, seeded by ``seed`` (negative seeds as their 64-bit pattern), else from the OS."""
        import numpy as np  # here only: the command line reads (and checks) the settings before anything heavy

        return np.random.default_rng(None if self.seed is None else self.seed % 2**64)


GREEDY = SamplingParams()


# llama.cpp's keys for a model's recommendation, by ``generation_config.json``'s names
GGUF_SAMPLING = {field.config_name or field.name: (field.gguf, field.kind) for field in SAMPLING_FIELDS if field.gguf}
SAMPLED = tuple(field.name for field in SAMPLING_FIELDS if field.sampled)  # set only where it samples (``do_sample``)


def gguf_sampling(metadata) -> dict:
    """A GGUF file's recommended sampling (``metadata(key)`` gives a value as text or None) in
    ``generation_config.json``'s terms (``do_sample`` where it sets a sampler, ``repetition_penalty``), plus
    ``repeat_last_n`` (llama.cpp's window, which transformers lacks); {} where it sets none."""
    found = {}
    for name, (key, kind) in GGUF_SAMPLING.items():
        text = metadata(key)
        try:
            found[name] = kind(float(text)) if text is not None else None
        except ValueError:
            continue
    found = {name: value for name, value in found.items() if value is not None}
    return {"do_sample": True, **found} if any(name in found for name in SAMPLED) else found


def recommended(generation_config: dict) -> dict:
    """What a model's ``generation_config.json`` (or its GGUF's keys, ``gguf_sampling``) recommends, in
    SamplingParams' terms: temperature, top-p and top-k where it samples (``do_sample``, as transformers reads them),
    and its repetition penalty (transformers' counts the whole sequence: ``repeat_last_n`` -1, unless a GGUF names
    a window). Values ppd cannot use are left out."""
    picked = {}
    if generation_config.get("do_sample"):
        picked = {name: generation_config[name] for name in SAMPLED if generation_config.get(name) is not None}
    penalty = generation_config.get("repetition_penalty")
    if penalty is not None and penalty != 1.0:
        picked["repeat_penalty"] = float(penalty)
        picked["repeat_last_n"] = int(generation_config.get("repeat_last_n", -1))
    usable = {}
    for names in (SAMPLED, ("repeat_penalty", "repeat_last_n")):
        group = {name: picked[name] for name in names if name in picked}
        try:
            SamplingParams(**group)
            usable.update(group)
        except (PpdError, TypeError):
            continue
    return usable


# llama-server's defaults (common/common.h, ``common_params_sampling``) for the fields ppd takes
LLAMA_SERVER = {field.name: field.server_default for field in SAMPLING_FIELDS}
PPD_MEASURED = {"repeat_penalty": 1.1, "repeat_last_n": 64}
FIELDS = NAMES
FROM_MODEL, FROM_PPD, FROM_SERVER = "the model", "ppd's default (measured)", "llama-server's default"


@dataclass(frozen=True)
class ChosenSampling:
    """A value for every sampling field, and where it came from (``FROM_*``)."""

    values: dict
    sources: dict

    def params(self, **overrides) -> SamplingParams:
        """SamplingParams of these values, ``overrides`` (a request's own fields; None: unset) taking precedence."""
        picked = {**self.values, **{name: value for name, value in overrides.items() if value is not None}}
        return SamplingParams(**picked)

    def describe(self) -> dict:
        """{field: {"value", "from"}} for JSON (``/v1/models``, the bench)."""
        return {name: {"value": self.values[name], "from": self.sources[name]} for name in FIELDS}


def default_sampling(recommended: dict) -> ChosenSampling:
    """Every field's default for a model recommending ``recommended`` (``recommended``'s dict)."""
    values, sources = {}, {}
    repeat_from_model = "repeat_penalty" in recommended
    for name in FIELDS:
        if name in recommended:
            values[name], sources[name] = recommended[name], FROM_MODEL
        elif name in PPD_MEASURED and not repeat_from_model:  # a model's own penalty comes with its own window
            values[name], sources[name] = PPD_MEASURED[name], FROM_PPD
        else:
            values[name], sources[name] = LLAMA_SERVER[name], FROM_SERVER
    return ChosenSampling(values, sources)
