"""Decoder backends: one small protocol between the decoding algorithm and the code that runs the model.

A backend turns "these rows (tokens or embeddings), these parents, these positions" into logits and
keeps an accepted path; the tree, verification, lookup and the decoding loop stay above it and never
see a cache's layout. Two implement it: ``torch`` (the lean and transformers forwards) and
``llamacpp`` (llama.cpp through llama-cpp-python's low-level API, GGUF models).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the protocol imports nothing, so each wing sits right above what it uses
    import numpy as np

    from ppd_core.options import BackendName
    from ppd_core.sampling.logits import StepLogits
    from ppd_core.tree import Tree


class Decoder(Protocol):
    """What decoding needs of a model. A cache is opaque: only its backend reads or edits it."""

    name: BackendName  # reported by the readout, the bench and the API (a label, never dispatched on)
    forward: str  # what computes a step: "llamacpp", "lean" or "transformers"
    threads: int  # CPU threads a step runs on (llama.cpp's context's; torch's, process-wide)
    pads_steps: bool  # ``pad_steps`` changes the step's shape (llama.cpp: one CUDA graph per shape)
    vocab_size: int
    max_context: int  # positions a cache may hold (prompt and answer)
    bitwise: bool  # tree rows equal plain steps bit for bit on this path (tested); else up to float rounding
    tree_note: str | None  # why this model decodes plainly only (a recurrent cache holds no tree); None: trees work
    accepts_embeddings: bool  # an embedding row stands in for its token (prompt-token rows can be decoded)
    max_tree_rows: int  # the most rows one step may have

    def new_cache(self) -> Any:
        """An empty cache."""

    def cache_length(self, cache: Any) -> int:
        """Positions the cache holds (accepted tokens only)."""

    def prefill(self, cache: Any, token_ids: Sequence[int]) -> StepLogits:
        """Append ``token_ids`` after what ``cache`` holds; the logits [1, vocab] of the last one."""

    def tree_logits(self, cache: Any, tree: Tree, node_tokens: np.ndarray, prompt_rows: np.ndarray | None) -> StepLogits:
        """One forward pass over ``tree`` rooted right after the cache: node tokens [N] int64, then prompt-token
        embeddings [T - N, hidden] float32 (or None). Every row sees the cache and its tree ancestors; row i sits
        at position ``cache_length + tree.position_offsets[i]``. Returns the logits of all T rows. The rows'
        keys and values are held until ``keep``."""

    def keep(self, cache: Any, start: int, path: Sequence[int]) -> None:
        """After ``tree_logits`` at cache length ``start``: keep tree rows ``path`` (root first, ascending)
        as positions ``start, start + 1, ...`` and drop the step's other rows."""

    def truncate(self, cache: Any, length: int) -> None:
        """Forget every position from ``length`` on."""

    def embedding_rows(self, token_ids: np.ndarray) -> np.ndarray:
        """The model's input embeddings [k, hidden] float32 of ``token_ids`` [k], as its first layer sees them
        (fingerprints, prompt-token rows' scale, training)."""

    def set_threads(self, threads: int) -> None:
        """Run steps on ``threads`` CPU threads where the backend takes it after loading (torch's process-wide
        setting); llama.cpp's are chosen at load."""

    def pad_steps(self, rows: int | None) -> None:
        """Decode every generation step as exactly ``rows`` rows (None: each its own shape), where that matters."""

    def grammar(self, text: str) -> Any:
        """A grammar constraint for GBNF ``text`` on this vocabulary; a PpdError (one line) where the backend has no
        grammar engine."""

    def describe(self) -> dict:
        """What runs the model, for the device panel and reports: backend, kernels, offload."""

    def close(self) -> None:
        """Free what the backend holds outside Python's reach (llama.cpp's model and context); idempotent."""
