"""The emulated clock: held while the harness works, for every thread."""

import threading
import time

from prism_debug.engine import EmulatedClock


def test_another_thread_never_sees_the_clock_run_ahead_during_a_hold():
    clock = EmulatedClock()
    readings: list[float] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            readings.append(clock.now())

    reader = threading.Thread(target=read)
    wall = time.perf_counter()
    reader.start()
    time.sleep(0.01)
    token, arrival = clock.enter()
    time.sleep(0.05)  # long bookkeeping: off the clock
    clock.leave(token)
    time.sleep(0.01)
    stop.set()
    reader.join()
    wall = time.perf_counter() - wall
    # monotonic as every thread reads it, and the hold's 50 ms are not on it
    assert all(b >= a for a, b in zip(readings, readings[1:]))
    assert readings[-1] - readings[0] < wall - 0.05
    assert max(r for r in readings if r <= arrival) == arrival  # frozen at the arrival
    assert clock.excluded_s >= 0.05


def test_holds_nest_and_the_outer_one_releases():
    clock = EmulatedClock()
    outer, at = clock.enter()
    inner = clock.pause()  # the debugger pausing inside the harness's bookkeeping
    assert inner is None
    time.sleep(0.02)
    clock.resume(inner)
    assert clock.held and clock.now() == at
    clock.exclude_since(time.perf_counter() - 1.0)  # inside a hold: covered already
    clock.leave(outer)
    assert not clock.held
    assert 0.02 <= clock.excluded_s < 0.5
    assert clock.now() - at < 0.005


def test_an_op_that_raised_inside_its_hold_releases_it_at_the_next_op():
    clock = EmulatedClock()
    clock.arrive()  # the op raises: its leave never comes
    time.sleep(0.01)
    token, arrival = clock.arrive()
    assert token is not None
    clock.leave(token)
    assert not clock.held
    assert clock.excluded_s >= 0.01


def test_an_op_on_another_thread_inside_a_hold_is_covered_by_it():
    clock = EmulatedClock()
    token, at = clock.enter()
    result = []
    thread = threading.Thread(target=lambda: result.append(clock.arrive()))
    thread.start()
    thread.join()
    assert result == [(None, at)]
    clock.leave(token)
    assert not clock.held
