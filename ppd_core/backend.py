"""The backend protocol: one small protocol between the decoding algorithm and the code that runs the model (the
wings under ``ppd_core/backends/``, their loaders named in ``ppd_core.backend_registry``).

A backend turns "these rows (tokens or embeddings), these parents, these positions" (``StepRows``) into logits and
keeps an accepted path (``Decoder``: seven methods); everything else reads what it is from its ``BackendInfo``. The
tree, verification, lookup and the decoding loop stay above it and never see a cache's layout. Two implement it: ``torch`` (the lean and transformers forwards) and
``llamacpp`` (llama.cpp through llama-cpp-python's low-level API, GGUF models).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # annotations only: the protocol imports nothing, so each wing sits right above what it uses
    import numpy as np

    from ppd_core.backend_registry import BackendName
    from ppd_core.device_memory import MemoryReading
    from ppd_core.device_policy import DeviceProperties

    from ppd_core.sampling.constraint import Grammar
    from ppd_core.sampling.logits import StepLogits
    from ppd_core.tree import Tree


@dataclass(frozen=True)
class BackendInfo:
    """What a loaded backend is, as everything outside decoding reads it (snapshot, calibration keys, doctor,
    device panel): each wing builds one at load. torch's threads are process-wide and can change after load
    (``set_threads``): the wing then builds a new record, so a record says what held when it was made."""

    name: BackendName  # a label in reports (the readout, the bench, the API), never dispatched on
    forward: str  # what computes a step: "llamacpp", "lean" or "transformers"
    vocab_size: int
    max_context: int  # positions a cache may hold (prompt and answer)
    bitwise: bool  # tree rows equal plain steps bit for bit on this path (tested); else up to float rounding
    threads: int  # CPU threads a step runs on
    max_tree_rows: int  # the most rows one step may have
    accepts_embeddings: bool  # an embedding row stands in for its token (prompt-token rows can be decoded)
    tree_note: str | None  # why this model decodes plainly only (a recurrent cache holds no tree); None: trees work
    pads_steps: bool  # a padded step (``pad_to``) changes its shape (llama.cpp: one CUDA graph per shape)
    kernels: dict  # what runs the model, for the device panel and reports: backend, kernels, offload
    dtype: str  # the weights' compute dtype by name: "float32", "bfloat16", ...
    device: str  # where the weights live: "cpu", "cuda:0", ...
    device_kind: str  # "cpu" or "cuda" (llama.cpp reports its offload in ``kernels``)
    properties: DeviceProperties  # the device as the device policy reads it, with ``threads``
    read_memory: Callable[[], MemoryReading]  # the device's used and total memory, read now
    offloaded: int = 0  # layers run on a GPU by a CPU-side backend (llama.cpp's gpu_layers; -1: all)
    policy_dtype: bool = False  # the device policy's compute dtype and attention plan apply (torch's forwards)

    @property
    def on_gpu(self) -> bool:
        """Whether steps run on a GPU: a CUDA device, or layers offloaded."""
        return self.device_kind == "cuda" or bool(self.offloaded)


@dataclass(frozen=True, eq=False)
class StepRows:
    """One step's rows as plain arrays: what a backend computes. Rows come parent first: the root (the last accepted
    token, not yet cached), then node rows, then prompt-token rows (embeddings). A backend derives its own form of
    the tree from ``parents`` (torch's mask, llama.cpp's sequence ids) and may cache it by ``parents``."""

    tokens: np.ndarray  # [N] int64: the node rows' tokens, root first
    embeddings: np.ndarray | None  # [T - N, hidden] float32: the prompt-token rows after them (None: T == N)
    positions: np.ndarray  # [T] int64: each row's position past the cache's end (the root's is 0)
    parents: tuple[int, ...]  # [T] each row's parent row, -1 for the root: a row sees the cache and its ancestors
    pad_to: int | None = None  # compute the step as exactly this many rows where the shape matters (None: its own)

    @property
    def num_rows(self) -> int:
        return len(self.parents)

    @classmethod
    def of(cls, tree: Tree, tokens: np.ndarray, embeddings: np.ndarray | None = None,
           pad_to: int | None = None) -> StepRows:
        """The rows of ``tree`` (a ``ppd_core.tree.Tree``) with node ``tokens`` and prompt-token ``embeddings``."""
        return cls(tokens, embeddings, tree.position_offsets, tree.row_parents, pad_to)


class Decoder(Protocol):
    """What decoding computes with: a cache and one step's rows in, logits out. A cache is opaque: only its backend
    reads or edits it. What a backend is (``info``) is read, never dispatched on."""

    info: BackendInfo

    def new_cache(self) -> Any:
        """An empty cache."""

    def cache_length(self, cache: Any) -> int:
        """Positions the cache holds (accepted tokens only)."""
        ...

    def prefill(self, cache: Any, token_ids: Sequence[int]) -> StepLogits:
        """Append ``token_ids`` after what ``cache`` holds; the logits [1, vocab] of the last one."""
        ...

    def tree_logits(self, cache: Any, rows: StepRows) -> StepLogits:
        """One forward pass over ``rows`` rooted right after the cache: every row sees the cache and its ancestors;
        row i sits at position ``cache_length + rows.positions[i]``. Returns the logits [T, vocab] of all T rows.
        The rows' keys and values are held until ``keep``."""
        ...

    def keep(self, cache: Any, start: int, path: Sequence[int], rows: StepRows) -> None:
        """After ``tree_logits(cache, rows)`` at cache length ``start``: keep rows ``path`` (root first, ascending)
        as positions ``start, start + 1, ...`` and drop the step's other rows."""

    def truncate(self, cache: Any, length: int) -> None:
        """Forget every position from ``length`` on."""

    def close(self) -> None:
        """Free what the backend holds outside Python's reach (llama.cpp's model and context); idempotent."""


class Backend(Decoder, Protocol):
    """A loaded wing as the rest of ppd holds it (``LoadedModel.backend``): the compute protocol, and what loading,
    prompt tokens, training and grammar requests ask of the model beside it."""

    def embedding_rows(self, token_ids: np.ndarray) -> np.ndarray:
        """The model's input embeddings [k, hidden] float32 of ``token_ids`` [k], as its first layer sees them
        (fingerprints, prompt-token rows' scale, training)."""
        ...

    def set_threads(self, threads: int) -> None:
        """Run steps on ``threads`` CPU threads where the backend takes it after loading (torch's process-wide
        setting; ``info`` is made anew); llama.cpp's are chosen at load."""

    def grammar(self, text: str) -> Grammar:
        """A grammar state for GBNF ``text`` on this vocabulary; a PpdError (one line) where the backend has no
        grammar engine."""
        ...
