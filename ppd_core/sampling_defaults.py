"""The sampling a request gets for what it leaves unset, the same for the page and the API, and where each value came
from: the model's recommendation (its GGUF's ``general.sampling.*`` keys or its ``generation_config.json``), else
ppd's measured repeat penalty, else llama-server's default for that field.

llama-server leaves repetition unguarded (``repeat_penalty`` 1.0) and the embedded default model then loops: ppd's
default is the penalty Ollama and LM Studio apply (1.1 over the last 64 tokens), kept because it was measured to stop
the loops (``benchmarks/scripts/loop_rate.py``; the README has the figures).
"""

from __future__ import annotations

from dataclasses import dataclass

from ppd_core.sampling_params import SamplingParams

# llama-server's defaults (common/common.h, ``common_params_sampling``) for the fields ppd takes
LLAMA_SERVER = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repeat_penalty": 1.0, "repeat_last_n": 64,
                "presence_penalty": 0.0, "frequency_penalty": 0.0}
PPD_MEASURED = {"repeat_penalty": 1.1, "repeat_last_n": 64}
FIELDS = tuple(LLAMA_SERVER)
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
    """Every field's default for a model recommending ``recommended`` (``sampling_params.recommended``'s dict)."""
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
