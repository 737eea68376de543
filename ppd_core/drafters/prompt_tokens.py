"""Prompt tokens: n x V trained embeddings, their safetensors file format, and their drafter.

File: tensor ``prompt_embeddings`` [n, V, hidden]; string metadata ``format_version``,
``base_model`` (JSON: name and a signature of the embedding table), ``hidden_size``,
``vocab_size``, ``num_prompt_tokens``, ``ensemble_size`` and ``training`` (JSON).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ppd_core.atomic_files import atomic_output
from ppd_core.drafters.base import Draft, Guesses, Verified
from ppd_core.errors import PpdError
from ppd_core.tree import Tree, TreeFamily

FORMAT_VERSION = "1"
SIGNATURE_ROWS = 16
SIGNATURE_TOLERANCE = 0.02  # relative; survives fp32 -> bf16/fp16 casts, not another model
INIT_TEXT = " next word"  # untrained prompt tokens start at the mean embedding of its tokens
# a candidate's estimate without calibration's figures: certain, so the whole tree is kept ahead of other sources'
# nodes (as before the merge, when the tree came first and a chain took the rows left)
PRIOR = 1.0
MIN_CHANCE = 1e-6  # an estimate is in (0, 1]: a candidate calibration never saw right is kept last

# (the answer so far, the model's guesses [m, K]) -> guesses [m, K]; lets tests plant guesses
GuessHook = Callable[[list[int], np.ndarray], np.ndarray]


class PromptTokenError(PpdError):
    """A prompt-token file that is missing, corrupt, or made for another model."""


def signature_rows(vocab: int) -> np.ndarray:
    """[SIGNATURE_ROWS] int64: the rows a fingerprint reads, spread over the vocabulary."""
    return np.linspace(0, vocab - 1, SIGNATURE_ROWS).astype(np.int64)


def signature_of(rows_of: Callable[[np.ndarray], np.ndarray], vocab: int) -> list[float]:
    """Row norms of a few fixed rows of the input embedding table (``rows_of(ids)`` gives them [k, hidden]): a
    dtype-tolerant fingerprint that needs no whole table (llama.cpp keeps it in the GGUF file)."""
    norms = np.linalg.norm(np.asarray(rows_of(signature_rows(vocab)), dtype=np.float32), axis=-1)
    return [round(float(x), 5) for x in norms]


def signatures_match(a: list[float], b: list[float]) -> bool:
    if len(a) != len(b):
        return False
    return all(abs(x - y) <= SIGNATURE_TOLERANCE * max(abs(x), abs(y), 1e-6) for x, y in zip(a, b))


@dataclass
class PromptTokens:
    """Embeddings [n, V, hidden] plus what they were made for and how they were trained."""

    embeddings: np.ndarray  # [n, V, hidden] float32
    base_model: str
    signature: list[float]
    vocab_size: int
    training: dict = field(default_factory=dict)
    source: Path | None = field(default=None, compare=False)  # the file it was read from (its acceptance record is beside it)

    @property
    def num_prompt_tokens(self) -> int:
        return self.embeddings.shape[0]

    @property
    def ensemble_size(self) -> int:
        return self.embeddings.shape[1]

    @property
    def hidden_size(self) -> int:
        return self.embeddings.shape[2]

    @property
    def num_bytes(self) -> int:
        return self.embeddings.nbytes

    def with_ensemble_size(self, ensemble_size: int, seed: int = 0) -> PromptTokens:
        """The same tokens with ``ensemble_size`` members: unchanged, averaged into one, or one member copied into
        several with a small seeded perturbation each (so that training can make them differ)."""
        if ensemble_size == self.ensemble_size:
            return self
        if ensemble_size == 1:
            return dataclasses.replace(self, embeddings=self.embeddings.mean(1, keepdims=True, dtype=np.float32))
        if self.ensemble_size != 1 or ensemble_size < 1:
            raise PromptTokenError(f"can shrink an ensemble to 1 member or grow 1 member into several, "
                                   f"not {self.ensemble_size} into {ensemble_size}")
        grown = np.repeat(self.embeddings, ensemble_size, axis=1)  # [n, V, hidden]
        scale = 0.02 * np.linalg.norm(self.embeddings, axis=-1, keepdims=True) / self.hidden_size ** 0.5  # [n, 1, 1]
        grown = grown + np.random.default_rng(seed).standard_normal(grown.shape) * scale
        return dataclasses.replace(self, embeddings=grown.astype(np.float32))

    @property
    def fingerprint(self) -> str:
        """A short hash of the embeddings: calibration profiles are only valid for these tokens."""
        data = np.ascontiguousarray(self.embeddings, dtype=np.float32).tobytes()
        return hashlib.sha256(data).hexdigest()[:16]

    def table(self) -> np.ndarray:
        """[n * V, hidden] float32 indexed by ``k * V + j`` (see ``Tree.prompt_embedding_index``)."""
        return np.ascontiguousarray(self.embeddings.reshape(-1, self.hidden_size), dtype=np.float32)

    @staticmethod
    def none(signature: list[float], vocab: int, hidden: int, base_model: str) -> PromptTokens:
        """No prompt tokens, for a model nobody trained them for: its guesses come from n-gram lookup alone."""
        return PromptTokens(np.zeros((0, 1, hidden), np.float32), base_model, signature, vocab, {"trained": False, "none": True})

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically, so an interrupted save never leaves a half file behind."""
        metadata = {
            "format_version": FORMAT_VERSION,
            "base_model": json.dumps({"name": self.base_model, "embedding_signature": self.signature}),
            "hidden_size": str(self.hidden_size),
            "vocab_size": str(self.vocab_size),
            "num_prompt_tokens": str(self.num_prompt_tokens),
            "ensemble_size": str(self.ensemble_size),
            "training": json.dumps(self.training),
        }
        with atomic_output(path) as tmp:
            save_file({"prompt_embeddings": np.ascontiguousarray(self.embeddings, dtype=np.float32)}, str(tmp), metadata)

    @staticmethod
    def load(path: str | os.PathLike) -> PromptTokens:
        """Read a file; raises PromptTokenError with a one-line reason if it is unusable."""
        path = Path(path)
        if not path.is_file():
            raise PromptTokenError(f"prompt-token file not found: {path}")
        try:
            with safe_open(str(path), framework="numpy") as handle:
                metadata = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}
        except (SafetensorError, OSError, ValueError) as error:
            raise PromptTokenError(f"{path} is not a valid prompt-token file ({error})") from None
        try:
            embeddings = tensors["prompt_embeddings"]
            base = json.loads(metadata["base_model"])
            tokens = PromptTokens(
                embeddings=np.asarray(embeddings, dtype=np.float32),
                base_model=str(base["name"]),
                signature=[float(x) for x in base["embedding_signature"]],
                vocab_size=int(metadata["vocab_size"]),
                training=json.loads(metadata.get("training", "{}")),
                source=path,
            )
            declared = (int(metadata["num_prompt_tokens"]), int(metadata["ensemble_size"]), int(metadata["hidden_size"]))
        except (KeyError, ValueError, TypeError) as error:
            raise PromptTokenError(f"{path} is not a valid prompt-token file (bad metadata: {error})") from None
        if metadata.get("format_version") != FORMAT_VERSION:
            raise PromptTokenError(f"{path} has format version {metadata.get('format_version')}, expected {FORMAT_VERSION}")
        if embeddings.ndim != 3 or tuple(embeddings.shape) != declared:
            raise PromptTokenError(f"{path}: tensor shape {tuple(embeddings.shape)} disagrees with its metadata {declared}")
        if not np.isfinite(embeddings).all():
            raise PromptTokenError(f"{path} holds non-finite values")
        return tokens

    def check_signature(self, signature: list[float], vocab: int, hidden: int, model_name: str) -> None:
        """Refuse tokens made for another model: its ``signature_of``, vocabulary and hidden sizes."""
        if hidden != self.hidden_size:
            raise PromptTokenError(
                f"prompt tokens have hidden size {self.hidden_size} but {model_name} has {hidden}: "
                f"they were made for {self.base_model}"
            )
        if vocab != self.vocab_size or not signatures_match(self.signature, signature):
            raise PromptTokenError(
                f"prompt tokens were made for {self.base_model}, not for {model_name} (embedding table differs)"
            )


