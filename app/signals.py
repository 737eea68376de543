"""SIGTERM handled as Ctrl+C: a service manager's stop runs the same ``finally`` blocks as a keyboard interrupt.

An interrupt that lands while the main thread runs Python code called back from C (llama.cpp's log callback, a
ctypes callback) is raised there and dropped by ctypes ("Exception ignored on calling ctypes callback function"):
the run would go on as if never asked to stop. Inside ``sigterm_interrupts`` such a dropped interrupt is asked
again a moment later, when the main thread has most likely left the callback.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading

REDELIVER_S = 0.02  # how long after a dropped interrupt it is asked again


@contextlib.contextmanager
def sigterm_interrupts():
    """SIGTERM raises KeyboardInterrupt (in the main thread) while inside: ``finally`` blocks run, exit code 130."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    timers: list[threading.Timer] = []

    def unraisable(info) -> None:
        if info.exc_type is KeyboardInterrupt:  # dropped inside a C callback: interrupt the main thread again
            timers.append(threading.Timer(REDELIVER_S, _thread.interrupt_main, (signal.SIGTERM,)))  # ``interrupt``
            timers[-1].start()
        else:
            previous_hook(info)

    previous, previous_hook = signal.signal(signal.SIGTERM, interrupt), sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for timer in timers:  # none asks again once outside
            timer.cancel()
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)
