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


M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas (one per thread by default, up to 8 per core): a server's worker threads then share
    them instead of each keeping its own partly free heap. Elsewhere nothing to do."""
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass
