"""The public API, and the engine session: a loaded model with its prompt tokens and trees streams answers, PPD or
plain, keeping the last conversation's cache for the next turn. The load sequence is ``engine_load``; what the page
and the API show is ``snapshot``.

    engine = Engine.load(EngineConfig(model="default"))
    for event in engine.stream(engine.chat_ids([{"role": "user", "content": "Hi"}])):
        print(event.delta, end="")
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppd_core import decoding
from ppd_core.backends.llamacpp import LIVE_MODELS, chat_model
from ppd_core.calibration.calibrate import Progress, acceptance_key, calibrate, measure_record, profile_key
from ppd_core.calibration.curves import LatencyCurve, read_curve
from ppd_core.calibration.calibrate import within
from ppd_core.calibration.latency import mean_curve, measure_latency, step_seconds
from ppd_core.calibration.prices import DRIFT, LiveEstimate, StepPrices  # noqa: F401 - app/'s readout
from ppd_core.calibration.prior import forced_chains, uncalibrated_chains
from ppd_core.calibration.profiles import DeviceProfile, ProfileError, load_profile, save_profile
from ppd_core.calibration.records import beside, copy_records, save_record
from ppd_core.calibration.type_curves import CONTEXT as TYPE_CURVE_CONTEXT, SIZES as TYPE_CURVE_SIZES  # noqa: F401
from ppd_core.calibration.type_curves import other_type_curves  # noqa: F401 - `ppd calibrate` on an F16/BF16/Q8_0 file
from ppd_core.calibration.tree_search import design_family
from ppd_core.decoding import check_prompt_fits
from ppd_core.device_info import describe, memory_of
from ppd_core.device_policy import policy_summary, properties_of
from ppd_core.diagnostics import NEAR_TIE_LOGITS, AnswerComparison, compare_answer, probe_environment, verdict
from ppd_core.engine_load import (
    EngineConfig, load_engine, model_signature, user_prompt_tokens_path,
)
from ppd_core.errors import PpdError
from ppd_core.forced import ForcedText, char_tokens
from ppd_core.loading import LoadedModel, load_model, model_path  # noqa: F401 - app/'s `ppd quantize` reads model_path
from ppd_core.memory import limit_malloc_arenas, release_free_heap
from ppd_core.logprobs import MAX_TOP_LOGPROBS  # noqa: F401 - app/'s API reads it here
from ppd_core.grammar import GrammarError, json_grammar, schema_grammar  # noqa: F401 - app/'s API reads them here
from ppd_core.lookup import MATCH_CLASSES, chains_text, class_label
from ppd_core.lookup_policy import AdaptiveChains, ChainPolicy, FixedChains
from ppd_core.options import MAX_LOOKUP
from ppd_core.perplexity import SHIPPED_TEXT, perplexity  # noqa: F401 - app/'s `ppd quantize`
from ppd_core.prompt_tokens import PromptTokens
from ppd_core.quantize import TYPES as QUANT_TYPES, plan as quantize_plan, quantize, read_source  # noqa: F401 - `ppd quantize`
from ppd_core.sampling_defaults import ChosenSampling, default_sampling  # noqa: F401 - app/'s defaults
from ppd_core.sampling_params import GREEDY, SamplingParams, recommended
from ppd_core.snapshot import ModelSnapshot, PromptTokensInfo
from ppd_core.static_trees import STATIC_TREES
from ppd_core.stats import GenerationStats, StepStats
from ppd_core.text import TextStream, UnencodableText, chat_ids, text_stream, utf8  # noqa: F401 - app/'s API: the last two
from ppd_core.tree import TreeFamily, family_from_specs, vanilla_family

# engine.py is the API app/ uses: app/ imports from ppd_core through this module only.
__all__ = [
    "Engine", "EngineConfig", "GenerationEvent", "GenerationResult",  # defined here
    "ModelSnapshot", "PromptTokensInfo",
    "MAX_LOOKUP", "STATIC_TREES",  # command-line choices
    "GREEDY", "GenerationStats", "SamplingParams", "TextStream", "text_stream",
    "DeviceProfile", "PromptTokens", "check_prompt_fits", "load_model",
    "TrainConfig", "TrainRun", "run_training", "user_prompt_tokens_path", "model_signature", "chains_text",
    "describe", "memory_of", "chat_model", "limit_malloc_arenas", "LatencyCurve", "read_curve", "live_llama_cpp_models",
    "NEAR_TIE_LOGITS", "AnswerComparison", "compare_answer", "probe_environment", "verdict",  # `ppd doctor`
    "DRIFT", "LiveEstimate", "StepPrices",  # the page's live speedup estimate
]

# training needs torch: its names load on first use, so a chat on a GGUF never imports it
LAZY = {"TrainConfig": "ppd_core.training.trainer", "TrainRun": "ppd_core.training.pipeline",
        "run_training": "ppd_core.training.pipeline"}


def __getattr__(name: str):
    if name in LAZY:
        import importlib  # noqa: PLC0415

        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def live_llama_cpp_models() -> int:
    """llama.cpp models loaded in this process now (``/health`` reports it: a failed load must leave none behind)."""
    return len(LIVE_MODELS)


MODES = ("ppd", "vanilla")
log = logging.getLogger(__name__)


@dataclass
class GenerationEvent:
    """The answer so far, after one forward pass."""

    text: str
    delta: str  # text added by this step
    tokens: list[int]  # answer token ids so far
    step: StepStats
    stats: GenerationStats
    stop_reason: str | None = None  # set on the last event

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None


@dataclass
class KeptCache:
    """The KV cache of the last conversation streamed with ``reuse_cache``: its next turn starts from it."""

    cache: object  # the backend's
    ids: list[int]  # the tokens whose keys and values the cache holds
    chains: ChainPolicy | None = None  # the conversation's lookup chain policy: what its turns so far taught it


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    stats: GenerationStats
    stop_reason: str
    steps: list[StepStats] = field(default_factory=list)


class Engine:
    """A frozen model, its prompt tokens and the current tree; streams answers."""

    def __init__(self, loaded: LoadedModel, prompt_tokens: PromptTokens, family: TreeFamily, max_context: int):
        self.loaded = loaded
        self.prompt_tokens = prompt_tokens
        self.family = family
        self.max_context = max_context
        self.profile: DeviceProfile | None = None  # the calibration behind ``family``, if any
        self.tree_budget: int | None = None  # a budget asked for instead of the profile's choice
        self.profile_path: Path | None = None  # where the last calibration was saved
        self._kept: KeptCache | None = None
        self._vanilla = vanilla_family()
        self._prompt_table = prompt_tokens.table() if prompt_tokens.num_prompt_tokens else None  # [n * V, hidden]
        self.lookup_lengths: tuple[int, ...] = ()  # n-gram lookup chain length by match class (empty: none)
        self._lookup: int | None = None  # the asked-for chain length; None: the profile's
        self.chain_policy = "adaptive"  # with a profile: chains learnt per conversation, or "fixed": calibration's
        self.awaiting_calibration = False  # --tree auto with no profile yet: plain steps and prior chains meanwhile
        self._char_tokens: dict[str, int] | None = None  # the forced-text drafter's single-character tokens

    @classmethod
    def load(cls, config: EngineConfig, progress: Progress | None = None) -> Engine:
        """Load the model and prompt tokens and pick the tree (``engine_load``); ``progress`` hears a calibration."""
        return load_engine(cls, config, progress)

    def profile_key(self) -> dict:
        return profile_key(self.loaded, self.prompt_tokens)

    def saved_profile(self) -> DeviceProfile | None:
        """The profile saved for this device, model and prompt tokens; a corrupt or stale one is ignored with a warning."""
        try:
            return load_profile(self.profile_key())
        except ProfileError as error:
            log.warning("ignoring the saved calibration: %s; recalibrating", error)
            return None

    def step_curve(self, sizes: Sequence[int], context: int) -> dict[int, float]:
        """Milliseconds of one step of each size in ``sizes`` rows after ``context`` cached tokens, on this model."""
        return measure_latency(self.loaded.backend, None, 0, 1, sizes, (context,), repeats=5)[context]

    def calibrate(self, progress: Progress | None = None, **options) -> DeviceProfile:
        """Measure this device, save the profile, and switch to its tree."""
        log.warning("calibrating the guess tree for this device")
        profile = calibrate(self.loaded, self.prompt_tokens, progress, **options)
        self.profile_path = save_profile(profile)
        self.use_profile(profile)
        return profile

    def calibrate_with_curve(self, curve: LatencyCurve | str | Path, progress: Progress | None = None,
                             **options) -> DeviceProfile:
        """Choose the tree and chains for another device's step-latency curve (``read_curve``'s file) with this
        model's guess acceptance, timing nothing here. The profile describes that device: it is neither saved nor
        decoded with here."""
        if not isinstance(curve, LatencyCurve):
            curve = read_curve(curve)
        return calibrate(self.loaded, self.prompt_tokens, progress, curve=curve, **options)

    def record_acceptance(self, progress: Progress | None = None, prompts: int = 12, max_new_tokens: int = 96) -> Path:
        """Measure the guesses' acceptance with this engine's numerics and write the record beside the prompt-token
        file, where every later calibration with the same numerics finds it (``ppd train`` does this)."""
        if self.prompt_tokens.source is None:
            raise PpdError("these prompt tokens were not read from a file: nowhere to put their acceptance record")
        key = acceptance_key(self.loaded, self.prompt_tokens, prompts, max_new_tokens)
        record = measure_record(self.loaded, self.prompt_tokens, key, prompts, max_new_tokens,
                                progress or (lambda phase, done, total: None))
        return save_record(record, beside(self.prompt_tokens.source))

    def recommended_sampling(self) -> dict:
        """Temperature / top-p / top-k from the model's generation config where it samples; {} for greedy."""
        return recommended(self.loaded.generation_config)

    def export_acceptance(self, path: Path, profile: DeviceProfile | None = None) -> Path:
        """Write the acceptance record the last calibration (or ``profile``'s) used to ``path``, e.g. beside a
        prompt-token file to ship (``NAME.acceptance.json``): calibrations elsewhere then measure only their latency curve."""
        profile = profile or self.profile
        if profile is None or not profile.acceptance_from:
            raise PpdError("no calibration has measured the guesses' acceptance yet")
        if not copy_records(Path(profile.acceptance_from), self.prompt_tokens.fingerprint, path):
            raise PpdError(f"{profile.acceptance_from} holds no record for these prompt tokens")
        return path

    def set_lookup(self, length: int | str | None) -> None:
        """Lookup chains of up to ``length`` tokens (0: none); None: learnt per conversation from the profile's figures
        (``new_chains``); "fixed": the lengths calibration chose (none without a profile)."""
        self.chain_policy = "fixed" if length == "fixed" else "adaptive"
        self._lookup = None if length == "fixed" else length
        self._refresh_lookup()

    def _refresh_lookup(self) -> None:
        """``lookup_lengths`` for the asked-for length or the profile in use."""
        length = self._lookup
        if length is None:
            self.lookup_lengths = tuple(self.profile.lookup_lengths) if self.profile is not None else ()
        else:
            self.lookup_lengths = (length,) * len(MATCH_CLASSES) if length else ()

    def lookup_policy(self) -> str:
        """"adaptive" (chains learnt per conversation, ``new_chains``), "fixed" or "none"."""
        profile = self.profile
        if self._lookup is None and self.chain_policy == "adaptive" and (
                (profile is not None and profile.lookup_acceptance) or self.awaiting_calibration):
            return "adaptive"
        return "fixed" if any(self.lookup_lengths) else "none"

    def new_chains(self) -> ChainPolicy | None:
        """A new conversation's lookup chain policy: the asked-for length (``set_lookup``), or, with a profile,
        chains learnt per conversation from calibration's acceptance and latency curve (``AdaptiveChains``; "fixed":
        calibration's lengths); None: no lookup."""
        profile = self.profile
        if self.lookup_policy() == "adaptive" and self.awaiting_calibration:
            return uncalibrated_chains()
        if self.lookup_policy() == "adaptive":
            return AdaptiveChains(profile.lookup_acceptance, *self._chain_pricing())
        return FixedChains(self.lookup_lengths) if any(self.lookup_lengths) else None

    def _chain_pricing(self) -> tuple:
        """(seconds of a step of so many rows, tokens per step of the trees, their rows) on the profile's curve."""
        profile = self.profile
        seconds = profile.policy.seconds(within(step_seconds(profile.latency_ms), max(mean_curve(profile.latency_ms))))
        tokens_per_step = self.calibration_expectation()["expected_tokens_per_step"] or 1.0
        return seconds, tokens_per_step, self.family.trees[-1].num_tokens

    def new_forced_text(self) -> ForcedText:
        """One answer's drafter of the text its grammar forces (``ppd_core.forced``)."""
        tokenizer = self.tokenizer

        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False)

        if self._char_tokens is None:
            self._char_tokens = char_tokens(encode)
        return ForcedText(self._char_tokens, encode, lambda token: tokenizer.token_bytes(token).decode(errors="replace"))

    def new_forced_chains(self) -> ChainPolicy:
        """How long a chain of forced text to draft: learnt per answer, priced on the profile's curve if any."""
        if self.profile is None or self.awaiting_calibration or not self.profile.latency_ms:
            return forced_chains()
        return forced_chains(*self._chain_pricing())

    @property
    def padded_rows(self) -> int | None:
        """The rows every PPD step is padded to (the profile's ``fixed`` step policy); None: each step its own shape
        (also with a tree budget asked for, whose trees were priced between 1-token steps)."""
        if self.profile is None or self.tree_budget is not None:
            return None
        return self.profile.policy.pads

    def use_profile(self, profile: DeviceProfile, budget: int | None = None) -> None:
        """Decode with the profile's chosen trees, or with the best trees for ``budget`` tokens."""
        self.profile, self.tree_budget, self.awaiting_calibration = profile, budget, False
        self._refresh_lookup()
        if budget is None:
            self.set_tree(profile.family())
            return
        n, V = self.prompt_tokens.num_prompt_tokens, self.prompt_tokens.ensemble_size
        self.set_tree(family_from_specs(f"budget-{budget}", design_family(profile.acceptance, budget, n, V), n, V))

    def device_policy(self) -> dict:
        """What the device policy chose here: compute dtype, attention kernels (torch backend), memory source."""
        return policy_summary(properties_of(self.loaded.device, self.threads))

    def exactness(self) -> str:
        """How greedy PPD output relates to plain decoding's on this path, in one sentence."""
        if self.loaded.backend.bitwise:
            return "bitwise: every tree row gets the logits plain decoding gives it, so greedy output is identical"
        return ("equal up to floating-point near-ties: tree steps round differently from single steps here, which "
                "can flip a near-tie between two tokens (rare; then the answers part there)")

    @property
    def threads(self) -> int:
        """CPU threads a step runs on: llama.cpp's, or torch's (process-wide)."""
        threads = self.loaded.kernels.get("threads")
        if threads:
            return threads
        import torch  # noqa: PLC0415 - the torch backend's own setting

        return torch.get_num_threads()

    @property
    def plain_only(self) -> bool:
        """The model's cache cannot hold a tree (recurrent or hybrid): every answer decodes plainly."""
        return self.loaded.backend.tree_note is not None

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def snapshot(self) -> ModelSnapshot:
        """What the page, the API and the device panel show of this model, as it is now."""
        loaded, tokens = self.loaded, self.prompt_tokens
        return ModelSnapshot(
            name=loaded.name, backend=loaded.backend.name, kernels=dict(loaded.kernels), quant=loaded.quant,
            dtype=str(loaded.dtype).removeprefix("torch."), device=str(loaded.device), device_kind=loaded.device_kind,
            forward=loaded.forward, weights_bytes=loaded.num_bytes, max_context=self.max_context, threads=self.threads,
            bitwise=loaded.backend.bitwise, exactness=self.exactness(),
            plain_only=loaded.backend.tree_note if self.plain_only else None, template_note=loaded.template_note,
            prompt_tokens=PromptTokensInfo(tokens.num_prompt_tokens, tokens.ensemble_size,
                                           bool(tokens.training.get("trained")), tokens.base_model, tokens.num_bytes),
            tree=self.tree_summary(), calibration=self.calibration_expectation(), profile=self.profile,
            expected_speedup=self.expected_speedup(), device_policy=self.device_policy(),
            recommended_sampling=self.recommended_sampling(),
        )

    def tree_summary(self) -> dict:
        """The tree PPD decodes with: its name and sizes (the deepest tree, used when guesses reach every depth)."""
        deepest = self.family.trees[-1]
        return {
            "name": self.family.name,
            "tokens_per_step": deepest.num_tokens,
            "candidates": deepest.num_nodes - 1,
            "prompt_tokens": deepest.num_tokens - deepest.num_nodes,
            "tokens_by_guess_depth": [tree.num_tokens for tree in self.family.trees],
            "lookup_chain_by_match_length": list(self.lookup_lengths),  # by match class; empty: no lookup guesses
            "lookup_policy": self.lookup_policy(),
            "lookup_match_classes": [class_label(i) for i in range(len(MATCH_CLASSES))],
            "padded_rows": self.padded_rows,  # every PPD step decoded as this many rows; None: each its own shape
            "step_policy": self.profile.policy.line() if self.profile is not None else "no calibration yet",
        }

    def expected_speedup(self) -> float | None:
        """Calibration's expected speedup for what decodes now: with its lookup chains while they are on."""
        if self.profile is None:
            return None
        chains = any(self.lookup_lengths) and list(self.lookup_lengths) == self.profile.lookup_lengths
        return self.profile.expected_speedup_with_lookup if chains else self.profile.expected_speedup

    def calibration_expectation(self) -> dict | None:
        """What calibration expects of the tree in use (None without a profile)."""
        if self.profile is None:
            return None
        budget = self.tree_budget or self.profile.budget
        row = next((r for r in self.profile.budgets if r["budget"] == budget), {})
        return {
            "budget": budget,
            "chosen_budget": self.profile.budget,
            "expected_tokens_per_step": row.get("tokens_per_step"),
            "expected_tokens_per_second": row.get("tokens_per_second"),
            "expected_speedup_of_chosen": self.profile.expected_speedup,
            "lookup_lengths": self.profile.lookup_lengths,
            "expected_tokens_per_step_with_lookup": self.profile.expected_tokens_per_step_with_lookup,
            "expected_speedup_with_lookup": self.profile.expected_speedup_with_lookup,
            "expected_with_lookup_by_turn": self.profile.expected_with_lookup_by_turn,
        }

    @property
    def static_overhead_bytes(self) -> int:
        """PPD's extra memory: the prompt embeddings and the trees' masks."""
        return self.prompt_tokens.num_bytes + sum(t.attention_mask.size for t in self.family.trees)

    def set_tree(self, family: TreeFamily) -> None:
        self.family = vanilla_family() if self.plain_only else family

    def chat_ids(self, messages: Sequence[dict], **variables) -> list[int]:
        """Token ids of a conversation in the model's chat template, ready for the answer; ``variables`` (such as
        ``tools=[...]``) reach the template."""
        if not messages or not any(str(m.get("content", "")).strip() for m in messages if m.get("role") == "user"):
            raise PpdError("the message is empty")
        return chat_ids(self.tokenizer, messages, **variables)

    @property
    def chat_template(self) -> str:
        """The chat template's source ("" where the tokenizer names none)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else ""

    def completion_ids(self, text: str) -> list[int]:
        """Token ids of raw text to complete (a model without a chat template: ``ppd generate``)."""
        if not text.strip():
            raise PpdError("the text is empty")
        return self.tokenizer.encode(text, add_special_tokens=True)

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` adds to a text (a control token's own text): what API logprobs name it by."""
        tokenizer = self.tokenizer
        if hasattr(tokenizer, "token_bytes"):  # a GGUF's (llama.cpp's pieces, bytes exact)
            return tokenizer.token_bytes(token)
        return tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(int(token))]).encode()

    @property
    def has_chat_template(self) -> bool:
        """Whether the model brings its own chat template (else chats use ChatML, and say so)."""
        return self.loaded.template_note is None

    def check_grammar(self, grammar: str) -> None:
        """A PpdError (one line) unless this model can follow GBNF ``grammar``."""
        backend = self.loaded.backend
        if not hasattr(backend, "grammar"):
            raise PpdError("a grammar or JSON schema needs a GGUF model (llama.cpp's grammar engine)")
        backend.grammar(grammar).close()

    def stream(
        self,
        input_ids: Sequence[int],
        mode: str = "ppd",
        max_new_tokens: int = 256,
        guess_hook: decoding.GuessHook | None = None,
        reuse_cache: bool = False,
        sampling: SamplingParams = GREEDY,
        logprobs: int | None = None,
        grammar: str | None = None,
    ) -> Iterator[GenerationEvent]:
        """Yield the growing answer after every forward pass (the prompt's first).

        With ``reuse_cache`` the KV cache of the previous such call is kept and only the
        tokens after its longest common prefix with ``input_ids`` are prefilled (multi-turn chat).
        With ``logprobs`` (the number of alternatives, 0 to ``MAX_TOP_LOGPROBS``) each step's ``logprobs`` has its
        tokens' log-probabilities. With ``grammar`` (GBNF, a ``root`` rule) the answer follows it, in both modes.
        """
        if mode not in MODES:
            raise PpdError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        family = self.family if mode == "ppd" else self._vanilla
        cache, reused, chains = self._take_cache(input_ids) if reuse_cache else (None, 0, None)
        stats = GenerationStats(prompt_tokens=len(input_ids), reused_tokens=reused)
        tokens: list[int] = []
        text = text_stream(self.tokenizer)  # incremental: O(new tokens) per step
        if mode != "ppd" or self.plain_only:
            chains = None
        elif chains is None:  # a new conversation (a follow-up goes on with what its turns taught)
            chains = self.new_chains()
        backend = self.loaded.backend
        constraint = None
        if grammar is not None:
            if not hasattr(backend, "grammar"):
                raise PpdError("a grammar or JSON schema needs a GGUF model (llama.cpp's grammar engine)")
            constraint = backend.grammar(grammar)
        if getattr(backend, "pads_steps", False):  # the profile's step shape for PPD; plain decoding is 1-token steps
            backend.pad_steps(self.padded_rows if mode == "ppd" and not self.plain_only else None)
        speculator = decoding.Speculator(backend, family, self._prompt_table)
        forcing = constraint is not None and mode == "ppd" and not self.plain_only
        request = decoding.Request(input_ids[reused:], max_new_tokens, self.loaded.eos_token_ids, self.max_context,
                                   sampling, cache, guess_hook, history=input_ids[:reused], logprobs=logprobs,
                                   chains=chains, grammar=constraint,
                                   forced=self.new_forced_text() if forcing else None,
                                   forced_chains=self.new_forced_chains() if forcing else None)
        steps = decoding.generate(speculator, request)
        try:
            for step in steps:
                stats.add(step)
                if step.chain_match >= 0:  # the lookup proposed: what its policy made of it
                    done = f"drafted {step.chain} copied tokens" if step.chain else "drafted none"
                    stats.lookup_note = f"{done} ({chains.why(step.chain_match, step.chain)})"
                tokens.extend(step.tokens)
                delta = text.extend(step.tokens) + (text.flush() if step.stop else "")
                yield GenerationEvent(text.text, delta, list(tokens), step, stats, step.stop)
        except GeneratorExit:  # stopped by the consumer between steps: the cache is consistent
            if cache is not None:
                self._keep_cache(cache, list(input_ids) + tokens, chains)
            raise
        if cache is not None:
            self._keep_cache(cache, list(input_ids) + tokens, chains)

    def close(self) -> None:
        """Give the model's memory back (before another model loads: one model in memory at a time)."""
        self._kept = None
        self.loaded.backend.close()
        self.loaded.release_model()
        gc.collect()
        release_free_heap()

    def forget_conversation(self) -> None:
        """Drop the cache kept for the next turn: the next answer processes its whole prompt."""
        self._kept = None

    def _take_cache(self, input_ids: Sequence[int]) -> tuple[object, int, ChainPolicy | None]:
        """The kept cache cut to its common prefix with ``input_ids`` (at least one token left to prefill), and the
        kept conversation's chain policy where ``input_ids`` goes on with that whole conversation (a follow-up)."""
        kept, self._kept = self._kept, None
        if kept is None:
            return self.loaded.backend.new_cache(), 0, None
        common = 0
        for cached, new in zip(kept.ids, input_ids):
            if cached != new:
                break
            common += 1
        follow_up = common == len(kept.ids)
        common = min(common, len(input_ids) - 1)
        self.loaded.backend.truncate(kept.cache, common)
        return kept.cache, common, kept.chains if follow_up else None

    def _keep_cache(self, cache: object, ids: list[int], chains: ChainPolicy | None = None) -> None:
        """Keep ``cache`` (and the conversation's ``chains``) for the next turn, holding the keys and values of a
        prefix of ``ids``."""
        length = min(self.loaded.backend.cache_length(cache), len(ids))
        self.loaded.backend.truncate(cache, length)  # drops guesses accepted past a stop
        self._kept = KeptCache(cache, ids[:length], chains)

    def generate(self, input_ids: Sequence[int], mode: str = "ppd", max_new_tokens: int = 256, **kwargs) -> GenerationResult:
        """Run ``stream`` to the end."""
        steps = []
        event = None
        for event in self.stream(input_ids, mode, max_new_tokens, **kwargs):
            steps.append(event.step)
        return GenerationResult(event.text, event.tokens, event.stats, event.stop_reason, steps)

    def next_token_logits(self, input_ids: Sequence[int]) -> np.ndarray:
        """Plain decoding's logits [vocab] float32 for the token after ``input_ids``, from a fresh cache."""
        backend = self.loaded.backend
        cache = backend.new_cache()
        try:
            return backend.prefill(cache, list(input_ids)).rows(slice(0, 1))[0]
        finally:
            backend.truncate(cache, 0)

    def latency_curve(self, sizes: Sequence[int], contexts: Sequence[int] = (256,)) -> dict[int, dict[int, float]]:
        """Median ms of a PPD step over a tree of each of ``sizes`` tokens after each context length:
        ``{context: {tree tokens: ms}}``, measured as calibration does. The matmul kernel choice calibration
        made (where the forward has one) is kept."""
        return measure_latency(self.loaded.backend, self._prompt_table, self.prompt_tokens.num_prompt_tokens,
                               self.prompt_tokens.ensemble_size, sizes, contexts)

    def reference_generate(self, input_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """transformers ``generate(do_sample=False)``: the yardstick for exactness and speed."""
        import torch  # noqa: PLC0415 - transformers' own decoding, on request only

        model = self.loaded.model
        ids = torch.tensor([list(input_ids)], device=model.device)
        with torch.inference_mode():
            output = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=sorted(self.loaded.eos_token_ids),
                pad_token_id=self.tokenizer.pad_token_id or sorted(self.loaded.eos_token_ids)[0],
            )
        return output[0, ids.shape[1] :].tolist()
