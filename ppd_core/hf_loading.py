"""Models on torch: a Hugging Face directory (or ``hf:OWNER/REPO``) through transformers, and a GGUF file only
where that is asked for (``--backend torch``, or training on one), de-quantized by transformers to float32.

A GGUF's float32 copy is cached once as a plain Hugging Face directory in the user's cache (keyed by the
file's path, size and modification time): transformers takes about 20 s to de-quantize the default model
(minutes for a large one) and parses the whole GGUF into memory to do it, while the cached copy loads in well
under a second, memory-mapped, and can be re-quantized by bitsandbytes. Training, calibration's acceptance
pass and the transformers comparisons all load it again, so that conversion is paid once, not every time; the
cost is disk, said with the memory in the one warning line that comes first (``dequantization_note``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import torch
from filelock import FileLock, Timeout
from transformers import AutoConfig, AutoTokenizer, BitsAndBytesConfig, PreTrainedTokenizerFast

from ppd_core import hub
from ppd_core.atomic_files import atomic_directory
from ppd_core.backends.torch_backend import TorchDecoder
from ppd_core.device_info import memory_of
from ppd_core.device_policy import (
    MIN_CONTEXT, DeviceProperties, compute_dtype, context_that_fits, kv_bytes_per_token, properties_of, version_notes,
)
from ppd_core.lean.model import LeanDecoder, sliding_window, unsupported_reason
from ppd_core.loaded import LoadedModel, ModelLoadError
from ppd_core.memory import release_free_heap
from ppd_core.options import DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, QUANT_CHOICES

log = logging.getLogger(__name__)

DTYPE_CHOICES = dict(zip(DTYPE_NAMES, (None, torch.float32, torch.bfloat16, torch.float16)))
BITSANDBYTES = ("4bit", "8bit")
LINEAR_BYTES = {"8bit": 1.0, "4bit": 0.56}  # bytes per linear-layer weight with bitsandbytes (NF4 with its scales)
FLOAT32_BYTES = 4
GGUF_BITS_PER_WEIGHT = 4.5  # a guess for a file whose header cannot be read: about Q4 (the size-based estimate)


# --- choices ----------------------------------------------------------------------------------


def quiet_transformers() -> None:
    """transformers' own progress bars and notices off: ppd reports loading in its own lines."""
    import transformers  # noqa: PLC0415 - already imported above; its logging module

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


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


def pick_quant(quant: str, target: torch.device) -> str:
    """"none", "4bit" or "8bit" ("auto" is "none": the model's own weights at the compute dtype)."""
    if quant not in QUANT_CHOICES:
        raise ModelLoadError(f"unknown quantization {quant!r}; choose one of {', '.join(QUANT_CHOICES)}")
    quant = "none" if quant == "auto" else quant
    if quant == "8bit" and target.type != "cuda":
        raise ModelLoadError("bitsandbytes 8-bit runs on CUDA only; on a CPU use --quant 4bit, or a GGUF file on llama.cpp")
    if quant in BITSANDBYTES and importlib.util.find_spec("bitsandbytes") is None:  # an optional extra
        raise ModelLoadError(f"--quant {quant} needs bitsandbytes, which is not installed: pip install 'ppd[quant]'")
    return quant


@dataclass(frozen=True)
class Numerics:
    """The torch choices, resolved and checked before anything loads."""

    device: torch.device
    dtype: torch.dtype
    quant: str  # "none", "4bit" or "8bit"
    quant_is_default: bool  # --quant auto
    forward: str  # "lean" or "transformers"


def pick_numerics(quant: str, device: str, dtype: str, forward: str) -> Numerics:
    """``Numerics`` from the command line's names; ModelLoadError (one line) for a choice that cannot run here."""
    if forward not in FORWARD_CHOICES:
        raise ModelLoadError(f"unknown forward {forward!r}; choose one of {', '.join(FORWARD_CHOICES)}")
    target = pick_device(device)
    properties = properties_of(target)
    numerics = Numerics(target, pick_dtype(properties, dtype), pick_quant(quant, target), quant == "auto", forward)
    for note in version_notes(properties):
        log.warning(note)
    return numerics


