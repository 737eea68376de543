"""Which wing loads which kind of model: one line per (backend, model format). Adding a backend is its folder under
``ppd_core/backends/`` plus its lines here; ``ppd_core.loading`` resolves ``--model`` and asks this table, never
which backend or format it holds. Loaders are named by module and function and imported on use, so a GGUF on
llama.cpp never imports torch.

A loader is ``load(path, name, options) -> LoadedModel`` (``LoadOptions``), raising a one-line ModelLoadError.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from ppd_core.loaded import LoadedModel, LoadOptions

Loader = Callable[["Path", str, "LoadOptions"], "LoadedModel"]

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


def loader(backend: str, model_format: str) -> Loader:
    """The loader of ``model_format`` on ``backend`` ("auto": the format's default); ModelLoadError where that backend
    runs no such model."""
    from ppd_core.loaded import ModelLoadError  # noqa: PLC0415 - the table itself imports nothing of ppd

    backend = DEFAULTS[model_format] if backend == "auto" else backend
    if (backend, model_format) not in LOADERS:
        runs = " or ".join(FORMATS[f] for b, f in LOADERS if b == backend) or "no model"
        raise ModelLoadError(f"the {backend} backend runs {runs}; this is {FORMATS[model_format]}")
    return named(LOADERS[backend, model_format])


def named(where: str) -> Callable:
    """The function ``"module:function"`` names, its module imported now."""
    module, _, function = where.partition(":")
    return getattr(importlib.import_module(module), function)
