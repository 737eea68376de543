"""Sampling settings: plain data, checked on creation, no torch (the command line reads them before any model).

Temperature 0 means greedy decoding. ``acceptance`` picks how guesses are verified when
sampling: "lossless" keeps the model's distribution exactly; "typical" is the paper's faster
rule that does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ppd_core.errors import PpdError

if TYPE_CHECKING:
    import numpy as np


ACCEPTANCE_RULES = ("lossless", "typical")


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0  # nucleus: keep the smallest set of tokens with at least this mass
    top_k: int = 0  # keep the k most likely tokens; 0: all
    acceptance: str = "lossless"
    seed: int | None = None  # reproducible sampling
    typical_epsilon: float = 0.09  # typical acceptance: p(candidate) > min(epsilon, alpha * exp(-entropy))
    typical_alpha: float = 0.3

    def __post_init__(self):
        if not 0.0 <= self.temperature <= 100.0:
            raise PpdError(f"temperature must be between 0 and 100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise PpdError(f"top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise PpdError(f"top-k must be 0 (off) or positive, got {self.top_k}")
        if self.acceptance not in ACCEPTANCE_RULES:
            raise PpdError(f"unknown acceptance {self.acceptance!r}; choose one of {', '.join(ACCEPTANCE_RULES)}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:  # a 64-bit seed, as the OpenAI API takes
            raise PpdError(f"seed must be a 64-bit integer, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def lossless(self) -> bool:
        """Whether the output follows the model's distribution exactly."""
        return self.greedy or self.acceptance == "lossless"

    def describe(self) -> dict:
        """The settings as reported in JSON output."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                "acceptance": self.acceptance, "distribution_preserving": self.lossless}

    def generator(self) -> np.random.Generator:
        """NumPy's PCG64, seeded by ``seed`` (negative seeds as their 64-bit pattern), else from the OS."""
        import numpy as np  # here only: the command line reads (and checks) the settings before anything heavy

        return np.random.default_rng(None if self.seed is None else self.seed % 2**64)


GREEDY = SamplingParams()


GGUF_SAMPLING = {"temperature": ("general.sampling.temp", float), "top_p": ("general.sampling.top_p", float),
                 "top_k": ("general.sampling.top_k", int)}  # llama.cpp's keys for a model's recommended sampling


def gguf_sampling(metadata) -> dict:
    """A GGUF file's recommended sampling (``metadata(key)`` gives a value as text or None) in
    ``generation_config.json``'s terms: ``do_sample`` and the values it sets; {} where it sets none."""
    found = {}
    for name, (key, kind) in GGUF_SAMPLING.items():
        text = metadata(key)
        try:
            found[name] = kind(float(text)) if text is not None else None
        except ValueError:
            continue
    found = {name: value for name, value in found.items() if value is not None}
    return {"do_sample": True, **found} if found else {}


def recommended(generation_config: dict) -> dict:
    """The sampling a model's ``generation_config.json`` recommends ({} for greedy): temperature, top-p and top-k
    where it sets them, and only where it samples (``do_sample``), as transformers reads them."""
    if not generation_config.get("do_sample"):
        return {}
    picked = {name: generation_config[name] for name in ("temperature", "top_p", "top_k") if generation_config.get(name) is not None}
    try:
        SamplingParams(**picked)  # values ppd can use, or none of them
    except (PpdError, TypeError):
        return {}
    return picked
