"""`ppd doctor`'s checks as data: the environment probe, greedy PPD against plain answers, and the verdict.

Users on GPUs we cannot run paste the doctor's report into an issue, so each part says what it found in
plain fields and never fails on a missing optional package (llama-cpp-python, bitsandbytes, NVML): that
becomes a field saying so. Running the answers and timing steps is ``app/doctor.py``'s job; here the
comparison and the verdict are pure functions, tested on fabricated answers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ppd_core.device_memory import MemoryReading
from ppd_core.device_info import memory_of
from ppd_core.device_policy import DeviceProperties, policy_summary

# A difference between greedy PPD and plain answers is accepted on a non-bitwise path only where plain decoding's
# own logits nearly tie there: the token PPD took scores within this many logits of plain decoding's choice.
# Why 0.5: a tree step and a single step differ only by rounding. In fp32 that moves logits by about 1e-4; in
# bf16 (8-bit mantissa, relative step 2^-8) a logit near 20 moves by about 0.08 per rounding, and a few such
# roundings accumulated through the layers stay within a few tenths. A real bug (a wrong mask, position or cache
# row) changes the logits by whole units, so its first differing token is seldom within 0.5 of the best.
NEAR_TIE_LOGITS = 0.5


@dataclass(frozen=True)
class FirstDifference:
    """Where two greedy answers part, and how close plain decoding's choice was there."""

    index: int  # answer position of the first differing token
    plain_token: int | None  # None: that answer had ended
    ppd_token: int | None
    top2_gap: float  # plain decoding's best logit minus its second best at that position
    ppd_margin: float  # plain decoding's logit of its token minus its logit of PPD's (top2_gap when PPD took the runner-up)


@dataclass(frozen=True)
class AnswerComparison:
    prompt: int  # index of the question
    plain_tokens: int  # answer lengths
    ppd_tokens: int
    difference: FirstDifference | None = None  # None: token-identical

    @property
    def identical(self) -> bool:
        return self.difference is None


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: list[str]  # why it failed (empty on a pass)


def first_index(plain: Sequence[int], ppd: Sequence[int]) -> int | None:
    """The first position where the answers differ (one ending before the other counts); None if identical."""
    for index, (a, b) in enumerate(zip(plain, ppd)):
        if a != b:
            return index
    return None if len(plain) == len(ppd) else min(len(plain), len(ppd))


def compare_answer(prompt: int, prompt_ids: Sequence[int], plain: Sequence[int], ppd: Sequence[int],
                   next_logits: Callable[[list[int]], np.ndarray]) -> AnswerComparison:
    """Compare two greedy answers; at their first difference, read plain decoding's logits [vocab] after the prompt
    and the shared prefix (``next_logits``: the engine's ``next_token_logits``)."""
    index = first_index(plain, ppd)
    if index is None:
        return AnswerComparison(prompt, len(plain), len(ppd))
    logits = np.asarray(next_logits(list(prompt_ids) + list(plain[:index])), dtype=np.float32)  # [vocab]
    plain_token = plain[index] if index < len(plain) else None
    ppd_token = ppd[index] if index < len(ppd) else None
    top = np.sort(np.partition(logits, -2)[-2:])[::-1]  # [2] the best two, best first
    gap = float(top[0] - top[1])
    best = int(logits.argmax()) if plain_token is None else plain_token
    margin = gap if ppd_token is None else float(logits[best] - logits[ppd_token])
    return AnswerComparison(prompt, len(plain), len(ppd),
                            FirstDifference(index, plain_token, ppd_token, round(gap, 6), round(margin, 6)))


