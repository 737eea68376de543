"""Which wing loads which kind of model: one line per (backend, model format). Adding a backend is its folder under
``ppd_core/backends/`` plus its lines here; ``ppd_core.loading`` resolves ``--model`` and asks this table, never
which backend or format it holds. Loaders are named by module and function and imported on use, so a GGUF on
llama.cpp never imports torch.

A loader is ``load(path, name, options) -> LoadedModel`` (``ppd_core.loaded``), raising a one-line ModelLoadError.
This table imports nothing of ppd, so the command line's choices can read it (``options.BACKEND_CHOICES``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Literal

BackendName = Literal["llamacpp", "torch"]  # the wings, each a folder under ``ppd_core/backends/`` with its lines below
Loader = Callable[..., Any]  # load(path: Path, name: str, options: LoadOptions) -> LoadedModel

FORMATS = {"gguf": "a GGUF file", "hf": "a Hugging Face model directory"}  # a model's format: what it is on disk
LOADERS: dict[tuple[str, str], str] = {  # (backend, format): "module:function"
    ("llamacpp", "gguf"): "ppd_core.backends.llamacpp.loading:load_file",
    ("torch", "hf"): "ppd_core.backends.torch.loading:load_hf",
    ("torch", "gguf"): "ppd_core.backends.torch.loading:load_gguf_with_transformers",  # a de-quantized copy, on request
}
DEFAULTS = {"gguf": "llamacpp", "hf": "torch"}  # the backend ``--backend auto`` picks for a format
TRAINING = "ppd_core.backends.torch.loading:training_network"  # builds the transformers model training differentiates


def backends() -> tuple[str, ...]:
    """Every backend some model format loads on, in table order."""
    return tuple(dict.fromkeys(backend for backend, _ in LOADERS))


def loader(backend: str, model_format: str) -> Loader | None:
    """The loader of ``model_format`` on ``backend`` ("auto": the format's default); None where that backend runs no
    such model (``refusal`` says why)."""
    backend = DEFAULTS[model_format] if backend == "auto" else backend
    where = LOADERS.get((backend, model_format))
    return None if where is None else named(where)


def refusal(backend: str, model_format: str) -> str:
    """Why ``backend`` does not load ``model_format``, in one line."""
    if backend not in backends():
        return f"unknown backend {backend!r}; choose one of {', '.join(('auto', *backends()))}"
    runs = " or ".join(FORMATS[f] for b, f in LOADERS if b == backend)
    return f"the {backend} backend runs {runs}; this is {FORMATS[model_format]}"


def named(where: str) -> Callable:
    """The function ``"module:function"`` names, its module imported now."""
    module, _, function = where.partition(":")
    return getattr(importlib.import_module(module), function)
