"""ppd_core's public API: the session API, what app/ (and a script) needs to load a model and stream answers.

    from ppd_core import Engine, EngineConfig
    engine = Engine.load(EngineConfig(model="default"))

A type checker reads the imports under ``TYPE_CHECKING``; at run time a name's module is imported on first use
(PEP 562, ``_WHERE``), so ``import ppd_core`` and ``import ppd_core.errors`` stay cheap and a chat on a GGUF never
imports torch. A tool's names (calibration, training, quantizing, perplexity, diagnostics, the hub...) are imported
from their own modules by the commands that use them.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing; type checkers take it as True
if TYPE_CHECKING:
    from ppd_core.answer_request import AnswerRequest, Mode, PromptTooLongError, RequestError
    from ppd_core.engine import Engine, GenerationEvent, GenerationResult
    from ppd_core.engine_load import EngineConfig
    from ppd_core.errors import PpdError
    from ppd_core.backends.llamacpp.grammar import json_grammar, schema_grammar
    from ppd_core.plan import DecodePlan, LookupPolicy
    from ppd_core.sampling.logits import MAX_TOP_LOGPROBS
    from ppd_core.sampling.constraint import GrammarError
    from ppd_core.sampling.params import GREEDY, Acceptance, ChosenSampling, SamplingError, SamplingParams
    from ppd_core.snapshot import ModelSnapshot, PromptTokensInfo
    from ppd_core.stats import GenerationStats, StepStats, StopReason
    from ppd_core.text import UnencodableText

_WHERE = {  # name -> the module that defines it: the imports above, for run time
    "AnswerRequest": "ppd_core.answer_request", "Mode": "ppd_core.answer_request",
    "PromptTooLongError": "ppd_core.answer_request", "RequestError": "ppd_core.answer_request",
    "Engine": "ppd_core.engine", "GenerationEvent": "ppd_core.engine", "GenerationResult": "ppd_core.engine",
    "EngineConfig": "ppd_core.engine_load",
    "PpdError": "ppd_core.errors",
    "GrammarError": "ppd_core.sampling.constraint",
    "json_grammar": "ppd_core.backends.llamacpp.grammar", "schema_grammar": "ppd_core.backends.llamacpp.grammar",
    "DecodePlan": "ppd_core.plan", "LookupPolicy": "ppd_core.plan",
    "MAX_TOP_LOGPROBS": "ppd_core.sampling.logits",
    "GREEDY": "ppd_core.sampling.params", "Acceptance": "ppd_core.sampling.params",
    "ChosenSampling": "ppd_core.sampling.params", "SamplingParams": "ppd_core.sampling.params",
    "SamplingError": "ppd_core.sampling.params",
    "ModelSnapshot": "ppd_core.snapshot", "PromptTokensInfo": "ppd_core.snapshot",
    "GenerationStats": "ppd_core.stats", "StepStats": "ppd_core.stats", "StopReason": "ppd_core.stats",
    "UnencodableText": "ppd_core.text",
}
__all__ = [
    "Acceptance", "AnswerRequest", "ChosenSampling", "DecodePlan", "Engine", "EngineConfig", "GREEDY", "GenerationEvent",
    "GenerationResult", "GenerationStats", "GrammarError", "LookupPolicy", "MAX_TOP_LOGPROBS", "Mode", "ModelSnapshot",
    "PpdError", "PromptTokensInfo", "PromptTooLongError", "RequestError", "SamplingError", "SamplingParams", "StepStats", "StopReason",
    "UnencodableText", "json_grammar", "schema_grammar",
]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_WHERE[name]), name)
