"""The names a user may choose from (backends, quantizations, devices, trees...): plain data, no torch.

``ppd --help`` and argument errors read these without importing torch or any model code; the modules
that act on a choice import the same names from here.
"""

from __future__ import annotations

from ppd_core.backend_registry import backends

BackendChoice = str  # what the user asks for: "auto" (llama.cpp for a GGUF, else torch) or a ``backend_registry.BackendName``
BACKEND_CHOICES: tuple[BackendChoice, ...] = ("auto", *backends())  # the registry's: a new wing's lines there make it a choice
QUANT_CHOICES = ("auto", "none", "4bit", "8bit")  # torch: auto = none (the model's own weights); 4bit/8bit: bitsandbytes
DEVICE_CHOICES = ("auto", "cpu", "cuda")
FORWARD_CHOICES = ("lean", "transformers")
DTYPE_NAMES = ("auto", "float32", "bfloat16", "float16")
STATIC_TREE_NAMES = ("small", "medium", "large")  # ppd_core/static_trees.py
MAX_LOOKUP = 64  # longest chain a user may ask for
