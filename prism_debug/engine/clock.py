"""The emulated clock: wall time minus the time the harness takes for itself.

Every time prism-debug reports is on this clock.  Two kinds of time are
excluded from it: the harness's own bookkeeping on the collective path (value
filling, digests) — which the real job does not pay — and, once the debugger
exists, time spent paused.  What remains is the script's own compute plus the
waits the emulation imposes.
"""

from __future__ import annotations

import math
import time


class EmulatedClock:
    __slots__ = ("_excluded",)

    def __init__(self) -> None:
        self._excluded = 0.0

    def now(self) -> float:
        """Seconds on the emulated clock (an arbitrary but fixed origin)."""
        return time.perf_counter() - self._excluded

    def exclude_since(self, wall_start: float) -> None:
        """Remove the wall time since ``wall_start`` (a ``perf_counter()``
        reading) from the emulated clock."""
        self._excluded += time.perf_counter() - wall_start

    @property
    def excluded_s(self) -> float:
        return self._excluded

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
