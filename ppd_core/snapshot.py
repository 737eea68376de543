"""A read-only picture of the loaded model and its decode plan, for the page, the API and the device panel.

    snapshot = take_snapshot(engine.loaded, engine.prompt_tokens, engine.plan, engine.max_context)

Taken at one moment (an API answer takes it with its first step), so a model switched meanwhile can neither
relabel an answer nor be half-read; nothing in ``app/`` reaches into the engine's loaded model for these facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ppd_core.device_policy import policy_summary
from ppd_core.drafters.lookup import MATCH_CLASSES, class_label
from ppd_core.sampling.params import ChosenSampling, default_sampling
from ppd_core.sampling.params import recommended

if TYPE_CHECKING:
    from ppd_core.backend import BackendInfo
    from ppd_core.calibration.profiles import DeviceProfile
    from ppd_core.loaded import LoadedModel
    from ppd_core.backend_registry import BackendName
    from ppd_core.plan import DecodePlan
    from ppd_core.drafters.prompt_tokens import PromptTokens


@dataclass(frozen=True)
class PromptTokensInfo:
    count: int  # prompt tokens (0: none, lookup guesses only)
    ensemble_size: int
    trained: bool
    base_model: str
    bytes: int


@dataclass(frozen=True)
class ModelSnapshot:
    name: str
    backend: BackendName
    kernels: dict  # the backend's own description (threads, offload, KV cache, build)
    quant: str  # "gguf" (the file's own, on llama.cpp), "none", "4bit", "8bit"
    dtype: str  # "float32", "bfloat16", ...
    device: str  # "cpu", "cuda:0", ...
    device_kind: str  # "cpu" or "cuda"
    forward: str  # "llamacpp", "lean" or "transformers"
    weights_bytes: int
    max_context: int
    threads: int
    bitwise: bool  # tree rows equal plain steps bit for bit here
    exactness: str  # that, as one sentence for the page
    plain_only: str | None  # why every answer decodes plainly (a recurrent cache), or None
    template_note: str | None  # where chats do not use the model's own template (ChatML), or None
    prompt_tokens: PromptTokensInfo
    tree: dict  # ``tree_summary``
    calibration: dict | None  # ``DecodePlan.expectation``
    profile: DeviceProfile | None  # the one decoding follows, if any
    expected_speedup: float | None
    device_policy: dict  # ``device_policy.policy_summary``
    recommended_sampling: dict  # temperature / top-p / top-k / repeat penalty the model recommends ({}: none)
    overhead_bytes: int  # PPD's extra memory: the prompt embeddings and the trees' masks
    info: BackendInfo  # the backend's own record (the device's properties and memory reader)

    @property
    def sampling_defaults(self) -> ChosenSampling:
        """What a request (the page's or the API's) gets for a field it leaves unset, and where it came from."""
        return default_sampling(self.recommended_sampling)


def take_snapshot(loaded: LoadedModel, tokens: PromptTokens, plan: DecodePlan, max_context: int) -> ModelSnapshot:
    """What the page, the API and the device panel show of ``loaded`` decoding by ``plan``, as it is now."""
    info = loaded.info
    return ModelSnapshot(
        name=loaded.name, backend=info.name, kernels=dict(info.kernels), quant=loaded.quant,
        dtype=info.dtype, device=info.device, device_kind=info.device_kind,
        forward=info.forward, weights_bytes=loaded.num_bytes, max_context=max_context, threads=info.threads,
        bitwise=info.bitwise, exactness=exactness(info.bitwise),
        plain_only=info.tree_note if plan.guesses.plain_only else None, template_note=loaded.template_note,
        prompt_tokens=PromptTokensInfo(tokens.num_prompt_tokens, tokens.ensemble_size,
                                       bool(tokens.training.get("trained")), tokens.base_model, tokens.num_bytes),
        tree=tree_summary(plan), calibration=plan.expectation, profile=plan.profile,
        expected_speedup=plan.expected_speedup, device_policy=policy_summary(info.properties),
        recommended_sampling=recommended(loaded.generation_config),
        overhead_bytes=tokens.num_bytes + sum(t.attention_mask.size for t in plan.family.trees), info=info,
    )


def thread_count(loaded: LoadedModel) -> int:
    """CPU threads a step runs on: llama.cpp's, or torch's (process-wide; as last set through the backend)."""
    return loaded.info.threads


def exactness(bitwise: bool) -> str:
    """How greedy PPD output relates to plain decoding's on this path, in one sentence."""
    if bitwise:
        return "bitwise: every tree row gets the logits plain decoding gives it, so greedy output is identical"
    return ("equal up to floating-point near-ties: tree steps round differently from single steps here, which "
            "can flip a near-tie between two tokens (rare; then the answers part there)")


def tree_summary(plan: DecodePlan) -> dict:
    """The tree PPD decodes with: its name and sizes (the deepest tree, used when guesses reach every depth)."""
    deepest = plan.family.trees[-1]
    return {
        "name": plan.family.name,
        "tokens_per_step": deepest.num_tokens,
        "candidates": deepest.num_nodes - 1,
        "prompt_tokens": deepest.num_tokens - deepest.num_nodes,
        "tokens_by_guess_depth": [tree.num_tokens for tree in plan.family.trees],
        "lookup_chain_by_match_length": list(plan.lookup_lengths),  # by match class; empty: no lookup guesses
        "lookup_policy": plan.lookup_policy,
        "lookup_match_classes": [class_label(i) for i in range(len(MATCH_CLASSES))],
        "padded_rows": plan.padded_rows,  # every PPD step decoded as this many rows; None: each its own shape
        "step_policy": plan.profile.policy.line() if plan.profile is not None else "no calibration yet",
    }
