"""llama.cpp's libraries bind their C++ symbols to the process's C++ runtime, whatever was imported before them.

On an H200 machine every model load of a CUDA build segfaulted in the tokenizer's ``std::regex`` when torch,
sentencepiece or tokenizers had been imported first (their ``libstdc++`` private to them, ``libggml-cuda``'s own
template copies bound instead). ``import_llama_cpp`` makes the runtime global first; the crash itself needs a CUDA
build, so this checks the cause here: after torch, the runtime is private; after ``import_llama_cpp``, global."""

import subprocess
import sys

import pytest

SCRIPT = """
import ctypes
import torch  # links libstdc++ into its own scope
visible = lambda: hasattr(ctypes.CDLL(None), "_ZSt4cout")  # std::cout, seen from the global scope
before = visible()
from ppd_core.backends.llamacpp.library import import_llama_cpp
import_llama_cpp()
print(before, visible())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the dynamic loader's scopes are Linux's")
def test_the_cxx_runtime_is_global_before_llama_cpp_loads():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["False", "True"], out.stdout + out.stderr
