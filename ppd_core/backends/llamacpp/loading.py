"""A GGUF file on llama.cpp, end to end: no conversion, no torch, no transformers.

The header (``info.read_gguf_info``) is read before anything loads, so a file that is not a GGUF, is truncated, names
an architecture llama.cpp does not know, or does not fit in memory with its KV cache is one line. Then
llama.cpp loads it and answers for the tokenizer, the special tokens and the chat template (``text.GgufTokenizer``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

from ppd_core.backends.llamacpp.cache import DEFAULT_MAX_CONTEXT
from ppd_core.backends.llamacpp.decoder import LlamaCppDecoder
from ppd_core.backends.llamacpp.info import GgufInfo, available_memory, check_memory, memory_needed, read_gguf_info
from ppd_core.backends.llamacpp.library import import_llama_cpp
from ppd_core.backends.llamacpp.text import GgufTokenizer
from ppd_core.device_policy import MEMORY_HEADROOM, MIN_CONTEXT
from ppd_core.faults import fault
from ppd_core.loaded import LoadedModel, LoadOptions, ModelLoadError, end_of_answer_ids
from ppd_core.sampling.params import gguf_sampling

log = logging.getLogger(__name__)


def model_config(info: GgufInfo, decoder: LlamaCppDecoder) -> SimpleNamespace:
    """What the app and training read of a model's shape, from the GGUF header and llama.cpp."""
    return SimpleNamespace(
        model_type=info.architecture, hidden_size=decoder.hidden, vocab_size=decoder.vocab_size,
        num_hidden_layers=info.block_count, num_attention_heads=info.head_count,
        max_position_embeddings=info.context_length or decoder.max_context, sliding_window=info.sliding_window,
    )


def context_for_memory(info: GgufInfo, wanted: int, available: int | None = None) -> int:
    """The longest context up to ``wanted`` whose KV cache fits beside the file in the free memory (with
    ``MEMORY_HEADROOM``); a shorter one than wanted is said in one line; NotEnoughMemoryError (one line) where not
    even ``MIN_CONTEXT`` positions fit."""
    available = int(MEMORY_HEADROOM * (available_memory() if available is None else available))
    context = wanted
    while context > MIN_CONTEXT and memory_needed(info, context) > available:
        context = max(MIN_CONTEXT, context // 2)
    check_memory(info, min(context, wanted), available)
    if context < wanted:
        log.warning("context limited to %d of %d tokens: the KV cache of more would not fit in the free memory",
                    context, wanted)
    return context


def load_file(path: Path, name: str, options: LoadOptions) -> LoadedModel:
    """A GGUF file on llama.cpp in its own quantization (``registry.LOADERS``): torch's numerics choices refused or
    said to be ignored first."""
    if options.quant not in ("auto", "none"):
        raise ModelLoadError(f"a GGUF runs in its own quantization on llama.cpp: --quant {options.quant} is for Hugging "
                             "Face models (or pass --backend torch)")
    if options.dtype != "auto" or options.forward != "lean":
        log.warning("--dtype and --forward choose torch numerics; %s runs on llama.cpp (pass --backend torch for them)",
                    path.name)
    return load_gguf(path, name, options.device, options.threads, options.gpu_layers)


def load_gguf(path: Path, name: str, device: str = "auto", threads: int = 0, gpu_layers: int | None = None) -> LoadedModel:
    """``path`` on llama.cpp; ModelLoadError (or another one-line PpdError) where it cannot run here. Its transformers
    model, for training, is the torch wing's to build (``LoadedModel.build_network``, set by ``ppd_core.loading``)."""
    info = read_gguf_info(path)  # GgufFileError: not a GGUF, truncated, unknown architecture
    context = context_for_memory(info, min(info.context_length or DEFAULT_MAX_CONTEXT, DEFAULT_MAX_CONTEXT))
    if device == "cuda" and not import_llama_cpp().llama_supports_gpu_offload():  # before anything loads
        raise ModelLoadError("--device cuda: this llama-cpp-python build has no GPU support "
                             "(`make setup` on a machine with nvcc and a GPU builds one)")
    decoder = LlamaCppDecoder(path, threads, gpu_layers, max_context=context,
                              architecture=info.architecture)
    try:
        fault("load.tokenizer")
        tokenizer = GgufTokenizer(decoder.model, decoder.llama, owner=decoder)
        advice = gguf_sampling(decoder.metadata)
    except BaseException:
        decoder.close()
        raise
    note = None if tokenizer.has_own_template else f"{name} has no chat template: chats use {tokenizer.template_source}"
    if note:
        log.warning(note)

    return LoadedModel(
        tokenizer=tokenizer, name=name, source=str(path), device="cpu", dtype="float32", quant="gguf",
        config=model_config(info, decoder), generation_config=advice, backend=decoder, num_bytes=path.stat().st_size,
        eos_token_ids=end_of_answer_ids(advice, [*tokenizer.eog_token_ids, tokenizer.eos_token_id]),
        token_bytes=tokenizer.token_bytes, gguf_file=path, quant_is_default=True, context_limit=context, template_note=note,
    )
