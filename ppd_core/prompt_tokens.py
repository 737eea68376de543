"""Prompt tokens: n x V trained embeddings, and their safetensors file format.

File: tensor ``prompt_embeddings`` [n, V, hidden]; string metadata ``format_version``,
``base_model`` (JSON: name and a signature of the embedding table), ``hidden_size``,
``vocab_size``, ``num_prompt_tokens``, ``ensemble_size`` and ``training`` (JSON).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from collections.abc import Callable
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ppd_core.atomic_files import atomic_output
from ppd_core.errors import PpdError

FORMAT_VERSION = "1"
SIGNATURE_ROWS = 16
SIGNATURE_TOLERANCE = 0.02  # relative; survives fp32 -> bf16/fp16 casts, not another model
INIT_TEXT = " next word"  # untrained prompt tokens start at the mean embedding of its tokens


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


def embedding_signature(embedding_weight) -> list[float]:
    """``signature_of`` a torch embedding table [vocab, hidden] (training and the torch backend)."""
    import torch  # noqa: PLC0415 - a torch table's fingerprint

    weight = embedding_weight.detach()
    return signature_of(lambda rows: weight[torch.from_numpy(rows).to(weight.device)].float().cpu().numpy(),
                        weight.shape[0])


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

    def flat(self, dtype, device):
        """``table`` as a torch tensor of ``dtype`` on ``device`` (training and the torch acceptance pass)."""
        import torch  # noqa: PLC0415 - the torch path's form

        return torch.from_numpy(self.table()).to(device=device, dtype=dtype)

    @staticmethod
    def none(signature: list[float], vocab: int, hidden: int, base_model: str) -> PromptTokens:
        """No prompt tokens, for a model nobody trained them for: its guesses come from n-gram lookup alone."""
        return PromptTokens(np.zeros((0, 1, hidden), np.float32), base_model, signature, vocab, {"trained": False, "none": True})

    @staticmethod
    def initialize(
        embedding_weight,  # a torch table [vocab, hidden]
        init_token_ids: list[int],
        base_model: str,
        num_prompt_tokens: int = 3,
        ensemble_size: int = 1,
        seed: int = 0,
    ) -> PromptTokens:
        """Start every prompt token at the mean embedding of ``init_token_ids`` (e.g. "next word").

        Ensemble members get a small seeded perturbation so they can diverge in training.
        """
        import torch  # noqa: PLC0415 - training's start

        table = embedding_weight.detach().float()
        base = table[torch.tensor(init_token_ids, device=table.device)].mean(0).cpu()  # [hidden]
        embeddings = base.expand(num_prompt_tokens, ensemble_size, -1).clone()
        if ensemble_size > 1:
            generator = torch.Generator().manual_seed(seed)
            noise = torch.randn(embeddings.shape, generator=generator) * 0.02 * base.norm() / base.numel() ** 0.5
            embeddings += noise
        return PromptTokens(
            embeddings=embeddings.numpy(),
            base_model=base_model,
            signature=embedding_signature(embedding_weight),
            vocab_size=embedding_weight.shape[0],
            training={"trained": False},
        )

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

    def check_compatible(self, embedding_weight, model_name: str) -> None:
        """Refuse tokens trained for another model (hidden size, vocabulary or embedding table)."""
        vocab, hidden = embedding_weight.shape
        self.check_signature(embedding_signature(embedding_weight), vocab, hidden, model_name)

    def check_signature(self, signature: list[float], vocab: int, hidden: int, model_name: str) -> None:
        """``check_compatible`` against a model's ``signature_of``, vocabulary and hidden sizes."""
        if hidden != self.hidden_size:
            raise PromptTokenError(
                f"prompt tokens have hidden size {self.hidden_size} but {model_name} has {hidden}: "
                f"they were made for {self.base_model}"
            )
        if vocab != self.vocab_size or not signatures_match(self.signature, signature):
            raise PromptTokenError(
                f"prompt tokens were made for {self.base_model}, not for {model_name} (embedding table differs)"
            )
