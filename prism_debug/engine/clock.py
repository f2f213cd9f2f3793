"""The emulated clock: wall time minus the time the harness takes for itself.

Every time prism-debug reports is on this clock.  Two kinds of time are
excluded from it: the harness's own bookkeeping on the collective path (value
filling, digests) — which the real job does not pay — and time the debugger
holds the rank paused (the clock stands still meanwhile, for every thread).  What remains is the script's own compute plus the
waits the emulation imposes.
"""

from __future__ import annotations

import math
import time


class EmulatedClock:
    __slots__ = ("_state",)

    def __init__(self) -> None:
        # (seconds excluded, wall time the debugger paused the rank or None),
        # replaced whole so another thread never reads half of a change
        self._state: tuple[float, float | None] = (0.0, None)

    def now(self) -> float:
        """Seconds on the emulated clock (an arbitrary but fixed origin)."""
        excluded, paused_at = self._state
        if paused_at is not None:  # stopped where the pause began
            return paused_at - excluded
        return time.perf_counter() - excluded

    def pause(self) -> None:
        """Stop the clock (the debugger paused the rank): every thread of the
        rank, the timers completing asynchronous work among them, sees
        emulated time stand still until :meth:`resume`."""
        excluded, _ = self._state
        self._state = (excluded, time.perf_counter())

    def resume(self) -> None:
        excluded, paused_at = self._state
        if paused_at is not None:
            self._state = (excluded + time.perf_counter() - paused_at, None)

    def exclude_since(self, wall_start: float) -> None:
        """Remove the wall time since ``wall_start`` (a ``perf_counter()``
        reading) from the emulated clock."""
        excluded, paused_at = self._state
        self._state = (excluded + time.perf_counter() - wall_start, paused_at)

    @property
    def excluded_s(self) -> float:
        excluded, paused_at = self._state
        if paused_at is None:
            return excluded
        return excluded + time.perf_counter() - paused_at

    def wait_until(self, deadline: float) -> float:
        """Block until the emulated clock reads ``deadline``; return the time
        waited.  Sleeps most of the way, then spins the last stretch: a plain
        ``time.sleep`` overshoots by ~60 µs, as long as an intra-node
        all-reduce of a small tensor."""
        start = self.now()
        remaining = deadline - start
        if remaining <= 0:
            return 0.0
        while remaining == math.inf:
            # An op that can never complete (a failed peer): the job hangs, as
            # the real one would; the process stays alive to be inspected.
            time.sleep(3600)
        if remaining > _SPIN_S:
            time.sleep(remaining - _SPIN_S)
        while self.now() < deadline:
            pass
        return self.now() - start


_SPIN_S = 200e-6
