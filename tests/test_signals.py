"""An interrupt (SIGTERM inside ``sigterm_interrupts``) that lands in Python code called back from C is not lost:
ctypes drops the KeyboardInterrupt raised there, so it is asked again and reaches the main code (CI once saw a
training's Stop land in llama.cpp's log callback: the trainer ran on until killed, not resumable)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time

import pytest

from app.signals import sigterm_interrupts

COMPARE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


def spin_until(deadline: float) -> None:
    while time.monotonic() < deadline:
        time.sleep(0.01)


def sort_with_a_callback_that_is_interrupted() -> list[str]:
    """libc's qsort calls back into Python; SIGTERM arrives during the first call and is handled inside it."""
    calls: list[str] = []

    @COMPARE
    def compare(a, b):
        calls.append("compare")
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            spin_until(time.monotonic() + 0.5)  # the handler runs here, inside the callback
        return 0

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    values = (ctypes.c_int * 8)(*range(8))
    libc.qsort(values, 8, ctypes.sizeof(ctypes.c_int), compare)
    return calls


def test_an_interrupt_dropped_inside_a_c_callback_still_interrupts_the_run():
    interrupted, after_the_callback = False, False
    ctrl_c = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a server's own Ctrl+C handling must not matter
    try:
        with sigterm_interrupts():
            sort_with_a_callback_that_is_interrupted()  # ctypes prints "Exception ignored ..." and goes on
            after_the_callback = True
            spin_until(time.monotonic() + 2.0)  # the interrupt, asked again, lands here
            pytest.fail("the interrupt dropped inside the callback was lost")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, ctrl_c)
    assert after_the_callback and interrupted
