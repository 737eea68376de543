"""One thread for every llama.cpp graph computation in the process.

llama.cpp's CPU backend, built with OpenMP (the wheel's default), keeps a team of worker threads per thread that calls
``llama_decode``. The app calls it from many threads (the page's events, the API's requests, a background calibration,
Compare), and on a 2-core CPU the teams fight: a plain step called from a second thread ran 2.5x slower than from
the first (the default model, 5.1 ms against 13 ms; `ModelHost.compare` from the main thread and from a new one,
same process). Every computation runs here instead, so one team serves them all.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppd-llama-compute")
_compute: list[threading.Thread] = []  # the pool's thread, once it has run something


def _mark() -> None:
    _compute[:] = [threading.current_thread()]


def run(function: Callable[..., T], *args) -> T:
    """``function(*args)`` on the compute thread, its result or exception here. An interruption of the caller
    (Ctrl+C, the page's Stop of a training) waits for the computation in flight to end and is then raised: llama.cpp's
    state is never left mid-decode by a caller that moved on."""
    if _compute and threading.current_thread() is _compute[0]:
        return function(*args)
    future = _pool.submit(lambda: (_mark(), function(*args))[1])
    interrupted: BaseException | None = None
    while True:
        try:
            result = future.result()
            break
        except KeyboardInterrupt as error:  # raised in the caller while it waited, not by the computation
            if future.done() and future.exception() is error:
                raise
            interrupted = error
    if interrupted is not None:
        raise interrupted
    return result
