"""The model's line (app/model_queue.py) and ModelHost as the one door: order, bound, giving up, recovery."""

import threading
import time

import pytest

from app.model_queue import Busy, ModelQueue, Queued


def drain(waiting) -> tuple[int, bool]:
    """Run a ``wait`` generator to its end: (how many Queued it yielded, whether it holds the model)."""
    count = 0
    while True:
        try:
            assert isinstance(next(waiting), Queued)
            count += 1
        except StopIteration as done:
            return count, done.value


def test_first_come_first_served_one_at_a_time():
    queue, order, inside = ModelQueue(max_waiting=8), [], []
    first = queue.hold()  # the test holds the model while the threads line up

    def call(name):
        ticket = queue.join()
        joined.set()
        _, held = drain(queue.wait(ticket))
        assert held
        inside.append(name)
        assert len(inside) == 1  # nobody else holds it now
        order.append(name)
        time.sleep(0.01)
        inside.remove(name)
        queue.leave(ticket)

    threads = []
    for name in range(6):
        joined = threading.Event()
        threads.append(threading.Thread(target=call, args=(name,)))
        threads[-1].start()
        assert joined.wait(5)  # each joins before the next starts: the order of arrival is known
    assert queue.waiting == 6 and queue.busy
    queue.leave(first)
    for thread in threads:
        thread.join(10)
    assert order == list(range(6)) and not queue.busy and queue.waiting == 0


def test_a_full_line_refuses_with_a_retry_time():
    queue = ModelQueue(max_waiting=2)
    holder = queue.hold()
    waiting = [queue.join(), queue.join()]
    with pytest.raises(Busy) as refused:
        queue.join()
    assert refused.value.waiting == 2 and refused.value.retry_after >= 1 and "busy" in str(refused.value)
    with pytest.raises(Busy):
        queue.check_room()
    queue.leave(waiting[0])  # a place frees up: a new caller gets it
    queue.check_room()
    waiting.append(queue.join())
    for ticket in (holder, *waiting):
        queue.leave(ticket)
    assert not queue.busy and queue.waiting == 0


def test_stop_while_waiting_gives_up_the_place_and_the_next_one_moves_up():
    queue = ModelQueue(max_waiting=4)
    holder = queue.hold()
    quitter, next_one = queue.join(), queue.join()
    stopped = threading.Event()
    waiting = queue.wait(quitter, stop=stopped.is_set)
    assert next(waiting) == Queued(1) and queue.waiting == 2
    stopped.set()
    assert drain(waiting) == (0, False) and queue.waiting == 1  # the place is given up
    behind = queue.wait(next_one)
    assert next(behind) == Queued(1)  # it moved up: only the holder is ahead
    behind.close()  # closing a waiter gives up its place too
    assert queue.waiting == 0
    queue.leave(holder)
    assert queue.hold() is not None  # free again


def test_retry_after_follows_the_recent_hold_times():
    queue = ModelQueue(max_waiting=1)
    holder, waiter = queue.hold(), queue.join()
    with pytest.raises(Busy) as refused:
        queue.join()
    assert refused.value.retry_after == 2  # nothing measured yet: 1 s per hold, two holds ahead
    queue = ModelQueue(max_waiting=1)
    ticket = queue.hold()
    time.sleep(1.6)
    queue.leave(ticket)
    holder, waiter = queue.hold(), queue.join()
    with pytest.raises(Busy) as refused:
        queue.join()
    assert refused.value.retry_after == 4  # 1.6 s per hold, two holds ahead: 3.2 s, rounded up
    queue.leave(waiter)
    queue.leave(holder)


def test_a_waiter_is_told_what_is_ahead_and_a_background_calibration_says_it_pauses_for_it():
    """Issue 50: behind a first launch's calibration the page said "1 answer ahead" where no answer was."""
    from app.model_queue import BACKGROUND_CALIBRATION, COMPARISON

    queue = ModelQueue(max_waiting=8)
    calibration = queue.hold(what=BACKGROUND_CALIBRATION)
    mine = queue.wait(queue.join())
    told = next(mine)
    assert told == Queued(1) and told.what == (BACKGROUND_CALIBRATION,) and queue.holder == BACKGROUND_CALIBRATION
    assert told.line() == "Calibrating this device: pausing it for your answer…"
    behind = queue.wait(queue.join(COMPARISON))
    assert next(behind).line() == "Waiting for the model: 1 answer ahead (the calibration pauses for them)."
    last = queue.wait(queue.join())
    assert next(last).line() == ("Waiting for the model: 1 answer and 1 comparison ahead (the calibration pauses for "
                                 "them).")
    queue.leave(calibration)
    assert drain(mine) == (0, True)  # the calibration gave the model up: this answer holds it
    assert next(behind).line() == "Waiting for the model: 1 answer ahead." and queue.holder == "answer"
    assert next(last).line() == "Waiting for the model: 1 answer and 1 comparison ahead."
