"""The ``run --history K`` ring: which snapshots of the rank's timeline a run
keeps, where ``back`` and ``reverse-continue`` go, and which snapshots the
ring gives up as it moves on.

Pure bookkeeping (no CRIU, no bus, no files): the controller's session
(``controller/session.py``) takes the dumps, restores and removes the snapshots
this decides.  The rank stops for a snapshot at every iteration boundary; a
snapshot taken after iteration ``s`` restores a copy paused where iteration
``s + 1`` starts, and a run of the same rank from there is the same run, bit
for bit (the rank is seeded and its peers replayed), so going back is:
restore the nearest earlier snapshot, then run forward to the stop.

* The **timeline** is the snapshots of the rank as it is now, oldest first:
  the ring's own (``history``) and the user's (``--snapshot-at``, the
  console's ``snapshot``).  Going back cuts it where the copy was restored:
  the future beyond is the old run's (the user may change it — a
  perturbation, another restore) and its ring snapshots are removed; the
  replay takes them again.
* The **ring** is the snapshots of the last K iterations of the timeline.
  Ring snapshots older than that are removed, unless a kept snapshot is an
  increment on them (``--incremental``: a parent cannot go while a child
  needs it); a chain is cut — the next ring snapshot dumped whole — once it
  is K long, so the disk holds fewer than 2K ring snapshots even then.  The
  user's snapshots are never removed, and stay restore points.
* **Breakpoint hits** (where a pause said ``break N``) are kept so that
  ``reverse-continue`` finds the last one before the rank's position.
"""

from __future__ import annotations

import dataclasses

from prism_debug.errors import InvalidState


@dataclasses.dataclass(frozen=True, order=True)
class Position:
    """Where a paused rank is: the iteration in progress, and 0 where it
    starts or the number (from 1) of the collective it waits before."""

    iteration: int
    seq: int = 0

    @classmethod
    def of(cls, where: dict) -> Position:
        """Of a pause as the debugger describes it (``paused_at``)."""
        seq = where.get("seq") if where.get("at") == "collective" else 0
        return cls(where["iteration"], seq or 0)

    def __str__(self) -> str:
        if self.seq == 0:
            return f"iteration {self.iteration}"
        return f"collective {self.seq} of iteration {self.iteration}"


@dataclasses.dataclass(frozen=True)
class Kept:
    """A snapshot of the timeline."""

    id: str
    iteration: int  # iterations finished when it was taken
    parent: str | None  # the snapshot it is an increment on
    history: bool  # the ring's own (removed as it moves on), else the user's


@dataclasses.dataclass(frozen=True)
class Hit:
    position: Position
    reason: str  # "break 2"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Restore ``snapshot``, then run to ``target`` and pause there for ``reason``."""

    snapshot: Kept
    target: Position
    reason: str

    @property
    def replayed(self) -> int:
        """Iterations run again between the restore and the stop."""
        return self.target.iteration - self.snapshot.iteration - 1


