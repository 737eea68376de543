"""llama.cpp's JSON-schema-to-GBNF converter, the one llama-server applies, from the library the set-up builds
(``ppd_core.native.build``): ``<venv>/share/ppd/libppd_schema.so``, or the file ``PPD_SCHEMA_LIB`` names."""

from __future__ import annotations

import ctypes
import functools
import json
import os
import sys
from pathlib import Path

LIBRARY_NAME = "libppd_schema.so"


def library_path() -> Path:
    return Path(os.environ.get("PPD_SCHEMA_LIB") or Path(sys.prefix) / "share" / "ppd" / LIBRARY_NAME)


@functools.cache
def converter() -> ctypes.CDLL | None:
    """The library, or None where the set-up did not build it."""
    path = library_path()
    if not path.is_file():
        return None
    library = ctypes.CDLL(str(path))
    library.ppd_json_schema_to_grammar.restype = ctypes.c_void_p
    library.ppd_json_schema_to_grammar.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    library.ppd_response_format_grammar.restype = ctypes.c_void_p
    library.ppd_response_format_grammar.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    library.ppd_free.argtypes = [ctypes.c_void_p]
    return library


def take_text(library: ctypes.CDLL, pointer: int) -> str:
    try:
        return ctypes.string_at(pointer).decode()
    finally:
        library.ppd_free(pointer)


def schema_to_gbnf(schema, response_format: bool = False) -> str:
    """GBNF for ``schema``; ValueError with llama.cpp's message where it cannot convert it (``converter()`` is
    not None). ``response_format``: as llama-server builds it for a chat's response_format (the JSON bare or in a
    ```json fence, whitespace around it)."""
    library, error = converter(), ctypes.c_void_p()
    convert = library.ppd_response_format_grammar if response_format else library.ppd_json_schema_to_grammar
    grammar = convert(json.dumps(schema).encode(), ctypes.byref(error))
    if not grammar:
        raise ValueError(" ".join(take_text(library, error.value).split()))
    return take_text(library, grammar)
