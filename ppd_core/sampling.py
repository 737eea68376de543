"""Sampling settings and the adjusted next-token distribution (temperature, top-k, top-p).

Temperature 0 means greedy decoding. ``acceptance`` picks how guesses are verified when
sampling: "lossless" keeps the model's distribution exactly; "typical" is the paper's faster
rule that does not (DESIGN.md section 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppd_core.errors import PpdError

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
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:  # what torch.Generator.manual_seed takes
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

    def generator(self) -> torch.Generator:
        generator = torch.Generator()
        if self.seed is None:
            generator.seed()
        else:
            generator.manual_seed(self.seed)
        return generator


GREEDY = SamplingParams()


def adjusted_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution sampled from: softmax(logits / T) cut to top-k and top-p, renormalised.

    logits: [..., vocab]; returns float32 probabilities of the same shape.
    """
    scaled = logits.float() / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = scaled.topk(params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the tokens ranked above
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)  # the top token always stays
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a [vocab] distribution, drawn on the CPU so a seed reproduces it anywhere."""
    return int(torch.multinomial(probs.float().cpu(), 1, generator=generator))


def typical_threshold(probs: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The typical-acceptance bar min(epsilon, alpha * exp(-entropy)) of each distribution.

    probs: [..., vocab], the untruncated softmax(logits / T) (no top-k / top-p); returns [...].
    """
    entropy = -torch.special.xlogy(probs, probs).sum(-1)  # [...]; 0 * log 0 counts as 0
    return (params.typical_alpha * torch.exp(-entropy)).clamp_max(params.typical_epsilon)
