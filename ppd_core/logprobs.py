"""Log-probabilities of emitted tokens, as llama-server reports them with ``post_sampling_probs`` off: the
log-softmax of the model's own logits at the position (no temperature, no penalties, no truncation), and the
likeliest alternatives there.

A tree step reads them off the rows of its accepted path, which on the llama.cpp backend are the rows plain decoding
computes bit for bit: the same numbers either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ppd_core.logits import top_k

MAX_TOP_LOGPROBS = 20  # as OpenAI's API


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
