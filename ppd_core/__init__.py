"""ppd_core's public API: what app/ (and a script) imports, each name from the module that defines it.

    from ppd_core import Engine, EngineConfig
    engine = Engine.load(EngineConfig(model="default"))

A name's module is imported on first use (PEP 562), so ``import ppd_core.errors`` stays cheap and a chat on a GGUF
never imports torch (training) or llama.cpp's quantizer.
"""

from __future__ import annotations

import importlib

_MODULES = {  # module -> its public names ("name:attribute" where the module calls it otherwise; never a module's name)
    "ppd_core.engine": "Engine GenerationEvent GenerationResult",
    "ppd_core.engine_load": "EngineConfig user_prompt_tokens_path model_signature live_llama_cpp_models",
    "ppd_core.plan": "DecodePlan PlanOptions make_plan",
    "ppd_core.snapshot": "ModelSnapshot PromptTokensInfo take_snapshot",
    "ppd_core.calibration.verbs": "calibrate_engine calibrate_with_curve record_acceptance export_acceptance "
                                  "saved_profile step_curve latency_curve next_token_logits",
    "ppd_core.calibration.calibrate": "profile_key",
    "ppd_core.calibration.profiles": "DeviceProfile profile_path",
    "ppd_core.calibration.curves": "LatencyCurve read_curve",
    "ppd_core.calibration.prices": "DRIFT LiveEstimate StepPrices",
    "ppd_core.calibration.tree_search": "step_seconds",
    "ppd_core.calibration.type_curves": "TYPE_CURVE_CONTEXT TYPE_CURVE_SIZES other_type_curves",
    "ppd_core.training.trainer": "TrainConfig",
    "ppd_core.training.pipeline": "TrainRun run_training",
    "ppd_core.training.greedy": "reference_answer",
    "ppd_core.training.cost": "TrainSize TrainingCost training_cost calibrated_step answered_step model_shape",
    "ppd_core.answer_request": "AnswerRequest RequestError PromptTooLongError",
    "ppd_core.loading": "load_model model_path",
    "ppd_core.backends.llamacpp.library": "chat_model",
    "ppd_core.drafters.prompt_tokens": "PromptTokens",
    "ppd_core.options": "MAX_LOOKUP",
    "ppd_core.static_trees": "STATIC_TREES",
    "ppd_core.sampling.params": "GREEDY SamplingParams ChosenSampling default_sampling",
    "ppd_core.sampling.logits": "MAX_TOP_LOGPROBS",
    "ppd_core.backends.llamacpp.grammar": "GrammarError json_grammar schema_grammar",
    "ppd_core.stats": "GenerationStats",
    "ppd_core.text": "TextStream UnencodableText text_stream utf8",
    "ppd_core.drafters.lookup": "chains_text",
    "ppd_core.device_info": "describe memory_of",
    "ppd_core.memory": "limit_malloc_arenas",
    "ppd_core.diagnostics": "NEAR_TIE_LOGITS AnswerComparison compare_answer probe_environment verdict",
    "ppd_core.backends.llamacpp.perplexity": "SHIPPED_TEXT perplexity_of:perplexity",
    "ppd_core.backends.llamacpp.quantize": "read_source QUANT_TYPES:TYPES quantize_plan:plan quantize_model:quantize",
}
_WHERE = {name.split(":")[0]: (module, name.split(":")[-1]) for module, names in _MODULES.items() for name in names.split()}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _WHERE[name]
    return getattr(importlib.import_module(module), attribute)
