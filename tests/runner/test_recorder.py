"""The recorder: one thread, records in the order submitted, whatever befalls one."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.capture.recorder import RECORDER_NICENESS, Recorder


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["ok", "fails", "slow"]), max_size=12))
def test_records_run_one_at_a_time_in_order_and_a_failure_stops_none(kinds):
    recorder, ran, running = Recorder(), [], []

    def record(number: int, kind: str):
        running.append(number)
        assert len(running) == 1  # never two at once
        if kind == "slow":
            time.sleep(0.002)
        ran.append(number)
        running.remove(number)
        if kind == "fails":
            raise OSError(number, "refused")
        return number

    futures = [recorder.submit(lambda n=n, k=k: record(n, k)) for n, k in enumerate(kinds)]
    assert recorder.wait(10)
    assert ran == list(range(len(kinds)))
    for number, (kind, future) in enumerate(zip(kinds, futures, strict=True)):
        if kind == "fails":
            assert future.exception().errno == number
        else:
            assert future.result() == number
    assert not recorder.busy


def test_wait_is_for_the_records_submitted_so_far_and_make_room_bounds_the_queue():
    recorder, gate = Recorder(), threading.Event()
    first = recorder.submit(gate.wait)
    assert recorder.wait(0.05) is False and recorder.busy
    room = threading.Thread(target=recorder.make_room, args=(1,))
    room.start()
    room.join(0.05)
    assert room.is_alive()  # one record under way: no room for another below 1
    gate.set()
    room.join(5)
    assert not room.is_alive() and first.result() is True
    assert recorder.wait(5) and not recorder.busy
    # a second round starts a thread again, below the dumps in the CPU's favour
    niceness = recorder.submit(lambda: os.getpriority(os.PRIO_PROCESS,
                                                      threading.get_native_id()))
    assert niceness.result(timeout=5) >= RECORDER_NICENESS


def test_a_record_that_raises_still_counts_as_finished():
    recorder = Recorder()
    failed = recorder.submit(lambda: 1 / 0)
    assert recorder.wait(5)
    with pytest.raises(ZeroDivisionError):
        failed.result()
