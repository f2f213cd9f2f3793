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

With several real ranks two more things act on it.  :meth:`EmulatedClock.rebase`
sets a common origin (every rank rebases when the same barrier returns), and
a thread waiting to learn another real rank's arrival *caps* the clock where
its wait began (:meth:`EmulatedClock.cap`): no thread reads past the cap until
the completion C is known, and :meth:`EmulatedClock.uncap` then sets the clock
to ``min(raw, max(C, w))`` — exact whatever the latency of that information,
the excess of the raw clock being excluded.  Holds and caps are kept in two
separate values, each written by its own side only (caps under a lock), so
neither ever overwrites a change of the other; a single rank that never caps
or rebases reads exactly what it read before them (offset 0.0, limit inf).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable

_perf_counter = time.perf_counter
_get_ident = threading.get_ident


class EmulatedClock:
    __slots__ = ("_state", "_shift", "_raw", "_caps", "_origin", "_cap_lock", "_tokens")

    def __init__(self, raw: Callable[[], float] = _perf_counter) -> None:
        # (seconds excluded, wall time the hold began or None, the holding
        # thread), replaced whole so another thread never reads half of a change
        self._state: tuple[float, float | None, int] = (0.0, None, 0)
        # (origin plus the seconds caps excluded, the lowest cap in force or
        # inf), None until the first rebase or cap (a single rank's clock then
        # reads exactly as before either existed): written by rebase/cap/uncap
        # only, under _cap_lock
        self._shift: tuple[float, float] | None = None
        self._raw = raw  # the wall clock (injectable: tests drive a fake one)
        self._caps: dict[int, float] = {}  # token -> the cap's limit (its floor at uncap)
        self._origin = 0.0  # the raw offset rebase() took, not excluded time
        self._cap_lock = threading.Lock()
        self._tokens = itertools.count(1)

    def now(self) -> float:
        """Seconds on the emulated clock (an arbitrary but fixed origin, or
        the last :meth:`rebase`'s)."""
        excluded, held, _ = self._state
        shift = self._shift
        if shift is None:  # never rebased nor capped: the hot path
            if held is not None:  # stopped where the hold began
                return held - excluded
            return self._raw() - excluded
        offset, limit = shift
        reading = (self._raw() if held is None else held) - excluded - offset
        return reading if reading < limit else limit

    def enter(self) -> tuple[float | None, float]:
        """The harness starts work of its own: hold the clock.  Returns the
        token for :meth:`leave` (the wall time of the hold; None when the clock
        was held already, by an outer hold that will release it) and the
        emulated time at which the hold began."""
        t0 = self._raw()
        excluded, held, _ = self._state
        if held is None:
            self._state = (excluded, t0, _get_ident())
            return t0, self._reading(t0 - excluded)
        return None, self._reading(held - excluded)

    def arrive(self) -> tuple[float | None, float]:
        """:meth:`enter` for the real rank entering an op (ops never nest on
        one thread)."""
        t0 = self._raw()
        excluded, held, owner = self._state
        if held is None:
            self._state = (excluded, t0, _get_ident())
            if self._shift is None:  # (the commonest path, inlined)
                return t0, t0 - excluded
            return t0, self._reading(t0 - excluded)
        if owner == _get_ident():
            # this thread's own hold, never released: the op that took it
            # raised before its bookkeeping ended (a user error the script
            # caught); it ends here rather than stopping the clock for good
            excluded += t0 - held
            self._state = (excluded, t0, owner)
            return t0, self._reading(t0 - excluded)
        return None, self._reading(held - excluded)  # another thread's hold: it covers this op

    def _reading(self, unshifted: float) -> float:
        shift = self._shift
        if shift is None:
            return unshifted
        offset, limit = shift
        reading = unshifted - offset
        return reading if reading < limit else limit

    def leave(self, token: float | None) -> None:
        """Release the hold :meth:`enter` took (its ``token``): the time held
        is off the clock, which runs on from where it stopped."""
        if token is not None:
            excluded, held, _ = self._state
            if held == token:
                self._state = (excluded + self._raw() - token, None, 0)

    # the debugger's pause and resume (the rank's main thread, in that order)
    def pause(self) -> float | None:
        """Stop the clock (the debugger paused the rank); the token for
        :meth:`resume` (None inside a hold of the harness, which covers the pause)."""
        return self.enter()[0]

    def resume(self, token: float | None) -> None:
        self.leave(token)

    def exclude_since(self, wall_start: float) -> None:
        """Remove the wall time since ``wall_start`` (a reading of the raw
        clock, ``perf_counter()`` unless another was injected) from the clock
        — for harness work that did not hold it.  Inside a hold it changes
        nothing: the hold excludes that time already."""
        excluded, held, _ = self._state
        if held is None:
            self._state = (excluded + self._raw() - wall_start, None, 0)

    # -- several real ranks: a common origin, caps while waiting for a peer ------

    def _uncapped(self) -> float:
        """What :meth:`now` would read without caps (called under _cap_lock)."""
        excluded, held, _ = self._state
        shift = self._shift
        offset = 0.0 if shift is None else shift[0]
        return (self._raw() if held is None else held) - excluded - offset

    def rebase(self) -> None:
        """Make the clock read 0.0 now and run on from there: every real rank
        rebases when the same barrier returns, a common origin across
        processes and hosts.  Caps in force move with the origin."""
        with self._cap_lock:
            reading = self._uncapped()
            self._origin += reading
            self._caps = {token: limit - reading for token, limit in self._caps.items()}
            offset, limit = self._shift or (0.0, math.inf)
            self._shift = (offset + reading, limit - reading)

    def cap(self, limit: float | None = None) -> int:
        """No thread reads the clock past ``limit`` (default: its reading now)
        until :meth:`uncap`; the token for it.  Caps nest, across threads too:
        the lowest in force wins.  A limit below the reading now is raised to
        it: the clock never runs backwards for any thread."""
        with self._cap_lock:
            reading = self.now()
            if limit is None or limit < reading:
                limit = reading
            token = next(self._tokens)
            self._caps[token] = limit
            offset, lowest = self._shift or (0.0, math.inf)
            self._shift = (offset, min(lowest, limit))
            return token

    def uncap(self, token: int, done: float) -> float:
        """Lift the cap ``token``: the clock reads ``min(raw, max(done, w))``
        (raw the reading without caps, w the cap's limit — what other threads
        may have read under it) and runs on from there; the raw clock's excess
        over that is excluded, as :meth:`exclude_since` excludes.  Other caps
        in force still limit the reading.  Returns the reading set."""
        with self._cap_lock:
            floor = self._caps.pop(token)
            excluded, held, _ = self._state
            unshifted = (self._raw() if held is None else held) - excluded
            shift = self._shift
            assert shift is not None, "cap() set it"
            offset = shift[0]
            raw = unshifted - offset
            target = min(raw, max(done, floor))
            if raw > target:  # the offset that reads target now, not an increment
                offset = unshifted - target  # of it: no rounding piles up
            self._shift = (offset, min(self._caps.values(), default=math.inf))
            return target

    @property
    def held(self) -> bool:
        return self._state[1] is not None

    @property
    def capped(self) -> bool:
        shift = self._shift
        return shift is not None and shift[1] != math.inf

    @property
    def excluded_s(self) -> float:
        """Seconds taken off the clock: holds, exclusions and caps' excess
        (not a rebase's origin)."""
        excluded, held, _ = self._state
        shift = self._shift
        if shift is not None:
            excluded += shift[0] - self._origin
        if held is None:
            return excluded
        return excluded + self._raw() - held

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
            # held by another thread, or capped short of the deadline by a
            # thread waiting for a peer: don't spin meanwhile
            shift = self._shift
            if self._state[1] is not None or (shift is not None and shift[1] < deadline):
                time.sleep(_SPIN_S)
        return now - start


_SPIN_S = 200e-6
