"""llama.cpp's library as ppd loads it: the import (with ggml's switches and the C++ runtime shared), its logs,
its build line, and llama-cpp-python's own ``Llama`` for the bench's peer. No model here."""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from pathlib import Path

from ppd_core.device_policy import llama_extra_buffers
from ppd_core.errors import PpdError

log = logging.getLogger(__name__)

LIVE_MODELS: set[int] = set()  # decoders whose llama.cpp model is loaded (tests count leaks with it)


class LlamaCppError(PpdError):
    """llama.cpp is missing, refused the model, or failed a decode; the message is one line."""


def import_llama_cpp():
    """The ``llama_cpp`` module, or LlamaCppError saying why it cannot be used.

    ggml's tiled K-quant matrix multiply (on by default since 2026) gives a batch of rows other logits than one
    row at a time: 0.3-0.9 apart on the default model re-quantized to Q4_K_M, Q5_K_M or Q6_K. It is turned off here,
    before ggml reads the switch at its first multiply, so a tree row gets the logits a plain step gives it.
    (ppd's build also leaves out llamafile's GEMM, which does the same to F16, Q5_0 and IQ4_NL rows: Makefile.)"""
    os.environ.setdefault("GGML_CPU_TILED_MM", "0")
    share_libstdcxx()
    try:
        import llama_cpp  # noqa: PLC0415 - optional: the torch backend runs without it
    except (ImportError, OSError) as error:  # OSError: a wheel whose shared library does not load
        raise LlamaCppError(f"llama-cpp-python is not usable here ({str(error).splitlines()[0]}); "
                            "`make setup` builds it") from None
    return llama_cpp


def share_libstdcxx() -> None:
    """Put the C++ runtime in the process's global scope before llama.cpp loads (Linux; a no-op where loaded so).

    A CUDA build's ``libggml-cuda`` exports C++ library template code of its own. Where a Python extension that links
    ``libstdc++`` (torch, sentencepiece, tokenizers: ``gguf`` imports sentencepiece) was imported first, the runtime
    sits in that extension's private scope, and ``libllama`` then binds some of its C++ symbols to ``libggml-cuda``'s
    copies: on an H200 machine (CUDA 13.0, llama-cpp-python 0.3.36) every model load segfaulted in the tokenizer's
    ``std::regex`` (benchmarks/measurements/h200-libstdcxx-segfault.md). Made global (dlopen promotes an object
    already loaded), the runtime's own symbols come first, in every import order tried there."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:  # no C++ runtime under that name (musl, a static build): nothing to share
            pass


def system_info(llama) -> str:
    """llama.cpp's build line (CPU features, GPU backends): the profile key's ``build`` and the extra-buffer policy."""
    return llama.llama_print_system_info().decode(errors="replace").strip()


def chat_model(gguf_file: Path, **options):
    """llama-cpp-python's own ``Llama`` on ``gguf_file`` (the bench's peer, what its users run), under ppd's
    extra-buffer policy: ``Llama`` takes no such option, so its default model parameters are amended while it
    loads (on an AMX build the default repacking segfaults: ``llama_extra_buffers``)."""
    llama = import_llama_cpp()
    allowed = llama_extra_buffers(system_info(llama))
    defaults = llama.llama_cpp.llama_model_default_params

    def amended():
        params = defaults()
        params.use_extra_bufts = allowed
        return params

    llama.llama_cpp.llama_model_default_params = amended
    try:
        return llama.Llama(model_path=str(gguf_file), **options)
    finally:
        llama.llama_cpp.llama_model_default_params = defaults


# llama.cpp warns that the cells (context + spare cells for parked rows) outnumber the model's trained
# context; positions never pass ``max_context``, which is at most the trained context
EXPECTED_WARNINGS = ("possible training context overflow",)


def quiet_logs(llama) -> None:
    """llama.cpp logs every load to stderr; keep its warnings and errors only (not the one about spare cells)."""
    @llama.llama_log_callback
    def callback(level, text, user_data):
        line = text.decode(errors="replace").rstrip()
        if level in (3, 4) and not any(expected in line for expected in EXPECTED_WARNINGS):  # WARN, ERROR
            log.warning("llama.cpp: %s", line)

    quiet_logs.callback = callback  # must outlive the call
    llama.llama_log_set(callback, ctypes.c_void_p(0))
