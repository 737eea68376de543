"""Perplexity of a GGUF file on a text, as llama.cpp's ``llama-perplexity`` measures it.

The text (``SHIPPED_TEXT``: chapters I and II of *Alice's Adventures in Wonderland*, public domain, as Project
Gutenberg gives it) is tokenized with BOS, cut into chunks of ``context`` tokens, each chunk's first token made BOS
and decoded from an empty cache; the tokens of its second half are scored (each then has at least half a chunk
before it): perplexity = exp(mean negative log-likelihood). Two files of one model compared on it say what a
quantization cost.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ppd_core.backends.llamacpp.batch import Batch

from ppd_core.backends.llamacpp.library import LlamaCppError, import_llama_cpp, quiet_logs
from ppd_core.backends.llamacpp.text import GgufTokenizer

SHIPPED_TEXT = Path(__file__).resolve().parents[3] / "assets" / "alice-chapters-1-2.txt"
CONTEXT = 512


@dataclass(frozen=True)
class Perplexity:
    value: float
    scored_tokens: int  # tokens whose likelihood counted
    chunks: int
    context: int


def perplexity(gguf_file: Path, text: str, threads: int, context: int = CONTEXT) -> Perplexity:
    """``gguf_file``'s perplexity on ``text`` (see the module's docstring); on the CPU (nothing offloaded)."""
    llama = import_llama_cpp()
    llama.llama_backend_init()
    quiet_logs(llama)
    model_params = llama.llama_model_default_params()
    model_params.n_gpu_layers = 0
    model = llama.llama_model_load_from_file(str(gguf_file).encode(), model_params)
    if not model:
        raise LlamaCppError(f"llama.cpp could not load {Path(gguf_file).name}")
    params = llama.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = context
    params.n_threads = params.n_threads_batch = threads
    params.no_perf = True
    ctx = llama.llama_init_from_model(model, params)
    batch = None
    try:
        if not ctx:
            raise LlamaCppError(f"llama.cpp could not make a {context}-token context for {Path(gguf_file).name}")
        tokenizer = GgufTokenizer(model, llama)
        tokens = np.asarray(tokenizer.encode(text, add_special_tokens=True), dtype=np.int32)  # [N]
        chunks = len(tokens) // context
        if chunks < 1:
            raise LlamaCppError(f"the text has {len(tokens)} tokens, fewer than one {context}-token chunk")
        vocab = llama.llama_vocab_n_tokens(tokenizer.vocab)
        bos = tokenizer.bos_token_id
        first = context // 2
        batch = Batch(llama, 1)
        total, scored = 0.0, 0
        for chunk in range(chunks):
            ids = tokens[chunk * context : (chunk + 1) * context].copy()  # [context]
            if bos is not None:
                ids[0] = bos
            llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
            batch.tokens[:context] = ids
            outputs = np.zeros(context, dtype=np.int8)
            outputs[first : context - 1] = 1  # rows whose next token is scored
            batch.fill(np.arange(context), [[0]] * context, outputs)
            batch.raw.n_tokens = context
            if llama.llama_decode(ctx, batch.raw) != 0:
                raise LlamaCppError(f"llama_decode failed on chunk {chunk + 1} of {chunks}")
            rows = context - 1 - first
            pointer = llama.llama_get_logits(ctx)
            logits = np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)), shape=(rows, vocab))
            logits = logits.astype(np.float64)  # [rows, vocab]
            top = logits.max(axis=1, keepdims=True)
            log_norm = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]  # [rows]
            targets = ids[first + 1 :]  # [rows]: the token after each scored row
            total += float((log_norm - logits[np.arange(rows), targets]).sum())
            scored += rows
        return Perplexity(math.exp(total / scored), scored, chunks, context)
    finally:
        if batch is not None:
            batch.free()
        if ctx:
            llama.llama_free(ctx)
        llama.llama_model_free(model)
