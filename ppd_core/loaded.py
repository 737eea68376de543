"""A loaded model, whichever loader made it: the decoding backend, its tokenizer and what the app reports; and
the options a model is loaded with.

No torch here: a GGUF file on llama.cpp never imports it. The torch loader puts torch objects in the same
fields (``device`` a ``torch.device``, ``network`` a transformers model).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppd_core.errors import PpdError
from ppd_core.memory import release_free_heap
from ppd_core.options import DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, QUANT_CHOICES

if TYPE_CHECKING:
    from ppd_core.backend import Backend, BackendInfo


class ModelLoadError(PpdError, RuntimeError):
    """A model that cannot be loaded here; the message is one line for the user."""


def end_of_answer_ids(generation_config: dict, tokenizer_ids: Iterable[int | None]) -> frozenset[int]:
    """Every token that ends an answer: the generation config's and the tokenizer's (its end of text, and on a GGUF
    every end-of-generation token llama.cpp names)."""
    ids = generation_config.get("eos_token_id")
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    return frozenset(ids + [token for token in tokenizer_ids if token is not None])


@dataclass(frozen=True)
class LoadOptions:
    """How to load a model: the command line's choices, by name (checked by ``check``)."""

    quant: str = "auto"  # a GGUF: its own; a Hugging Face model: none, 4bit or 8bit (bitsandbytes)
    device: str = "auto"
    dtype: str = "auto"
    forward: str = "lean"  # "lean" or "transformers" (torch)
    backend: str = "auto"  # "auto": llama.cpp for a GGUF file, torch for a Hugging Face model
    threads: int = 0  # llama.cpp's CPU threads; 0: one per core
    gpu_layers: int | None = None  # llama.cpp: layers offloaded to the GPU (None: all, on a GPU build)

    def check(self) -> None:
        """ModelLoadError (one line) for a name that is not one of the choices (the backend: the registry's,
        ``ppd_core.loading``)."""
        for value, choices, what in ((self.quant, QUANT_CHOICES, "quantization"), (self.device, DEVICE_CHOICES, "device"),
                                     (self.dtype, DTYPE_NAMES, "dtype"), (self.forward, FORWARD_CHOICES, "forward")):
            if value not in choices:
                raise ModelLoadError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


@dataclass
class LoadedModel:
    """A frozen causal LM, its tokenizer, and how it was loaded."""

    tokenizer: Any  # ``GgufTokenizer`` on llama.cpp, a transformers tokenizer on torch
    name: str
    source: str
    device: object  # "cpu" on llama.cpp (it offloads by itself); a ``torch.device`` on torch
    dtype: object  # "float32" on llama.cpp (logits and embedding rows); a ``torch.dtype`` on torch
    quant: str  # as resolved: "gguf" (the file's own, on llama.cpp), "none", "4bit", "8bit"
    config: object  # attributes: hidden_size, vocab_size, num_hidden_layers, ... (a namespace or a transformers config)
    generation_config: dict  # the model's own sampling advice (GGUF ``general.sampling.*``, generation_config.json)
    backend: Backend
    num_bytes: int  # the weights decoding reads: the GGUF file on llama.cpp, the model's memory footprint on torch
    eos_token_ids: frozenset[int]  # every token that ends an answer (``end_of_answer_ids``)
    token_bytes: Callable[[int], bytes]  # the bytes a token adds to a text (a control token's own text), as the API names it
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
    def info(self) -> BackendInfo:
        """What the backend is (name, vocabulary, context, threads, device, kernels), as everything outside decoding
        reads it."""
        return self.backend.info

    @property
    def device_kind(self) -> str:
        """"cpu" or "cuda" (llama.cpp reports its offload in ``kernels``)."""
        return self.info.device_kind

    @property
    def forward(self) -> str:
        """Which forward decodes: "llamacpp", "lean" or "transformers"."""
        return self.info.forward

    @property
    def kernels(self) -> dict:
        """What runs a step: the backend and its kernels (the lean forward's, transformers modules, llama.cpp)."""
        return self.info.kernels

    @property
    def max_context(self) -> int:
        return min(self.info.max_context, self.context_limit or self.info.max_context)
