"""The adjusted next-token distribution (temperature, top-k, top-p) and sampling from it.

The settings (``SamplingParams``) live in ``ppd_core/sampling_params.py``.
"""

from __future__ import annotations

import torch

from ppd_core.sampling_params import SamplingParams


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