# --- memory -----------------------------------------------------------------------------------


def checkpoint_parameters(folder: Path) -> tuple[int, int] | None:
    """(all parameters, input-embedding parameters) from ``folder``'s safetensors headers alone (no tensor is
    read); None where it has none."""
    from safetensors import safe_open  # noqa: PLC0415

    index = folder / "model.safetensors.index.json"
    try:
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())) if index.is_file() \
            else ["model.safetensors"]
        total = embedding = 0
        for name in files:
            with safe_open(folder / name, framework="pt") as checkpoint:
                for tensor in checkpoint.keys():
                    count = 1
                    for size in checkpoint.get_slice(tensor).get_shape():
                        count *= size
                    total += count
                    embedding += count if "embed_tokens" in tensor else 0
    except Exception:  # noqa: BLE001 - no file, no header, another format: counted on a skeleton instead
        return None
    return total, embedding


def estimated_bytes(config, dtype: torch.dtype, quant: str, folder: Path) -> int:
    """Weights in memory: embeddings stay at ``dtype``; bitsandbytes quantizes the linear layers.

    Parameters are counted from ``folder``'s safetensors headers where it has them, else on a
    meta-device skeleton of the model (which imports its code).
    """
    counts = checkpoint_parameters(folder)
    if counts is None:
        from transformers import AutoModelForCausalLM  # noqa: PLC0415 - the model code

        with torch.device("meta"):
            skeleton = AutoModelForCausalLM.from_config(config)
        counts = sum(p.numel() for p in skeleton.parameters()), skeleton.get_input_embeddings().weight.numel()
    total, embedding = counts
    element = torch.finfo(dtype).bits / 8
    return int(embedding * element + (total - embedding) * LINEAR_BYTES.get(quant, element))


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
        log.warning("context limited to %d of %d tokens: the KV cache of more would not fit in the free memory",
                    context, positions)
    return context


# --- the model --------------------------------------------------------------------------------