def verdict(comparisons: Sequence[AnswerComparison], bitwise: bool, threshold: float = NEAR_TIE_LOGITS) -> Verdict:
    """PASS when every answer is identical on a bitwise path; elsewhere when every difference is a near-tie (PPD's
    token within ``threshold`` logits of plain decoding's choice, by plain decoding's own logits)."""
    reasons = []
    for comparison in comparisons:
        difference = comparison.difference
        if difference is None:
            continue
        where = f"prompt {comparison.prompt}: answers part at token {difference.index}"
        if bitwise:
            reasons.append(f"{where} on a bitwise path (every answer must be identical)")
        elif difference.ppd_margin >= threshold:
            reasons.append(f"{where}, {difference.ppd_margin:.3f} logits from plain decoding's choice (not a "
                           f"near-tie: the limit is {threshold})")
    return Verdict(not reasons, reasons)


@dataclass
class Environment:
    """What the machine, its packages and ppd's device policy are."""

    python: str
    os: str
    arch: str
    torch: str
    torch_cuda: str | None  # torch.version.cuda: None on a CPU build
    cudnn: int | None
    cuda_available: bool
    device: dict  # DeviceProperties of the device the model runs on
    native_bf16: bool
    compute_dtype: str
    attention: str
    memory_source: str
    memory: dict | str  # a reading (label, used, total), or why none could be taken
    version_notes: list[str]
    transformers: str | None
    llama_cpp: dict  # version, system info, GPU offload; {"error": ...} when llama-cpp-python is missing
    bitsandbytes: str  # version, or "not installed"
    gpu: dict | None = None  # cuda:0's properties when CUDA is available but the torch device is not it

    def to_json(self) -> dict:
        return asdict(self)


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def llama_cpp_info() -> dict:
    """llama-cpp-python's version, llama.cpp's system info line and GPU offload; an "error" line if it is missing."""
    from ppd_core.backends.llamacpp.library import LlamaCppError, import_llama_cpp, system_info  # noqa: PLC0415

    try:
        llama = import_llama_cpp()
    except LlamaCppError as error:
        return {"version": None, "system_info": None, "gpu_offload": None, "error": str(error)}
    return {"version": getattr(llama, "__version__", None),
            "system_info": system_info(llama),
            "gpu_offload": bool(llama.llama_supports_gpu_offload())}


def bitsandbytes_version() -> str:
    """Its installed version, without importing it (slow, and noisy on a CPU); "not installed" otherwise."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "not installed"
    return package_version("bitsandbytes") or "installed (version unknown)"


def properties_json(properties: DeviceProperties) -> dict:
    out = asdict(properties)
    out["compute_capability"] = None if properties.compute_capability is None else ".".join(
        map(str, properties.compute_capability))
    out["torch_version"] = ".".join(map(str, properties.torch_version))
    return out


def torch_report(device) -> dict:
    """torch's build (version, CUDA, cuDNN, cuda:0 beside a CPU device), from the torch wing; where torch is not
    installed, fields saying so."""
    if importlib.util.find_spec("torch") is None:
        return {"torch": "not installed", "torch_cuda": None, "cudnn": None, "cuda_available": False, "gpu": None}
    from ppd_core.backends.torch.device import torch_report as report  # noqa: PLC0415 - `ppd doctor` reports torch's build

    found = report(device)
    return {**found, "gpu": None if found["gpu"] is None else properties_json(found["gpu"])}


def probe_environment(properties: DeviceProperties, read: Callable[[], MemoryReading] | None = None) -> Environment:
    """Everything about this machine that decides how ppd runs here (``properties``: the device the model's tensors
    live on, as its wing read it; ``read``: its memory reading, by default the policy's). torch is probed too: its
    CUDA build decides the torch path."""
    try:
        reading = read() if read is not None else memory_of(properties)
        memory: dict | str = {"label": reading.label, "used_bytes": reading.used_bytes, "total_bytes": reading.total_bytes}
    except Exception as error:  # noqa: BLE001 - a report, not a crash: say what failed
        memory = f"no reading: {type(error).__name__}: {error}"
    return Environment(
        python=sys.version.split()[0], os=platform.platform(), arch=platform.machine(), **torch_report(properties.kind),
        device=properties_json(properties), **policy_summary(properties), memory=memory,
        transformers=package_version("transformers"), llama_cpp=llama_cpp_info(), bitsandbytes=bitsandbytes_version(),
    )
