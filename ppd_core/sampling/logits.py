"""A step's logits, the few questions decoding asks of them, and the emitted tokens' log-probabilities.

A backend returns ``StepLogits`` for the rows it decoded; verification and the next guesses read only
what they need (argmax per row, a row's distribution, the top-k of an ensemble mean), so a GPU backend can
answer on the device and copy back a few numbers instead of ``[rows, vocab]`` floats every step.
``HostLogits`` is the NumPy form every CPU backend returns.

Log-probabilities are reported as llama-server reports them with ``post_sampling_probs`` off: the log-softmax of the
model's own logits at the position (no temperature, no penalties, no truncation), and the likeliest alternatives
there. A tree step reads them off the rows of its accepted path, which on the llama.cpp backend are the rows plain
decoding computes bit for bit: the same numbers either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_TOP_LOGPROBS = 20  # as OpenAI's API


class StepLogits(Protocol):
    """Logits of a step's rows [rows, vocab]; answers in NumPy on the host."""

    num_rows: int

    def argmax(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        """[k] int64: each row's most likely token (the first on a tie)."""

    def rows(self, rows: slice | np.ndarray) -> np.ndarray:
        """[k, vocab] float32 on the host: the rows sampling reads."""

    def top_of_mean(self, slots: np.ndarray, k: int) -> np.ndarray:
        """[m, k] int64: the k most likely tokens, best first, of the mean of rows ``slots`` [m, V] over V."""

    def top_k(self, rows: slice | np.ndarray, k: int) -> np.ndarray:
        """[len(rows), k] int64: each row's k most likely tokens, best first (ties: the lower index)."""

    def top_k_probs(self, rows: slice | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``top_k`` [len(rows), k] int64 and those tokens' softmax probabilities [len(rows), k] float32."""


class HostLogits:
    """``StepLogits`` over a NumPy array [rows, vocab] float32."""

    def __init__(self, values: np.ndarray):
        self.values = values  # [rows, vocab]
        self.num_rows = values.shape[0]

    def argmax(self, rows: slice | np.ndarray = slice(None)) -> np.ndarray:
        return self.values[rows].argmax(-1).astype(np.int64)

    def rows(self, rows: slice | np.ndarray) -> np.ndarray:
        return self.values[rows]

    def top_of_mean(self, slots: np.ndarray, k: int) -> np.ndarray:
        mean = self.values[slots.reshape(-1)].reshape(*slots.shape, -1)  # [m, V, vocab]
        mean = mean[:, 0] if slots.shape[1] == 1 else mean.mean(1)  # [m, vocab]
        return top_k(mean, k)

    def top_k(self, rows: slice | np.ndarray, k: int) -> np.ndarray:
        return top_k(self.values[rows], k)

    def top_k_probs(self, rows: slice | np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        values = self.values[rows]  # [m, vocab]
        best = top_k(values, k)  # [m, k]
        top = values.max(-1, keepdims=True)  # [m, 1]
        log_total = np.log(np.exp(values - top).sum(-1, keepdims=True))  # [m, 1]
        return best, np.exp(np.take_along_axis(values, best, -1) - top - log_total).astype(np.float32)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """[..., k] int64 indices of the k largest of ``values`` [..., vocab], largest first (ties: lower index)."""
    vocab = values.shape[-1]
    k = min(k, vocab)
    if k < 1:  # no guesses asked for (a tree without candidates at a depth)
        return np.zeros((*values.shape[:-1], 0), dtype=np.int64)
    part = np.argpartition(values, vocab - k, axis=-1)[..., vocab - k :]  # [..., k] unordered (no negated copy)
    picked = np.take_along_axis(values, part, -1)  # [..., k]
    # argpartition picks any of the entries tied with the k-th largest; the lower indices are the ones to keep
    crossing = (values >= picked.min(-1, keepdims=True)).sum(-1) > k  # [...] rows with a tie across the cut
    if crossing.any():
        rows = values[crossing]  # [c, vocab]
        part[crossing] = np.lexsort((np.broadcast_to(np.arange(vocab), rows.shape), -rows), axis=-1)[:, :k]
        picked = np.take_along_axis(values, part, -1)
    order = np.lexsort((part, -picked), axis=-1)  # by value, then index
    return np.take_along_axis(part, order, -1).astype(np.int64)


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token, logprob) of the likeliest, best first; () when none were asked for


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """Each of ``tokens``' log-probability under its row of ``rows`` [k, vocab] (the logits that chose it), with the
    ``top`` likeliest tokens of that row."""
    values = rows.astype(np.float64)  # [k, vocab]
    shifted = values - values.max(-1, keepdims=True)
    logprobs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))  # [k, vocab]
    best = top_k(values, top) if top else np.zeros((len(tokens), 0), dtype=np.int64)  # [k, top]
    return [TokenLogprob(int(token), float(row[token]), tuple((int(t), float(row[t])) for t in ranked))
            for token, row, ranked in zip(tokens, logprobs, best)]