def build_network(folder: Path, kwargs: dict, target: torch.device, name: str) -> torch.nn.Module:
    """The transformers model from ``folder``, frozen, on ``target``."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - the model code: imported only where a model is built

    try:
        network = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"could not load {name}: {str(error).splitlines()[0]}") from None
    if "device_map" not in kwargs:  # loaded where it runs: a GPU's weights are never staged in CPU memory
        network.to(target)
    return network.eval().requires_grad_(False)


def pick_decoder(model: torch.nn.Module, forward: str) -> LeanDecoder | torch.nn.Module:
    """The lean forward where the architecture allows it (else a one-line notice), or the model itself."""
    if forward == "transformers":
        return model
    reason = unsupported_reason(model)
    if reason is not None:
        log.warning("lean forward unavailable (%s): using the transformers forward", reason)
        return model
    decoder = LeanDecoder(model)
    release_free_heap()
    return decoder


def load_hf(model: str, quant: str = "auto", device: str = "auto", dtype: str = "auto",
            forward: str = "lean") -> LoadedModel:
    """A Hugging Face model directory, or ``hf:OWNER/REPO`` (downloaded first), on torch; ModelLoadError (one line)
    where it cannot be loaded here (the choices are checked before anything is downloaded)."""
    quiet_transformers()
    hub_model = hub.parse(model)
    if hub_model is not None and hub_model.file:
        raise ModelLoadError(f"{model} is a GGUF file: it runs on llama.cpp (or, de-quantized, with --backend torch)")
    numerics = pick_numerics(quant, device, dtype, forward)
    folder = hub.fetch(hub_model) if hub_model else Path(model).expanduser()
    if not folder.exists():
        raise ModelLoadError(f"model not found: {folder}")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json: not a Hugging Face model directory")
    return load_folder(folder, hub_model.name if hub_model else folder.name, numerics)


def load_folder(folder: Path, name: str, numerics: Numerics, gguf_file: Path | None = None) -> LoadedModel:
    """The model in the Hugging Face directory ``folder`` (``gguf_file``: the GGUF it was converted from)."""
    target, torch_dtype, resolved = numerics.device, numerics.dtype, numerics.quant
    try:
        config = AutoConfig.from_pretrained(folder)
        needed = estimated_bytes(config, torch_dtype, resolved, folder)
    except (OSError, ValueError, KeyError) as error:
        raise ModelLoadError(f"{gguf_file or folder} is not a supported causal LM ({str(error).splitlines()[0]})") from None
    window = sliding_window(config)
    if window is not None:  # the tree's cache compaction assumes every position stays in the cache
        raise ModelLoadError(f"{name} attends to a sliding window of {window} tokens, which ppd's torch backend does not "
                             "support; run its GGUF file on the llama.cpp backend")
    context = context_for_memory(config, torch_dtype, needed, target, name)

    kwargs: dict = {"dtype": torch_dtype}
    if resolved in BITSANDBYTES:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=resolved == "4bit",
            load_in_8bit=resolved == "8bit",
            bnb_4bit_quant_type="nf4",
            # fp32 compute on a CPU: measured 90 ms per token against 138 ms with bf16 compute
            bnb_4bit_compute_dtype=torch_dtype,
        )
    if resolved in BITSANDBYTES or target.type == "cuda":
        kwargs["device_map"] = {"": target}  # each tensor goes straight to the GPU in the target dtype
    try:
        # a converted GGUF always has tokenizer.json: read it as it is (AutoTokenizer rebuilds it: +90 MB here)
        tokenizer = (PreTrainedTokenizerFast if gguf_file else AutoTokenizer).from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"could not load {name}: {str(error).splitlines()[0]}") from None
    network = build_network(folder, kwargs, target, name)
    return LoadedModel(
        tokenizer=tokenizer, name=name, source=str(gguf_file or folder), device=target, dtype=torch_dtype,
        quant=resolved, config=network.config, generation_config=network.generation_config.to_diff_dict(),
        backend=TorchDecoder(pick_decoder(network, numerics.forward)), gguf_file=gguf_file,
        quant_is_default=numerics.quant_is_default, context_limit=context, network=network,
    )


# --- a GGUF file through transformers ---------------------------------------------------------


def load_gguf_with_transformers(gguf_file: Path, name: str, quant: str = "auto", device: str = "auto",
                                dtype: str = "auto", forward: str = "lean") -> LoadedModel:
    """``gguf_file`` on torch (``--backend torch``): transformers' float32 copy (cached), after one warning line
    saying what it costs; then as a Hugging Face directory (any --dtype, --quant 4bit / 8bit, --forward). The choices
    are checked first: a wrong one costs no conversion."""
    numerics = pick_numerics(quant, device, dtype, forward)
    return load_folder(dequantized_copy(gguf_file, name), name, numerics, gguf_file)


def training_network(gguf_file: Path, name: str | None = None) -> torch.nn.Module:
    """The float32 transformers model of ``gguf_file`` on the CPU, frozen (training on a model that decodes on
    llama.cpp; ``LoadedModel.build_network``), after the same warning line."""
    name = name or gguf_file.stem
    folder = dequantized_copy(gguf_file, name)
    return build_network(folder, {"dtype": torch.float32}, torch.device("cpu"), name)


def dequantized_copy(gguf_file: Path, name: str) -> Path:
    """The cached float32 copy of ``gguf_file``, made now if there is none; refused in one line where the float32
    model would not fit in the free memory. Logs ``dequantization_note`` first."""
    quiet_transformers()
    gguf_file = Path(gguf_file)
    target = conversion_folder(gguf_file)
    cached = (target / "config.json").is_file()
    parameters = copy_bytes(target) // FLOAT32_BYTES if cached else gguf_parameters(gguf_file)
    log.warning(dequantization_note(name, parameters))
    free = memory_of(torch.device("cpu")).free_bytes
    if not cached and parameters * FLOAT32_BYTES > free:
        raise ModelLoadError(f"transformers' float32 copy of {name} needs about {gigabytes(parameters * FLOAT32_BYTES)} GB "
                             f"but only {gigabytes(free)} GB is free; run it on llama.cpp (leave out --backend torch)")
    return converted_gguf_dir(gguf_file)


def dequantization_note(name: str, parameters: int) -> str:
    """The one line said before a GGUF goes through transformers: its float32 size in memory and on disk."""
    size = gigabytes(parameters * FLOAT32_BYTES)
    return (f"transformers de-quantizes {name} to float32: about {size} GB of memory "
            f"(and {size} GB on disk for the cached copy)")


def gigabytes(count: int) -> str:
    value = count / 1e9
    return f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def gguf_parameters(gguf_file: Path) -> int:
    """Weights in ``gguf_file``: its tensors' element counts (``gguf.GGUFReader``: about 2 s for the default
    model), or an estimate from its size where the header cannot be read."""
    import gguf  # noqa: PLC0415

    try:
        return sum(int(tensor.n_elements) for tensor in gguf.GGUFReader(gguf_file).tensors)
    except Exception:  # noqa: BLE001 - whatever is wrong with it, transformers' conversion will say
        return int(gguf_file.stat().st_size * 8 / GGUF_BITS_PER_WEIGHT)


def copy_bytes(folder: Path) -> int:
    """Bytes of the weights in a cached copy (float32 safetensors)."""
    return sum(path.stat().st_size for path in folder.glob("*.safetensors"))


GGUF_SOURCE_FILE = ".ppd-gguf-source"  # in each conversion: the resolved path of the GGUF it came from
GGUF_LOCK_TIMEOUT_S = 1800  # a conversion of a large GGUF can take minutes


def conversion_folder(gguf_file: Path) -> Path:
    """Where the Hugging Face copy of ``gguf_file`` lives (keyed by path, size and modification time)."""
    stat = gguf_file.stat()
    key = hashlib.sha256(f"{gguf_file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return Path(platformdirs.user_cache_dir("ppd")) / "gguf" / f"{gguf_file.stem}-{key}"


def converted_gguf_dir(gguf_file: Path) -> Path:
    """A Hugging Face copy of a GGUF model in the user's cache, made on first use.

    A file lock per GGUF stem serializes conversions: a second process waits, then reuses the first
    one's result. A new conversion deletes older conversions of the same file.
    """
    target = conversion_folder(gguf_file)
    cache = target.parent
    if (target / "config.json").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    lock = FileLock(cache / f".{gguf_file.stem}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another process is converting %s; waiting for it", gguf_file.name)
        try:
            lock.acquire(timeout=GGUF_LOCK_TIMEOUT_S)
        except Timeout:
            raise ModelLoadError(f"another process has been converting {gguf_file.name} for {GGUF_LOCK_TIMEOUT_S} s "
                                 f"(lock {lock.lock_file})") from None
    try:
        if not (target / "config.json").is_file():
            shutil.rmtree(target, ignore_errors=True)  # an incomplete folder, never made by this code
            log.info("converting %s once; cached in %s", gguf_file.name, target)
            with atomic_directory(target) as staging:
                _convert_gguf(gguf_file, staging)
                (staging / GGUF_SOURCE_FILE).write_text(str(gguf_file.resolve()), encoding="utf-8")
            _remove_stale_conversions(cache, gguf_file, target)
    finally:
        lock.release()
    return target


def _convert_gguf(gguf_file: Path, staging: Path) -> None:
    """Save a Hugging Face copy of ``gguf_file`` into ``staging``: the slow step."""
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - the model code: imported only where a model is built

    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
        model = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise ModelLoadError(f"transformers cannot load {gguf_file.name}: {str(error).splitlines()[0]}") from None
    # The GGUF quantizer marks the model unserializable; its weights are plain tensors by now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    model.generation_config.save_pretrained(staging)


def _remove_stale_conversions(cache: Path, gguf_file: Path, keep: Path) -> None:
    """Delete older conversions of ``gguf_file`` (made before it changed) and staging folders of killed runs.

    Runs under the stem's lock, so no staging folder of this stem belongs to a live conversion. A
    conversion of another file with the same stem (another folder) is kept: its source file differs.
    """
    stem = re.escape(gguf_file.stem)
    conversion, staging = re.compile(rf"{stem}-[0-9a-f]{{16}}"), re.compile(rf"\.{stem}-[0-9a-f]{{16}}\..+\.staging")
    source = str(gguf_file.resolve())
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
