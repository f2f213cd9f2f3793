"""The debugger inside the real rank: breakpoints, pausing and stepping.

The bdb under the console's pdb: it knows nothing of sockets or terminals.
The rank's main thread reports where it is — an iteration starting, a
collective about to be issued — and blocks here while paused; the agent's bus
thread sets breakpoints and resumes it.  Pure Python (no torch), so the
stepping rules are tested on their own.

While the rank is paused its emulated clock stands still
(:meth:`EmulatedClock.pause`), so stepping does not distort the timing the
rank or its virtual peers see.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable

from prism_debug.errors import DebuggerError


@dataclasses.dataclass
class Breakpoint:
    id: int
    kind: str  # "iter" or "coll"
    iteration: int | None = None
    op: str | None = None
    family: str | None = None
    seq: int | None = None  # the collective's number within its iteration, from 1
    temporary: bool = False
    hits: int = 0

    @property
    def description(self) -> str:
        if self.kind == "iter":
            return f"iteration {self.iteration}"
        where = f"{self.op}" + (f" on {self.family}" if self.family else "")
        return where + (f" seq {self.seq}" if self.seq is not None else "")

    def matches_collective(self, op: str, family: str, seq: int) -> bool:
        return (self.kind == "coll" and self.op is not None and _op_matches(self.op, op)
                and (self.family is None or self.family == family)
                and (self.seq is None or self.seq == seq))


def _op_matches(wanted: str, op: str) -> bool:
    # torch's names and the short ones people type: all_reduce = allreduce
    return wanted.replace("_", "") == op.replace("_", "")


class Debugger:
    """Shared between the rank's main thread (``at_*``, which may block) and
    the bus thread (the commands).

    ``publish(kind, data)`` sends an event to the controller; it must not
    block.  ``on_watch(bool)`` is told whether collectives need reporting
    here at all, so an unwatched rank pays nothing per collective.
    """

    def __init__(self, clock, publish: Callable[[str, dict], None],
                 on_watch: Callable[[bool], None]) -> None:
        self._clock = clock
        self._publish = publish
        self._on_watch = on_watch
        self._cond = threading.Condition()
        self._breakpoints: dict[int, Breakpoint] = {}
        self._next_id = 1
        self._mode: str | None = None  # "step", "next" or "pause": stop at the next chance
        self._pause_reason = "pause"
        self.paused_at: dict | None = None
        self.num_pauses = 0  # numbers the pauses, so a client tells a new one from an old
        self._resume = False
        # work the main thread must do while paused (a snapshot at this boundary)
        self._tasks: deque[Callable[[], None]] = deque()
        self.events_on = False
        self.iteration = 1  # the iteration in progress
        self.detached = False  # the controller went away: never pause again
        # run_to's stop: (iteration, collective seq or None for its start, reason);
        # breakpoints on the way to it are passed (a replay after going back)
        self._target: tuple[int, int | None, str] | None = None

    # -- commands (bus thread) -------------------------------------------------

    def add_break(self, kind: str, *, iteration: int | None = None, op: str | None = None,
                  family: str | None = None, seq: int | None = None,
                  temporary: bool = False) -> Breakpoint:
        with self._cond:
            bp = Breakpoint(self._next_id, kind, iteration, op, family, seq, temporary)
            self._breakpoints[bp.id] = bp
            self._next_id += 1
            self._update_watch()
            return bp

    def breakpoints(self) -> list[Breakpoint]:
        with self._cond:
            return list(self._breakpoints.values())

    def set_breakpoints(self, table: list[dict]) -> None:
        """Make the breakpoints ``table``'s (``Breakpoint`` fields, ids and hits
        kept): a copy restored to step back gets the ones the rank had, not
        the ones of its snapshot's time."""
        with self._cond:
            fields = {f.name for f in dataclasses.fields(Breakpoint)}
            breakpoints = [Breakpoint(**{k: v for k, v in row.items() if k in fields})
                           for row in table]
            if not all(type(bp.id) is int and bp.id > 0 and bp.kind in ("iter", "coll")
                       for bp in breakpoints):
                raise ValueError("a breakpoint needs an id >= 1 and a kind, iter or coll")
            self._breakpoints = {bp.id: bp for bp in breakpoints}
            self._next_id = max([self._next_id - 1, *self._breakpoints]) + 1
            self._update_watch()

    def delete(self, bp_id: int | None = None) -> list[int]:
        with self._cond:
            if bp_id is None:
                deleted = list(self._breakpoints)
                self._breakpoints.clear()
            elif bp_id in self._breakpoints:
                del self._breakpoints[bp_id]
                deleted = [bp_id]
            else:
                raise DebuggerError(f"no breakpoint {bp_id} (info breaks lists them)")
            self._update_watch()
            return deleted

    def resume(self, mode: str | None) -> int:
        """continue (``None``), step (to the next collective) or next (to the
        next iteration).  On a running rank, step and next stop it at the next
        collective or iteration; continue changes nothing.  Returns the number
        of the last pause: the stop this causes comes later."""
        with self._cond:
            after = self.num_pauses
            self._mode = mode
            self._target = None  # somebody took over from a replay
            self._resume = True
            self._update_watch()
            self._cond.notify_all()
            return after

    def run_to(self, iteration: int, seq: int | None, reason: str) -> int:
        """Run to where ``iteration`` starts (or to its collective number
        ``seq``) and pause there for ``reason``, passing every breakpoint on
        the way: the replay forward of a copy restored to step back, which
        must stop where it was asked and nowhere else.  Paused there already
        (a copy restored just before it): that is the stop, announced anew.
        Returns the number of the last pause before the stop."""
        with self._cond:
            here = self.paused_at
            if here is not None:
                at = (here["iteration"], here["seq"] if here["at"] == "collective" else 0)
                if at == (iteration, seq or 0):
                    self.num_pauses += 1
                    self.paused_at = {**here, "reason": reason, "number": self.num_pauses}
                    self._publish("paused", self.paused_at)
                    return self.num_pauses - 1
                if at > (iteration, seq or 0):
                    raise DebuggerError(f"the rank is past iteration {iteration} already")
            elif self.iteration > iteration:
                raise DebuggerError(f"the rank is past iteration {iteration} already")
            after = self.num_pauses
            self._target = (iteration, seq, reason)
            self._mode = None
            self._resume = True
            self._update_watch()
            self._cond.notify_all()
            return after

    def pause(self, reason: str = "pause") -> int:
        """Pause at the next chance; the number of the last pause before it
        (the pause in progress counts as the answer when already paused)."""
        with self._cond:
            if self.paused_at is not None:
                return self.num_pauses - 1
            self._mode = "pause"
            self._pause_reason = reason
            self._update_watch()
            return self.num_pauses

    def pause_again(self, reason: str) -> None:
        """Stay paused, or pause at the next chance, telling clients why (a
        restored copy, paused where its snapshot was taken)."""
        with self._cond:
            if self.paused_at is not None:
                self.paused_at = {**self.paused_at, "reason": reason}
                self._publish("paused", self.paused_at)
            else:
                self._mode = "pause"
                self._pause_reason = reason
                self._update_watch()

    def run_paused(self, task: Callable[[], None]) -> None:
        """Have the paused main thread run ``task`` (it owns the process's state)."""
        with self._cond:
            if self.paused_at is None:
                raise DebuggerError("the rank is running")
            self._tasks.append(task)
            self._cond.notify_all()

    def set_events(self, on: bool) -> None:
        with self._cond:
            self.events_on = on
            self._update_watch()

    def release(self) -> tuple[int, bool]:
        """Let the rank run free (``detach``, a lost controller): drop every
        breakpoint and pending step, resume a pause.  How many breakpoints went,
        and whether a pause was resumed."""
        with self._cond:
            deleted = len(self._breakpoints)
            self._breakpoints.clear()
            self._mode = None
            self._target = None
            self.events_on = False
            was_paused = self.paused_at is not None
            if was_paused:
                self._resume = True
            self._update_watch()
            self._cond.notify_all()
            return deleted, was_paused

    def _update_watch(self) -> None:
        target_seq = self._target is not None and self._target[1] is not None
        self._on_watch(self.events_on or self._mode is not None or target_seq or any(
            bp.kind == "coll" for bp in self._breakpoints.values()))

    # -- where the rank is (main thread) ----------------------------------------

    def at_iteration_start(self, iteration: int) -> float:
        """Iteration ``iteration`` begins; pauses here if asked.  Returns the
        wall seconds spent paused."""
        self.iteration = iteration
        with self._cond:
            if self._target is not None and self._mode != "pause":
                return self._at_target(iteration, None)
            self._target = None  # a pause asked during a replay ends it
            reason = None
            if self._mode in ("next", "step", "pause"):
                reason = self._pause_reason if self._mode == "pause" else self._mode
            for bp in list(self._breakpoints.values()):
                if bp.kind == "iter" and bp.iteration == iteration:
                    reason = self._hit(bp)
            if reason is None:
                return 0.0
            return self._pause({"iteration": iteration, "at": "iteration", "op": None,
                                "family": None, "index": None, "seq": None,
                                "reason": reason})

    def at_collective(self, op: str, family: str, index: int, seq: int, nbytes: int) -> float:
        """The rank is about to issue collective number ``seq`` of its
        iteration; pauses here if asked.  Returns the wall seconds paused."""
        with self._cond:
            if self._target is not None and self._mode != "pause":
                return self._at_target(self.iteration, seq, {"op": op, "family": family,
                                                             "index": index})
            self._target = None
            reason = None
            if self._mode in ("step", "pause"):
                reason = self._pause_reason if self._mode == "pause" else self._mode
            for bp in list(self._breakpoints.values()):
                if bp.matches_collective(op, family, seq):
                    reason = self._hit(bp)
            if reason is None:
                return 0.0
            return self._pause({"iteration": self.iteration, "at": "collective", "op": op,
                                "family": family, "index": index, "seq": seq,
                                "reason": reason})

    def _at_target(self, iteration: int, seq: int | None, collective: dict | None = None
                   ) -> float:
        """On a replay to run_to's stop: pause if this is it, else pass on
        (breakpoints included).  Called with the lock held."""
        assert self._target is not None  # (its callers check)
        target_iteration, target_seq, reason = self._target
        if (iteration, seq) != (target_iteration, target_seq):
            return 0.0
        self._target = None
        where = {"iteration": iteration, "at": "iteration", "op": None, "family": None,
                 "index": None, "seq": None, "reason": reason}
        if collective is not None:
            where.update(collective, at="collective", seq=seq)
        return self._pause(where)

    def _hit(self, bp: Breakpoint) -> str:
        bp.hits += 1
        if bp.temporary:
            del self._breakpoints[bp.id]
            self._update_watch()
        return f"break {bp.id}"

    def _pause(self, where: dict) -> float:
        """Block (holding nothing but the condition) until resumed; runs the
        tasks handed to the paused rank meanwhile.  Called with the lock held."""
        if self.detached:
            return 0.0
        started = time.perf_counter()
        hold = self._clock.pause()  # None inside the harness's own hold, which covers it
        self._mode = None
        self._resume = False
        self.num_pauses += 1
        where["number"] = self.num_pauses
        self.paused_at = where
        self._update_watch()
        self._publish("paused", where)
        try:
            while True:
                while self._tasks:  # handed over before a resume: still done first
                    task = self._tasks.popleft()
                    self._cond.release()
                    try:
                        task()
                    finally:
                        self._cond.acquire()
                if self._resume:
                    break
                self._cond.wait()
        finally:
            self.paused_at = None
            self._clock.resume(hold)
        self._publish("resumed", {"iteration": where["iteration"]})
        return time.perf_counter() - started
