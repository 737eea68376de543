"""The adjusted next-token distribution (temperature, top-k, top-p) and sampling from it, in NumPy.

The settings (``SamplingParams``) live in ``ppd_core/sampling_params.py``.
"""

from __future__ import annotations

import numpy as np

from ppd_core.sampling_params import SamplingParams


def softmax(scaled: np.ndarray) -> np.ndarray:
    """softmax over the last axis, in float64; -inf entries get probability 0."""
    shifted = np.exp(scaled - scaled.max(-1, keepdims=True))
    return shifted / shifted.sum(-1, keepdims=True)


def adjusted_probs(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution sampled from: softmax(logits / T) cut to top-k and top-p, renormalised.

    logits: [..., vocab]; returns float64 probabilities of the same shape.
    """
    scaled = logits.astype(np.float64) / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = -np.partition(-scaled, params.top_k - 1, axis=-1)[..., params.top_k - 1 : params.top_k]  # [..., 1]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = softmax(scaled)
    if params.top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")  # [..., vocab] likeliest first
        sorted_probs = np.take_along_axis(probs, order, -1)
        before = np.cumsum(sorted_probs, -1) - sorted_probs  # mass of the tokens ranked above
        sorted_probs = np.where(before >= params.top_p, 0.0, sorted_probs)  # the top token always stays
        probs = np.zeros_like(probs)
        np.put_along_axis(probs, order, sorted_probs, -1)
        probs /= probs.sum(-1, keepdims=True)
    return probs


def sample(probs: np.ndarray, generator: np.random.Generator) -> int:
    """One token from a [vocab] distribution (inverse CDF of one uniform draw: a seed reproduces it anywhere)."""
    cumulative = np.cumsum(probs, dtype=np.float64)
    token = int(np.searchsorted(cumulative, generator.random() * cumulative[-1], side="right"))
    return min(token, len(probs) - 1)


def typical_threshold(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The typical-acceptance bar min(epsilon, alpha * exp(-entropy)) of each distribution.

    probs: [..., vocab], the untruncated softmax(logits / T) (no top-k / top-p); returns [...].
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, probs * np.log(probs), 0.0)  # 0 * log 0 counts as 0
    entropy = -terms.sum(-1)
    return np.minimum(params.typical_alpha * np.exp(-entropy), params.typical_epsilon)
