"""A ``llama_batch`` with NumPy views of its arrays, made once: a step writes its rows into them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

BATCH_ROWS = 512  # rows per llama_decode (prefill is split into batches this long)


class Batch:
    """A ``llama_batch`` of ``BATCH_ROWS`` rows with NumPy views of its arrays, made once (a step writes into them)."""

    def __init__(self, llama, sequences: int, hidden: int = 0):
        self.llama = llama
        self.raw = llama.llama_batch_init(BATCH_ROWS, hidden, sequences)
        raw, view = self.raw, np.ctypeslib.as_array
        self.tokens = None if hidden else view(raw.token, shape=(BATCH_ROWS,))  # [rows] token ids
        self.embeddings = view(raw.embd, shape=(BATCH_ROWS, hidden)) if hidden else None  # [rows, hidden] float32
        self.positions = view(raw.pos, shape=(BATCH_ROWS,))
        self.outputs = view(raw.logits, shape=(BATCH_ROWS,))  # int8: whether a row's logits come back
        self.sequence_counts = view(raw.n_seq_id, shape=(BATCH_ROWS,))
        self.sequence_ids = [view(raw.seq_id[row], shape=(sequences,)) for row in range(BATCH_ROWS)]

    def fill(self, positions: np.ndarray, sequences: Sequence[Sequence[int]], outputs: np.ndarray | int) -> None:
        """Positions, sequence ids and output flags of the first ``len(positions)`` rows."""
        rows = len(positions)
        self.positions[:rows] = positions
        self.outputs[:rows] = outputs
        for row, ids in enumerate(sequences):
            self.sequence_counts[row] = len(ids)
            self.sequence_ids[row][: len(ids)] = ids

    def free(self) -> None:
        if self.raw is not None:
            self.llama.llama_batch_free(self.raw)
            self.raw = None
