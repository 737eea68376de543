"""Process memory housekeeping shared by the loaders."""

from __future__ import annotations

import ctypes


def release_free_heap() -> None:
    """Hand freed heap memory back to the OS (glibc's ``malloc_trim``; elsewhere nothing to do): after a model is
    closed or a large transient is dropped, glibc keeps the freed chunks of a grown heap otherwise."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
