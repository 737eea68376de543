"""A read-only picture of the loaded model, for the page, the API and the device panel.

Taken at one moment (an API answer takes it with its first step), so a model switched meanwhile can neither
relabel an answer nor be half-read; nothing in ``app/`` reaches into the engine's loaded model for these facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppd_core.sampling_defaults import ChosenSampling, default_sampling


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
    backend: str  # "llamacpp" or "torch"
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
    tree: dict  # ``Engine.tree_summary``
    calibration: dict | None  # ``Engine.calibration_expectation``
    profile: object | None  # the ``DeviceProfile`` decoding follows, if any
    expected_speedup: float | None
    device_policy: dict  # ``device_policy.policy_summary``
    recommended_sampling: dict  # temperature / top-p / top-k / repeat penalty the model recommends ({}: none)

    @property
    def sampling_defaults(self) -> ChosenSampling:
        """What a request (the page's or the API's) gets for a field it leaves unset, and where it came from."""
        return default_sampling(self.recommended_sampling)
