"""The emulated clock: held while the harness works, for every thread."""

import math
import threading
import time
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    assert all(b >= a for a, b in pairwise(readings))
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


# -- several real ranks: rebase, caps ------------------------------------------------

class FakeWall:
    """The raw clock, moved by hand: readings are exact."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def capped_clock_at_one() -> tuple[EmulatedClock, FakeWall, int]:
    """A clock capped where it read 1.0, its raw clock since run on to 1.3."""
    wall = FakeWall(1.0)
    clock = EmulatedClock(raw=wall)
    token = clock.cap()
    wall.t = 1.3
    assert clock.now() == 1.0 and clock.capped
    return clock, wall, token


def test_uncap_at_a_completion_inside_the_wait_sets_the_clock_to_it():
    clock, wall, token = capped_clock_at_one()
    assert clock.uncap(token, 1.2) == 1.2
    assert clock.now() == 1.2 and not clock.capped
    assert clock.excluded_s == pytest.approx(0.1, abs=1e-15)  # raw 1.3 - 1.2
    wall.t = 1.5
    assert clock.now() == pytest.approx(1.4, abs=1e-15)  # and runs on at wall rate


def test_uncap_at_a_completion_before_the_cap_keeps_the_cap():
    clock, wall, token = capped_clock_at_one()
    assert clock.uncap(token, 0.8) == 1.0  # never back below what others read
    assert clock.now() == 1.0
    assert clock.excluded_s == pytest.approx(0.3, abs=1e-15)


def test_uncap_at_a_completion_past_the_raw_clock_lets_it_run_on():
    clock, wall, token = capped_clock_at_one()
    assert clock.uncap(token, 1.5) == 1.3  # nothing to exclude: it has not got there yet
    assert clock.now() == 1.3 and clock.excluded_s == 0.0
    wall.t = 1.5
    assert clock.now() == 1.5


def test_uncap_then_wait_until_the_completion_waits_the_rest_on_the_wall():
    clock = EmulatedClock()
    start = clock.now()
    token = clock.cap()
    time.sleep(0.02)  # the information wait: off the clock past the completion
    clock.uncap(token, start + 0.2)
    waited = clock.wait_until(start + 0.2)
    assert clock.now() >= start + 0.2
    assert 0.1 <= waited <= 0.2
    assert clock.excluded_s < 0.005


def test_other_threads_read_at_most_the_cap_while_it_is_in_force():
    clock = EmulatedClock()
    token = clock.cap()
    limit = clock.now()
    readings: list[float] = []

    def read() -> None:
        for _ in range(200):
            readings.append(clock.now())
            readings.append(clock.arrive()[1])  # an op's arrival is capped too
            time.sleep(0.0001)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join()
    assert readings and max(readings) == limit
    clock.uncap(token, limit + 1e-3)
    assert clock.now() >= limit


def test_a_waiting_thread_sleeps_while_capped_short_of_its_deadline():
    clock = EmulatedClock()
    token = clock.cap()
    limit = clock.now()
    woke: list[float] = []
    waiter = threading.Thread(target=lambda: woke.append(clock.wait_until(limit + 0.01)))
    waiter.start()
    time.sleep(0.05)
    assert not woke  # capped at limit: it cannot get to limit + 10 ms
    clock.uncap(token, limit + 0.01)  # raw is 50 ms on: the clock reads limit + 10 ms
    waiter.join(timeout=5)
    assert woke and clock.now() >= limit + 0.01


def test_caps_nest_and_the_lowest_wins():
    wall = FakeWall(1.0)
    clock = EmulatedClock(raw=wall)
    outer = clock.cap()  # at 1.0
    wall.t = 1.1
    inner = clock.cap(0.95)  # raised to the reading, 1.0: never backwards
    low = clock.cap(2.0)
    wall.t = 1.4
    assert clock.now() == 1.0
    assert clock.uncap(inner, 1.2) == 1.2  # excludes 0.2 of raw
    assert clock.now() == 1.0  # the outer cap still holds every thread
    assert clock.uncap(outer, 0.9) == 1.0  # raw now reads 1.2: 0.2 more excluded
    assert clock.now() == 1.0  # at the highest cap's reach: min(raw 1.0, 2.0)
    wall.t = 1.5
    assert clock.now() == pytest.approx(1.1, abs=1e-15)
    clock.uncap(low, 1.0)
    assert not clock.capped
    assert clock.excluded_s == pytest.approx(0.4, abs=1e-15)


def test_rebase_sets_a_common_origin_and_keeps_exclusions_apart():
    wall = FakeWall(123.0)
    clock = EmulatedClock(raw=wall)
    token, _ = clock.enter()
    wall.t = 124.0
    clock.leave(token)  # 1 s excluded before the rebase
    clock.rebase()
    assert clock.now() == 0.0
    assert clock.excluded_s == 1.0  # the origin is not excluded time
    wall.t = 124.5
    assert clock.now() == 0.5
    assert clock.arrive()[1] == 0.5


def test_rebase_inside_a_hold_and_under_a_cap():
    wall = FakeWall(10.0)
    clock = EmulatedClock(raw=wall)
    capped = clock.cap()
    hold, at = clock.enter()
    assert at == 10.0
    clock.rebase()
    assert clock.now() == 0.0
    wall.t = 11.0
    clock.leave(hold)  # the hold's second is excluded; the cap moved with the origin
    assert clock.now() == 0.0
    assert clock.uncap(capped, 0.25) == 0.0  # raw reads 0.0 too: nothing more excluded
    wall.t = 11.5
    assert clock.now() == 0.5 and clock.excluded_s == 1.0


def test_a_clock_never_capped_or_rebased_reads_as_before():
    wall = FakeWall(5.0)
    clock = EmulatedClock(raw=wall)
    hold, at = clock.enter()
    wall.t = 5.25
    clock.leave(hold)
    wall.t = 6.0
    clock.exclude_since(5.5)
    assert clock.now() == 6.0 - 0.75 and clock.excluded_s == 0.75


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tick", "cap", "uncap", "hold", "release"]),
                          st.floats(0.0, 2.0), st.floats(-1.0, 3.0)), max_size=40))
def test_caps_and_holds_in_any_order_never_run_the_clock_backwards(steps):
    wall = FakeWall(100.0)
    clock = EmulatedClock(raw=wall)
    clock.rebase()
    caps: list[tuple[int, float]] = []
    hold = None
    last = clock.now()
    for action, amount, value in steps:
        if action == "tick":
            wall.t += amount
        elif action == "cap":
            caps.append((clock.cap(last + value), max(last + value, last)))
        elif action == "uncap" and caps:
            token, limit = caps.pop(int(amount * 7) % len(caps))
            before = clock.now()
            set_to = clock.uncap(token, value)
            assert set_to >= min(before, limit)  # never below what others may have read
        elif action == "hold" and hold is None:
            hold, _ = clock.enter()
        elif action == "release" and hold is not None:
            clock.leave(hold)
            hold = None
        reading = clock.now()
        # (to the raw clock's resolution: a few ulps of its reading, as holds have been)
        assert reading >= last - 4 * math.ulp(wall.t)
        assert all(reading <= limit for _, limit in caps)
        last = reading
    assert clock.excluded_s >= 0.0
