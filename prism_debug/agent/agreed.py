"""Changes every real rank makes at one boundary they agree on (a run of
several real ranks: a console's ``snapshot`` and ``perturb``).

Each real rank replays the whole world itself, so a change to the virtual
peers must reach every replica at the same point of the job, and a
snapshot of one rank is no cut unless every other rank is dumped at the
same boundary.  The controller agrees on that boundary in two steps:

1. *hold*: each rank says which boundary (the end of which iteration) it
   reaches next, and promises not to pass that one before step 2 arrives;
2. *agree*: the controller names the latest of them, K (no rank is past it:
   each is held at or before K), and what to do there.

At the end of iteration K each rank does it.  A perturbation is put in force
in three steps (``SeveralRanks.agree``): drain (every other rank's events up
to the end of K are in this replica), apply, barrier (nobody issues an op of
iteration K + 1 before every replica has applied it): every replica then
changes the same state.  A snapshot is the rank's part of a cut, as
``--snapshot-at`` takes them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

from prism_debug.errors import InvalidState

log = logging.getLogger(__name__)

# a hold the controller never follows with its decision is let go after this
# long (the controller went away between the two steps)
HOLD_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Change:
    """What every real rank does at an agreed boundary: ``kind`` is
    "snapshot" (its part of a cut) or "faults" (``apply``, run on the main
    thread between the drain and the barrier)."""

    kind: str
    apply: Callable[[], object] | None = None


class AgreedBoundaries:
    """This rank's side of the agreement (the bus thread holds and agrees,
    the main thread reaches the boundaries)."""

    def __init__(self, next_boundary: Callable[[], int]) -> None:
        self._next_boundary = next_boundary  # the iteration in progress (tracker)
        self._cond = threading.Condition()
        self._passed = 0  # the last boundary the main thread has checked
        self._held: int | None = None
        self._due: dict[int, list[Change]] = {}

    def hold(self) -> int:
        """Step 1: the boundary this rank reaches next, which it will not pass
        before :meth:`agree` (or :data:`HOLD_TIMEOUT_S`)."""
        with self._cond:
            # (the tracker counts the iteration ended before the main thread
            # checks here: a boundary already checked is never named)
            boundary = max(self._next_boundary(), self._passed + 1)
            self._held = boundary
            return boundary

    def agree(self, iteration: int, change: Change | None) -> None:
        """Step 2: do ``change`` at the end of ``iteration`` (None: nothing,
        the agreement failed elsewhere), and let the held boundary go."""
        with self._cond:
            if iteration <= self._passed:
                # (the controller names the latest boundary held: not reachable
                # unless the hold timed out)
                raise InvalidState(f"the end of iteration {iteration} is passed already: the "
                                 f"rank is at iteration {self._passed + 1}")
            if change is not None:
                self._due.setdefault(iteration, []).append(change)
            self._held = None
            self._cond.notify_all()

    def at_boundary(self, iteration: int) -> list[Change]:
        """The main thread ends ``iteration``: what is due here, once a hold
        on it is decided."""
        with self._cond:
            if self._held == iteration and not self._cond.wait_for(
                    lambda: self._held != iteration, HOLD_TIMEOUT_S):
                log.warning("the controller agreed on no boundary within %.0f s: the rank "
                            "goes on", HOLD_TIMEOUT_S)
                self._held = None
            self._passed = iteration
            return self._due.pop(iteration, [])