class History:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a history keeps at least 1 iteration, got {size}")
        self.size = size
        self.timeline: list[Kept] = []
        self.hits: list[Hit] = []

    # -- what happened ----------------------------------------------------------

    def taken(self, kept: Kept) -> list[str]:
        """A snapshot was taken; the ring snapshots to remove now."""
        self.timeline.append(kept)
        return self._prune()

    def hit(self, where: dict) -> None:
        """The rank paused; a breakpoint's pause is remembered."""
        reason = str(where.get("reason") or "")
        if not reason.startswith("break "):
            return
        hit = Hit(Position.of(where), reason)
        if all(known.position != hit.position for known in self.hits):
            self.hits.append(hit)
            self.hits.sort(key=lambda known: known.position)

    def restored(self, kept: Kept, ancestors: set[str], target: Position | None = None
                 ) -> list[str]:
        """The rank was replaced by a copy of ``kept`` (whose parent chain is
        ``ancestors``), to stop at ``target`` (default: where it was restored);
        the ring snapshots to remove now: those of the abandoned future, or of
        a whole other timeline when ``kept`` is not of this one."""
        stop = target or Position(kept.iteration + 1)
        before = self.timeline
        if any(entry.id == kept.id for entry in before):
            self.timeline = [entry for entry in before if entry.iteration <= kept.iteration]
            self.hits = [hit for hit in self.hits if hit.position <= stop]
        else:
            self.timeline = [kept]
            self.hits = []
        keep = {entry.id for entry in self.timeline} | ancestors
        dropped = [entry.id for entry in before if entry.history and entry.id not in keep]
        return dropped + self._prune()

    # -- what comes next ----------------------------------------------------------

    def parent(self) -> str | None:
        """What the next ring snapshot is an increment on (``--incremental``):
        the newest of the timeline, unless its chain is K long already (then
        it is dumped whole, so the chain behind it can go)."""
        if not self.timeline:
            return None
        by_id = {entry.id: entry for entry in self.timeline}
        newest = self.timeline[-1]
        depth, current = 1, newest
        while current.parent is not None and current.parent in by_id:
            depth += 1
            current = by_id[current.parent]
        return None if depth >= self.size else newest.id

    def back(self, here: Position, iterations: int) -> Plan:
        """Where ``back ITERATIONS`` goes from ``here``: the start of the
        iteration that many before the one in progress."""
        if iterations < 1:
            raise InvalidState(f"back takes a number of iterations >= 1, got {iterations}")
        target = Position(here.iteration - iterations)
        what = (f"cannot go back {iterations} iteration{'s' if iterations > 1 else ''} from "
                f"iteration {here.iteration}")
        return Plan(self._before(target, what), target, "back")

    def reverse_continue(self, here: Position) -> Plan:
        """Where ``reverse-continue`` goes from ``here``: the last breakpoint
        hit before it."""
        earlier = [hit for hit in self.hits if hit.position < here]
        if not earlier:
            raise InvalidState(f"no breakpoint was hit before {here} in this run's history")
        hit = earlier[-1]
        return Plan(self._before(hit.position, f"cannot go back to {hit.reason} at "
                                               f"{hit.position}"),
                    hit.position, f"reverse-continue, {hit.reason}")

    def oldest_reachable(self) -> int | None:
        """The earliest iteration whose start a restore reaches, if any."""
        return min(entry.iteration for entry in self.timeline) + 1 if self.timeline else None

    # -- within ----------------------------------------------------------------------

    def _before(self, target: Position, what: str) -> Kept:
        """The newest snapshot from which a run gets to ``target``."""
        found = [entry for entry in self.timeline if entry.iteration < target.iteration]
        if found:
            return max(found, key=lambda entry: entry.iteration)
        oldest = self.oldest_reachable()
        if oldest is None:
            raise InvalidState(f"{what}: the history holds no snapshot yet (the first is taken "
                               "where iteration 1 ends)")
        raise InvalidState(f"{what}: the oldest iteration reachable is {oldest} (--history "
                           f"{self.size} keeps the last {self.size} iterations)")

    def _prune(self) -> list[str]:
        """Ring snapshots older than the last K iterations, unless a kept
        snapshot is an increment on them: taken out of the timeline, their ids."""
        iterations = sorted({entry.iteration for entry in self.timeline})
        if len(iterations) <= self.size:
            return []
        first = iterations[-self.size]
        kept = [entry for entry in self.timeline if entry.iteration >= first or not entry.history]
        by_id = {entry.id: entry for entry in self.timeline}
        needed = {entry.id for entry in kept}
        for entry in kept:
            parent = entry.parent
            while parent is not None and parent in by_id and parent not in needed:
                needed.add(parent)
                parent = by_id[parent].parent
        dropped = [entry.id for entry in self.timeline if entry.id not in needed]
        self.timeline = [entry for entry in self.timeline if entry.id in needed]
        return dropped
