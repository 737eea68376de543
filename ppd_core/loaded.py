"""A loaded model, whichever loader made it: the decoding backend, its tokenizer and what the app reports.

No torch here: a GGUF file on llama.cpp never imports it. The torch loader puts torch objects in the same
fields (``device`` a ``torch.device``, ``network`` a transformers model).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ppd_core.backends import Decoder
from ppd_core.errors import PpdError
from ppd_core.memory import release_free_heap


class ModelLoadError(PpdError, RuntimeError):
    """A model that cannot be loaded here; the message is one line for the user."""


@dataclass
class LoadedModel:
    """A frozen causal LM, its tokenizer, and how it was loaded."""

    tokenizer: object  # ``GgufTokenizer`` on llama.cpp, a transformers tokenizer on torch
    name: str
    source: str
    device: object  # "cpu" on llama.cpp (it offloads by itself); a ``torch.device`` on torch
    dtype: object  # "float32" on llama.cpp (logits and embedding rows); a ``torch.dtype`` on torch
    quant: str  # as resolved: "gguf" (the file's own, on llama.cpp), "none", "4bit", "8bit"
    config: object  # attributes: hidden_size, vocab_size, num_hidden_layers, ... (a namespace or a transformers config)
    generation_config: dict  # the model's own sampling advice (GGUF ``general.sampling.*``, generation_config.json)
    backend: Decoder
    gguf_file: Path | None = None  # the GGUF file the model came from, if it did
    quant_is_default: bool = False  # ``quant`` was chosen by --quant auto
    context_limit: int | None = None  # positions whose KV cache fits in the free memory (None: the model's own)
    template_note: str | None = None  # said once where the chat template is not the model's own (ChatML fallback)
    network: object = None  # the transformers model, once built
    build_network: Callable[[], object] | None = None  # builds it on first use (training on a GGUF; None: built at load)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def model(self):
        """The transformers model. On a GGUF it is built on first use (training, the transformers comparisons)."""
        with self._lock:
            if self.network is None:
                if self.build_network is None:
                    raise ModelLoadError(f"{self.name} has no transformers model here")
                self.network = self.build_network()
            return self.network

    def release_model(self) -> None:
        """Drop a transformers model that was built on first use; decoding never needs it."""
        with self._lock:
            if self.build_network is not None and self.network is not None:
                self.network = None
                gc.collect()
                release_free_heap()

    @property
    def device_kind(self) -> str:
        """"cpu" or "cuda" (llama.cpp reports its offload in ``kernels``)."""
        return getattr(self.device, "type", self.device)

    @property
    def forward(self) -> str:
        """Which forward decodes: "llamacpp", "lean" or "transformers"."""
        return self.backend.describe().get("forward", self.backend.name)

    @property
    def kernels(self) -> dict:
        """What runs a step: the backend and its kernels (the lean forward's, transformers modules, llama.cpp)."""
        return self.backend.describe()

    @property
    def max_context(self) -> int:
        return min(self.backend.max_context, self.context_limit or self.backend.max_context)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Every token that ends an answer: the tokenizer's end-of-generation tokens and the generation config's."""
        ids = self.generation_config.get("eos_token_id")
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        ids.extend(getattr(self.tokenizer, "eog_token_ids", ()))
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return frozenset(ids)

    @property
    def num_bytes(self) -> int:
        """The weights decoding reads: the GGUF file on llama.cpp, the model's memory footprint on torch."""
        if self.gguf_file is not None and self.backend.name == "llamacpp":
            return self.gguf_file.stat().st_size
        return int(self.network.get_memory_footprint()) + int(getattr(self.backend, "extra_bytes", 0))
