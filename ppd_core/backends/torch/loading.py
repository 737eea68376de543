"""Models on torch: a Hugging Face directory (or ``hf:OWNER/REPO``) through transformers: the numerics chosen and
checked first, the weights' memory estimated, the context fitted, then the model and its decoder built. A GGUF
comes here only where asked (``--backend torch``, or training on one), through its cached float32 copy
(``gguf_copy``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, BitsAndBytesConfig, PreTrainedTokenizerFast

from ppd_core.backends.torch.decoder import TorchDecoder
from ppd_core.backends.torch.gguf_copy import dequantized_copy, quiet_transformers
from ppd_core.backends.torch.device import fit_threads_to_cores, memory_of, torch_properties
from ppd_core.device_policy import (
    MIN_CONTEXT, DeviceProperties, compute_dtype, context_that_fits, kv_bytes_per_token, version_notes,
)
from ppd_core.backends.torch.lean.model import LeanDecoder, sliding_window, unsupported_reason
from ppd_core.loaded import LoadedModel, LoadOptions, ModelLoadError, end_of_answer_ids
from ppd_core.memory import release_free_heap
from ppd_core.options import DEVICE_CHOICES, DTYPE_NAMES, FORWARD_CHOICES, QUANT_CHOICES

log = logging.getLogger(__name__)

DTYPE_CHOICES = dict(zip(DTYPE_NAMES, (None, torch.float32, torch.bfloat16, torch.float16)))
BITSANDBYTES = ("4bit", "8bit")
LINEAR_BYTES = {"8bit": 1.0, "4bit": 0.56}  # bytes per linear-layer weight with bitsandbytes (NF4 with its scales)


# --- choices ----------------------------------------------------------------------------------


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
    properties = torch_properties(target)
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


def load_hf(folder: Path, name: str, options: LoadOptions) -> LoadedModel:
    """A Hugging Face model directory (a Hub model's already fetched) on torch; ModelLoadError (one line) where it
    cannot be loaded here."""
    quiet_transformers()
    return load_folder(folder, name, pick_numerics(options.quant, options.device, options.dtype, options.forward))


def load_folder(folder: Path, name: str, numerics: Numerics, gguf_file: Path | None = None) -> LoadedModel:
    """The model in the Hugging Face directory ``folder`` (``gguf_file``: the GGUF it was converted from)."""
    fit_threads_to_cores()
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
    advice = network.generation_config.to_diff_dict()  # only what the model's files set
    return LoadedModel(
        tokenizer=tokenizer, name=name, source=str(gguf_file or folder), device=target, dtype=torch_dtype,
        quant=resolved, config=network.config, generation_config=advice,
        backend=TorchDecoder(pick_decoder(network, numerics.forward)), num_bytes=int(network.get_memory_footprint()),
        eos_token_ids=end_of_answer_ids(advice, [tokenizer.eos_token_id]), token_bytes=partial(token_bytes, tokenizer),
        gguf_file=gguf_file,
        quant_is_default=numerics.quant_is_default, context_limit=context, network=network,
    )


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes ``token`` adds to a text, by a transformers tokenizer (a control token's own text)."""
    return tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(int(token))]).encode()


def load_gguf_with_transformers(gguf_file: Path, name: str, options: LoadOptions) -> LoadedModel:
    """``gguf_file`` on torch (``--backend torch``): transformers' float32 copy (cached), after one warning line
    saying what it costs; then as a Hugging Face directory (any --dtype, --quant 4bit / 8bit, --forward). The choices
    are checked first: a wrong one costs no conversion."""
    numerics = pick_numerics(options.quant, options.device, options.dtype, options.forward)
    return load_folder(dequantized_copy(gguf_file, name), name, numerics, gguf_file)


def training_network(gguf_file: Path, name: str | None = None) -> torch.nn.Module:
    """The float32 transformers model of ``gguf_file`` on the CPU, frozen (training on a model that decodes on
    llama.cpp; ``LoadedModel.build_network``), after the same warning line."""
    name = name or gguf_file.stem
    folder = dequantized_copy(gguf_file, name)
    return build_network(folder, {"dtype": torch.float32}, torch.device("cpu"), name)
