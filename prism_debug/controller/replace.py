"""A console's restore, done by the controller's loop: the run's real ranks
replaced by copies of a snapshot of theirs — one rank's snapshot, or every
rank's part of a cut — and followed on in the same files.

The copies are the controller's children, so this runs on its loop (a copy
dies with the thread that restored it).  A restore never loses the running
ranks to a failure it could have seen coming: copies that can run beside
them (their pids are free: ranks isolated in pid namespaces of their own, or
another process's snapshot) are restored while the ranks are held still,
and the ranks end only once every copy is up; copies that need the ranks'
own pids are restored once the ranks have ended, and a failure then ends
the run.  The session is told which way it went and answers its console.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from prism_debug.capture.snapshots import restore_process
from prism_debug.controller.follow import FollowedRank, labelled
from prism_debug.errors import PrismError, SnapshotFailed
from prism_debug.process.children import RestoredChild
from prism_debug.process.start import BusEnds
from prism_debug.snapshot.criu import Criu
from prism_debug.snapshot.manifest import Manifest
from prism_debug.snapshot.store import Store

if TYPE_CHECKING:
    from prism_debug.bus.server import Pending

Message = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class RestoreDue:
    """A console's restore, checked, for the loop to do: who asked, the
    snapshots to restore (a rank each), the CRIU to use, the pids the copies
    take (none: each the init of a pid namespace of its own), the rank whose
    console asked (its copy waits paused where it was snapshotted), and how:
    lazily or not (None: where it can be), the history ring continued."""

    pending: Pending
    members: tuple[Manifest, ...]
    criu: Criu
    bound: int
    needed: frozenset[int]
    lazy: bool | None = None
    history: bool = False


class ReplacingSession(BusEnds, Protocol):
    """The session whose console asked: its bus's ends (the copies connect to
    them), and what it is told."""

    def replacing(self, due: RestoreDue) -> None:
        """The ranks are gone from the bus (ended, or held with their copies
        up): what they owe fails, what is asked of them waits for their
        copies."""

    def restored(self, due: RestoreDue, copies: dict[int, RestoredChild]) -> None:
        """Every copy is up (``copies``, by rank), the ranks they replace are gone."""

    def restore_failed(self, due: RestoreDue, error: Exception, *, kept: bool) -> None:
        """No copy runs; ``kept``: the ranks run on as they were (else they had
        ended first, and the run ends)."""


def replace_ranks(ranks: dict[int, FollowedRank], due: RestoreDue, session: ReplacingSession,
                  store: Store, message: Message, side: dict | None = None) -> bool:
    """Replace every rank of ``due`` by its copy (``side``: where a cut's
    copies meet each other again); whether the copies run."""
    running = [each for each in ranks.values() if each.child.poll() is None]
    ours = set().union(*(each.child.process_ids() for each in running))
    taken = {pid for pid in due.needed if os.path.exists(f"/proc/{pid}")}
    if taken - ours:
        session.restore_failed(due, SnapshotFailed(
            f"snapshot {due.members[0].id} needs pid(s) {_ids(taken - ours)}, which other "
            "processes hold now (CRIU restores pids): end them, or take snapshots of a run "
            "with --isolate, whose copies get pid namespaces of their own"), kept=True)
        return False
    beside = not taken  # else the copies need the ranks' own pids: they must end first
    for each in running:
        if beside:
            each.child.hold(True)  # no output or snapshot of its own while the copies start
        else:
            each.child.kill()
    for each in ranks.values():
        if not beside:
            # what it wrote before it ended (a snapshot it asked for is moot:
            # it is gone).  A held rank's output waits: should the copies fail,
            # it runs on, and a snapshot it asked for meanwhile is still taken.
            each.follower.poll(snapshots=False)
        if each.snapshots is not None:
            # its snapshots stay the run's, recorded under the timeline they were taken in
            each.snapshots.drain()
    if not beside:
        session.replacing(due)
    try:
        copies = _restore_copies(ranks, due, session, store, message, side)
    except (PrismError, OSError) as exc:
        for each in running if beside else ():
            each.child.hold(False)
        session.restore_failed(due, exc, kept=beside and bool(running))
        return False
    # the copies are up: now, and only now, the ranks they replace go
    if beside:
        session.replacing(due)
        for each in running:
            each.child.kill()
    for manifest in due.members:
        each = ranks[manifest.rank]
        each.child, each.exit_code, each.restored_from = copies[each.rank], None, manifest.id
    session.restored(due, copies)
    return True


def _restore_copies(ranks: dict[int, FollowedRank], due: RestoreDue, session: ReplacingSession,
                    store: Store, message: Message, side: dict | None) -> dict[int, RestoredChild]:
    """Every rank's copy, restored; none if one fails (those up are ended)."""
    copies: dict[int, RestoredChild] = {}
    try:
        for manifest in due.members:
            each = ranks[manifest.rank]
            os.chmod(each.files["control"], 0o600)  # it carries the bus's secret (and the store's)
            pid = restore_process(
                store, manifest, each.files, due.criu, bus=session.commands_endpoint,
                bus_curve=session.agent_curve, bus_secret=session.agent_secret,
                pause=each.rank == due.bound, history=due.history, lazy=due.lazy,
                side_store=side,
                message=message if len(ranks) == 1 else labelled(each.rank, message))
            copies[each.rank] = RestoredChild(pid, isolated=not due.needed)
    except BaseException:
        for copy in copies.values():
            copy.kill()
        raise
    return copies


def _ids(pids: set[int]) -> str:
    return ", ".join(map(str, sorted(pids)))