class PromptTokenDrafter:
    """The prompt tokens as a drafter: each step the family's tree for the depths guessed, its candidates the ranks of
    the guesses the prompt tokens on the last accepted node read off the step before (their ensemble's mean), each
    with its prompt-token rows. A candidate's estimate is calibration's p_d(r) where given, else ``PRIOR``."""

    name = "prompt tokens"

    def __init__(self, family: TreeFamily, top_k: int, hook: GuessHook | None = None,
                 acceptance: Sequence[Sequence[float]] | None = None):
        """``top_k``: guesses kept per depth; ``hook``: replaces the guesses (tests); ``acceptance``: p_d(r), [n][k]."""
        self.family, self.top_k, self.hook = family, top_k, hook
        self.acceptance = acceptance or ()
        self.guesses: np.ndarray | None = None  # [m, K] int64 for depths 1..m; None before the first tree step
        self.answer: list[int] = []  # the tokens emitted so far (the hook's view)
        self._shapes: dict[int, tuple[list[int], list[float], list[int]]] = {}  # per tree: parents, probs, counts
        self._value: float | None = None  # ``value()``

    def propose(self, draft: Draft) -> None:
        """The tree for the depths guessed (the depth-0 tree only attaches prompt tokens to the root)."""
        tree = self.family.for_depth(0 if self.guesses is None else self.guesses.shape[0])
        draft.root_prompts = tree.prompt_counts[0]
        draft.prompt_value = self.value()
        parents, probs, counts = self.shape(tree)
        tokens = self.guesses[tree.candidate_depths - 1, tree.candidate_ranks].tolist() if parents else []
        draft.add(self.name, Guesses(tokens, parents, probs, counts if any(counts) else []))

    def shape(self, tree: Tree) -> tuple[list[int], list[float], list[int]]:
        """The candidates' parents (-1: the root), estimates and prompt-token counts, in the tree's order."""
        if id(tree) not in self._shapes:
            parents = [p - 1 for p in tree.parents[1:]]  # node i is candidate i - 1
            probs = [self.chance(len(path), path[-1]) for path in tree.paths[1:]]
            self._shapes[id(tree)] = parents, probs, list(tree.prompt_counts[1:])
        return self._shapes[id(tree)]

    def value(self) -> float:
        """The tokens the deepest tree's guesses are expected to add to a step: the sum of its path products."""
        if self._value is None:
            parents, probs, _ = self.shape(self.family.trees[-1])
            self._value = sum(Guesses([0] * len(parents), parents, probs).path_probs())
        return self._value

    def chance(self, depth: int, rank: int) -> float:
        """p_depth(rank) as calibration measured it; ``PRIOR`` where it did not."""
        row = self.acceptance[depth - 1] if depth <= len(self.acceptance) else ()
        return min(1.0, max(MIN_CHANCE, float(row[rank]))) if rank < len(row) else PRIOR

    def observe(self, verified: Verified) -> None:
        """The next guesses: the prompt tokens attached to the last accepted node, best first."""
        tree, last = verified.tree, verified.last
        self.answer.extend(verified.stats.tokens)
        depth = tree.prompt_counts[last]
        self.guesses = None
        if depth:
            slots = tree.prompt_slots[last, :depth]  # [m, V]
            self.guesses = verified.logits.top_of_mean(slots, self.top_k)  # [m, K]: the ensemble's mean, best first
            if self.hook is not None:
                self.guesses = self.hook(list(self.answer), self.guesses)


def prompt_rows(table: np.ndarray | None, tree: Tree) -> np.ndarray | None:
    """[T - N, hidden]: the embeddings of the tree's prompt-token rows (``table`` [n * V, hidden]); None: none."""
    return table[tree.prompt_embedding_index] if tree.num_tokens > tree.num_nodes else None
