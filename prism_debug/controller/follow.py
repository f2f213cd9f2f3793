"""The controller's one loop: follow the run's real ranks — one or several,
started or restored — to their ends, relaying their output, serving the
session between two looks, and doing a console's restore there.

Like torchrun, the loop waits for every rank and, once one fails, stops the
others: a real job whose rank dies does not run on.  The run's exit code is
the first failure's (a run of one rank: that rank's).  The ranks run in
sessions of their own, so signals aimed at the controller do not reach
them by themselves: Ctrl-C, SIGTERM and SIGHUP are passed on to every rank
(a second Ctrl-C kills).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Protocol, TypeVar

from prism_debug.controller.no_session import RankSnapshots
from prism_debug.graph.selectors import ranks_text
from prism_debug.process.children import POLL_S, Follower, RankProcess

Message = Callable[[str], None]
# a console's restore, checked (controller/replace.py's RestoreDue): the loop only hands it on
Due = TypeVar("Due")


def labelled(rank: int, message: Message) -> Message:
    """``message`` with each line said to be ``rank``'s (several ranks' lines interleave)."""
    return lambda line: message(f"[rank {rank}] {line}")


class FollowedRank:
    """One real rank as the loop follows it: its files, its process (a
    console's restore replaces it), its relay, and its snapshots."""

    def __init__(self, rank: int, files: dict[str, Path], child: RankProcess,
                 follower: Follower, snapshots: RankSnapshots | None = None,
                 restored_from: str | None = None) -> None:
        self.rank = rank
        self.files = files
        self.child = child
        self.follower = follower
        self.snapshots = snapshots
        self.restored_from = restored_from  # the snapshot a restored copy came from
        self.exit_code: int | None = None

    @property
    def taken(self) -> list[str]:
        """The snapshots the rank took, in order, once recorded (a restored
        cut's copy is asked for none)."""
        return self.snapshots.taken if self.snapshots is not None else []


class LoopSession(Protocol[Due]):
    """What the loop serves besides the ranks: the debugger bus (or nothing)."""

    def poll(self, timeout_s: float) -> None:
        """Serve the bus for up to ``timeout_s`` (the loop's sleep)."""

    def exited(self, rank: int, exit_code: int) -> None:
        """``rank`` is gone."""

    @property
    def restoring(self) -> bool:
        """A console's restore is being checked: the ranks it will replace may
        end meanwhile without ending the run."""

    def take_restore(self) -> Due | None:
        """A console's restore whose checks passed, for the loop to do."""

    def restore_refused(self, due: Due, why: str) -> None:
        """A restore the loop will not do (the run is being stopped): say why."""


D = TypeVar("D")


def follow(ranks: dict[int, FollowedRank], session: LoopSession[D], message: Message,
           replace: Callable[[D], bool]) -> int:
    """Wait for every rank, relaying their output and serving ``session``;
    the first failure's exit code (0 when none failed).  Once a rank fails,
    the others are stopped.  A console's restore (checked by the session) is
    done here, by ``replace``, between two looks at the ranks; once its
    copies run, a failure before it is the old ranks' and no longer the
    run's.  Whatever happens, no rank outlives this."""
    stopping = False  # (bound before the handler that sets it)

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True  # the ranks end as they were told: no failure of theirs
        for each in _running(ranks):
            each.child.signal(signum)

    failure: int | None = None
    interrupted = 0
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        while _running(ranks) or session.restoring:
            try:
                failure = _look(ranks, session, message, failure, stopping)
                session.poll(POLL_S)  # the bus, for the loop's sleep
                if (due := session.take_restore()) is None:
                    continue
                if stopping:
                    session.restore_refused(due, "the run is being stopped: nothing was "
                                                 "restored")
                elif replace(due):
                    failure = None
            except KeyboardInterrupt:
                interrupted += 1
                stopping = True
                for each in _running(ranks):
                    each.child.signal(signal.SIGINT if interrupted == 1 else signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for each in ranks.values():
            if each.child.poll() is None:
                each.child.kill()
    return failure or 0


def _running(ranks: dict[int, FollowedRank]) -> list[FollowedRank]:
    return [each for each in ranks.values() if each.exit_code is None]


def _look(ranks: dict[int, FollowedRank], session: LoopSession, message: Message,
          failure: int | None, stopping: bool) -> int | None:
    """One look at every running rank: its output relayed, its end noted; the
    run's first failure (the others are stopped once a rank fails, unless
    the run is being stopped already)."""
    for each in _running(ranks):
        code = each.child.poll()
        each.follower.poll()
        if code is None or session.restoring:
            continue  # (a rank that ends while a restore is checked is replaced)
        each.exit_code = code if code >= 0 else 128 - code
        session.exited(each.rank, each.exit_code)
        if each.exit_code == 0 or failure is not None:
            continue
        failure = each.exit_code
        others = [r.rank for r in _running(ranks)]
        if others and not stopping:
            which = "rank" if len(others) == 1 else "ranks"
            message(f"prism-debug: rank {each.rank} exited with code {each.exit_code}: "
                    f"stopping {which} {ranks_text(others)}, as torchrun stops a job's other "
                    "workers")
            for other in _running(ranks):
                other.child.signal(signal.SIGTERM)
    return failure
