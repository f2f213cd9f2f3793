"""The emulated clock: wall time minus the time the harness takes for itself.

Every time prism-debug reports is on this clock.  Two kinds of time are
excluded from it: the harness's own bookkeeping on the collective path (value
filling, digests, the replay engine) — which the real job does not pay — and
time the debugger holds the rank paused or the controller snapshots it.  What
remains is the script's own compute plus the waits the emulation imposes.

The harness *holds* the clock while it works (:meth:`EmulatedClock.enter`
... :meth:`EmulatedClock.leave`): every thread of the rank — the timers
completing asynchronous work, the watchdog — reads it stopped where the hold
began, never running ahead by bookkeeping that is about to be taken off it
and then jumping back.  Holds nest: one taken inside another (a debugger
pause inside a collective's bookkeeping) leaves the outer one to release.
"""

from __future__ import annotations

import math
import threading
import time

_perf_counter = time.perf_counter
_get_ident = threading.get_ident


class EmulatedClock:
    __slots__ = ("_state",)

    def __init__(self) -> None:
        # (seconds excluded, wall time the hold began or None, the holding
        # thread), replaced whole so another thread never reads half of a change
        self._state: tuple[float, float | None, int] = (0.0, None, 0)

    def now(self) -> float:
        """Seconds on the emulated clock (an arbitrary but fixed origin)."""
        excluded, held, _ = self._state
        if held is not None:  # stopped where the hold began
            return held - excluded
        return _perf_counter() - excluded

    def enter(self) -> tuple[float | None, float]:
        """The harness starts work of its own: hold the clock.  Returns the
        token for :meth:`leave` (the wall time of the hold; None when the clock
        was held already, by an outer hold that will release it) and the
        emulated time at which the hold began."""
        t0 = _perf_counter()
        excluded, held, _ = self._state
        if held is None:
            self._state = (excluded, t0, _get_ident())
            return t0, t0 - excluded
        return None, held - excluded

    def arrive(self) -> tuple[float | None, float]:
        """:meth:`enter` for the real rank entering an op (ops never nest on
        one thread)."""
        t0 = _perf_counter()
        excluded, held, owner = self._state
        if held is None:
            self._state = (excluded, t0, _get_ident())
            return t0, t0 - excluded
        if owner == _get_ident():
            # this thread's own hold, never released: the op that took it
            # raised before its bookkeeping ended (a user error the script
            # caught); it ends here rather than stopping the clock for good
            excluded += t0 - held
            self._state = (excluded, t0, owner)
            return t0, t0 - excluded
        return None, held - excluded  # another thread's hold: it covers this op

    def leave(self, token: float | None) -> None:
        """Release the hold :meth:`enter` took (its ``token``): the time held
        is off the clock, which runs on from where it stopped."""
        if token is not None:
            excluded, held, _ = self._state
            if held == token:
                self._state = (excluded + _perf_counter() - token, None, 0)

    # the debugger's pause and resume (the rank's main thread, in that order)
    def pause(self) -> float | None:
        """Stop the clock (the debugger paused the rank); the token for
        :meth:`resume` (None inside a hold of the harness, which covers the pause)."""
        return self.enter()[0]

    def resume(self, token: float | None) -> None:
        self.leave(token)

    def exclude_since(self, wall_start: float) -> None:
        """Remove the wall time since ``wall_start`` (a ``perf_counter()``
        reading) from the clock — for harness work that did not hold it.  Inside
        a hold it changes nothing: the hold excludes that time already."""
        excluded, held, _ = self._state
        if held is None:
            self._state = (excluded + _perf_counter() - wall_start, None, 0)

    @property
    def held(self) -> bool:
        return self._state[1] is not None

    @property
    def excluded_s(self) -> float:
        excluded, held, _ = self._state
        if held is None:
            return excluded
        return excluded + _perf_counter() - held

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
        while (now := self.now()) < deadline:
            if self._state[1] is not None:  # held by another thread: don't spin meanwhile
                time.sleep(_SPIN_S)
        return now - start


_SPIN_S = 200e-6
