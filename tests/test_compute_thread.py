"""llama.cpp's computations run on one thread whoever asks (the page's events, the API's requests, a background
calibration): llama.cpp's OpenMP build keeps a team of workers per calling thread, and on a 2-core CPU the teams
fought (ppd_core/backends/compute_thread.py). A caller interrupted meanwhile gets its interruption once the computation
in flight has ended."""

import _thread
import signal
import threading
import time

import llama_cpp

from ppd_core.backends.llamacpp import compute_thread


def test_every_llama_decode_runs_on_one_thread_and_answers_as_before(llama_default, monkeypatch):
    callers, runners = [], set()  # threads (not idents: a finished thread's ident is given to the next one)
    decode = llama_cpp.llama_decode

    def recorded(*args):
        runners.add(threading.current_thread())
        return decode(*args)

    monkeypatch.setattr(llama_cpp, "llama_decode", recorded)
    ids = llama_default.chat_ids([{"role": "user", "content": "Name three colors."}])
    answers = []

    def answer():
        callers.append(threading.current_thread())
        answers.append(llama_default.generate(ids, "ppd", 24).tokens)

    answer()
    for _ in range(2):  # two more threads, as the page's events come on Gradio's workers
        worker = threading.Thread(target=answer)
        worker.start()
        worker.join()
    assert len(set(callers)) == 3 and len(runners) == 1 and runners.isdisjoint(callers)
    assert answers[0] == answers[1] == answers[2] == llama_default.generate(ids, "plain", 24).tokens


def test_an_interrupted_caller_waits_for_the_computation_in_flight():
    # Python's own Ctrl+C handler for this test: an earlier test's server may have left another one on SIGINT
    # (Gradio's Node server stops the process there), and ``interrupt_main`` calls whichever is set
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_caller_waits()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_caller_waits() -> None:
    ended = []

    def computation():
        time.sleep(0.4)
        ended.append(time.monotonic())

    threading.Timer(0.05, _thread.interrupt_main).start()
    try:
        compute_thread.run(computation)
    except KeyboardInterrupt:
        interrupted = time.monotonic()
    else:
        raise AssertionError("the interruption was lost")
    assert ended and interrupted >= ended[0]  # raised after the computation ended, not in the middle of it
    assert compute_thread.run(lambda value: value + 1, 41) == 42  # the thread goes on serving
