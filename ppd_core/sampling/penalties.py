"""Repetition penalties with llama.cpp's meaning (``llama_sampler_init_penalties``), for every row of a tree at once.

A token seen ``c`` times in the window (the last ``repeat_last_n`` tokens of the sequence; -1: all of it) has its
logit divided by ``repeat_penalty`` (multiplied where it is <= 0), then ``c * frequency_penalty +
presence_penalty`` taken off, in float32 as llama.cpp computes it. In a tree, each row's window is its own
sequence: the tokens so far (the root last) followed by the row's ancestors in the tree and itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ppd_core.sampling.params import SamplingParams



def window(sequence: Sequence[int], params: SamplingParams) -> np.ndarray:
    """[W] int64: the tokens the penalties count for the next token after ``sequence`` (its last ``repeat_last_n``)."""
    last = len(sequence) if params.repeat_last_n < 0 else params.repeat_last_n
    return np.asarray(sequence[len(sequence) - min(last, len(sequence)):], dtype=np.int64)


def row_counts(recent: np.ndarray, parents: Sequence[int], node_tokens: Sequence[int], last_n: int,
               vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which tokens each tree row's window holds, and how often.

    recent: [W] the sequence's window ending with the root (``window``); parents / node_tokens: the tree's nodes in
    breadth-first order, node 0 the root. A row at depth d counts the last ``last_n`` of recent + its d path tokens
    (``last_n`` < 0: all). Returns (rows [k], tokens [k], counts [k]) over the distinct (row, token) pairs.
    """
    count = len(parents)
    if last_n >= len(recent) + count:  # a window past the sequence (10**30, too big for NumPy): all of it
        last_n = -1
    depths = np.zeros(count, dtype=np.int64)  # [N]
    ancestry = np.full((count, 0), -1, dtype=np.int64)  # [N, max depth]: row i's path tokens, root's child first
    if count > 1:
        paths = [[]]
        for node in range(1, count):
            paths.append(paths[parents[node]] + [node_tokens[node]])
        depths = np.array([len(p) for p in paths], dtype=np.int64)
        ancestry = np.full((count, int(depths.max())), -1, dtype=np.int64)
        for node, path in enumerate(paths):
            ancestry[node, : len(path)] = path
    span = len(recent) + depths if last_n < 0 else np.minimum(len(recent) + depths, last_n)  # [N] window sizes
    first_kept = len(recent) + depths - span  # [N]: leading tokens of recent (+ path) left out
    base = np.broadcast_to(recent, (count, len(recent)))  # [N, W]
    base_kept = np.arange(len(recent))[None, :] >= first_kept[:, None]  # [N, W]
    path_at = np.arange(ancestry.shape[1])[None, :]  # [1, D]
    path_kept = (path_at < depths[:, None]) & (len(recent) + path_at >= first_kept[:, None])  # [N, D]
    row_ids = np.arange(count, dtype=np.int64)[:, None]
    keys = np.concatenate([(row_ids * vocab + base)[base_kept], (row_ids * vocab + ancestry)[path_kept]])
    keys, counts = np.unique(keys, return_counts=True)
    return keys // vocab, keys % vocab, counts


def penalize(rows: np.ndarray, recent: np.ndarray, parents: Sequence[int], node_tokens: Sequence[int],
             params: SamplingParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Apply the penalties to ``rows`` [N, vocab] float32 in place, each row with its own window.

    Returns what it overwrote (rows [k], tokens [k], the earlier values [k]) so that the caller can put it back.
    """
    row, token, counts = row_counts(recent, parents, node_tokens, params.repeat_last_n, rows.shape[1])
    earlier = rows[row, token]  # [k] float32 (a copy)
    repeat = np.float32(params.repeat_penalty)
    values = np.where(earlier <= 0, earlier * repeat, earlier / repeat)  # float32, as llama.cpp
    values -= counts.astype(np.float32) * np.float32(params.frequency_penalty) + np.float32(params.presence_penalty)
    rows[row, token] = values
    return row, token, earlier
