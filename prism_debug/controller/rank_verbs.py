"""What a session of one real rank does with snapshots: the console's
``snapshot`` (dumped by the controller, the rank's parent, when the rank
reaches the boundary; its askers answered once it is recorded), ``snapshots``,
``restore`` (the rank replaced in place by a copy, paused where the snapshot
was taken) and, under ``run --history K``, ``back`` and ``reverse-continue``
(the nearest earlier snapshot of the ring restored and run on to where it
was asked to stop).

Two things run beside the controller's loop, so the bus goes on answering —
breakpoints, status, the rank's heartbeats — and the rank's next snapshot is
dumped at once: the checks before a restore (every image's checksum: seconds
for a large rank), and the record of each snapshot once the rank was let go
(``capture/recorder.py``), whose askers are answered when it is over, in the
order the snapshots were taken.
"""

from __future__ import annotations

import collections
import concurrent.futures
from collections.abc import Callable
from pathlib import Path

from prism_debug.bus.server import Deferred, Pending
from prism_debug.capture import snapshots
from prism_debug.capture.history import Plan
from prism_debug.capture.ring import Ring
from prism_debug.capture.snapshots import Release, Snapshotter, release_rank
from prism_debug.controller.no_session import NoSession
from prism_debug.controller.replace import RestoreDue
from prism_debug.controller.session import (
    Message,
    Session,
    answered,
    listed,
    off_the_loop,
    plan_step_back,
    run_to_stop,
)
from prism_debug.errors import (
    Busy,
    InvalidState,
    PrismError,
    RankUnavailable,
    SnapshotFailed,
)
from prism_debug.process.children import RankProcess, RestoredChild
from prism_debug.snapshot import criu as criu_api
from prism_debug.snapshot.manifest import Manifest
from prism_debug.snapshot.store import Store

MAX_SNAPSHOT_WAITERS = 64  # clients waiting for snapshots to be taken, all together


class RankVerbs:
    """A session of one rank's snapshots and restores (session.Verbs)."""

    def __init__(self, session: Session, run_files: dict[str, Path], store: Store,
                 snapshotter_factory: Callable[[], Snapshotter],
                 history: int | None = None) -> None:
        self._session = session
        self.server = session.server
        self.rank = session.rank
        self.world_size = session.world_size
        self._message = session.message
        self.run_files = run_files  # log, events, control: what a restored copy writes to
        self.store = store
        self._snapshotter_factory = snapshotter_factory
        self._snapshotter: Snapshotter | None = None
        self._snapshot_waiters: dict[int, list[Pending]] = {}  # iteration -> clients
        self._dumping = False
        # restores answered once the restored copy's agent is back on the bus
        self._restores: list[tuple[Pending, dict]] = []
        # a restore whose checks run off the loop: who asked, and the checks
        self._checking: tuple[Pending, concurrent.futures.Future] | None = None
        self._restore_lazy: bool | None = None  # the restore under way's choice
        # run --history K: the last K iterations' snapshots, to step back to
        self.ring = Ring(history, store, session.message) if history else None
        # restores that step back: where to stop, and the breakpoints to hand over
        self._plans: dict[Pending, tuple[Plan, list]] = {}
        self._taken: dict[int, dict] = {}  # iteration -> the snapshot taken there, this rank
        # snapshots dumped (the user's), answered once recorded: (iteration, future)
        self._recording: collections.deque = collections.deque()
        server = self.server
        server.handle("snapshot", self._snapshot)
        server.handle("snapshots", self._snapshots)
        server.handle("restore", self._restore)
        server.handle("back", self._back)
        server.handle("reverse-continue", self._reverse_continue)

    @property
    def exit_code(self) -> int | None:
        return self._session.exit_code(self.rank)

    @property
    def child(self) -> RankProcess | None:
        return self._session.child

    # -- the loop's side ------------------------------------------------------------

    def poll(self) -> None:
        self._answer_recorded()

    @property
    def restoring(self) -> bool:
        return self._checking is not None

    def snapshotting(self, rank: int) -> bool:
        return self._dumping

    def exited(self, rank: int, exit_code: int) -> None:
        self._records_done()  # its last snapshots are answered for, and in the run's result
        for pending, _ in self._restores:
            self.server.fail(pending, RankUnavailable(
                f"the restored rank exited (code {exit_code}) before it reconnected"))
        self._restores.clear()
        self._fail_snapshot_waiters(f"the rank exited (code {exit_code}) before the snapshot")

    def _fail_snapshot_waiters(self, why: str) -> None:
        for waiters in self._snapshot_waiters.values():
            for pending in waiters:
                self.server.fail(pending, RankUnavailable(why))
        self._snapshot_waiters.clear()

    def close(self) -> None:
        if self._snapshotter is not None:
            self._snapshotter.recorder.wait()  # a snapshot dumped is a snapshot kept

    def rank_paused(self, rank: int, where: dict) -> None:
        if self.ring is not None:
            self.ring.hit(where)

    @property
    def snapshotter(self) -> Snapshotter:
        """Made on the first snapshot, so a run that takes none needs no CRIU."""
        if self._snapshotter is None:
            self._snapshotter = self._snapshotter_factory()
            self._snapshotter.open_files = dict(self.run_files)
        return self._snapshotter

    @property
    def snapshots_taken(self) -> list[str]:
        """The run's snapshots (not its history's), in order, once recorded."""
        return [] if self._snapshotter is None else self._snapshotter.recorded()

    def take_snapshot(self, rank: int, event: dict) -> None:
        """The rank idles at a boundary for a snapshot: dump it and let it go;
        who asked is told once it is recorded (off the loop, in order)."""
        iteration = event["iteration"]
        self.server.agent_away()  # it closed its end of the bus for the dump
        self._dumping = True
        # only the ring asked for it: its own, quietly (no event, no waiter)
        ring = self.ring if event.get("history") else None
        child = self.child
        assert child is not None  # the rank announcing the snapshot is the one followed
        try:
            snapshotter = self.snapshotter
        except PrismError as exc:
            # no CRIU: the rank must still be let go
            release_rank(child.pid, self.run_files["control"], Release.of(event),
                         self._message)
            recording: concurrent.futures.Future = concurrent.futures.Future()
            recording.set_result((None, str(exc)))
        else:
            if ring is not None:
                recording = ring.take(snapshotter, child.pid, iteration,
                                      bool(event.get("cuda")), Release.of(event))
            else:  # a restore point of the ring too, never removed
                recording = snapshotter.take(
                    child.pid, iteration, bool(event.get("cuda")), Release.of(event),
                    recorded=self.ring.taken if self.ring is not None else None)
        finally:
            self._dumping = False
        if ring is None:
            self._recording.append((iteration, recording))

    def _answer_recorded(self) -> None:
        """Tell who asked of the snapshots recorded since, in the order taken."""
        while self._recording and self._recording[0][1].done():
            iteration, recording = self._recording.popleft()
            try:
                manifest, error = recording.result()
            except Exception as exc:  # a bug in the record must not end the session
                manifest, error = None, f"{type(exc).__name__}: {exc}"
            self._recorded(iteration, manifest, error)

    def _records_done(self) -> None:
        """Wait for the snapshots dumped so far to be recorded, and answer for them."""
        if self._snapshotter is not None:
            self._snapshotter.recorder.wait()
        self._answer_recorded()

    def _recorded(self, iteration: int, manifest: Manifest | None, error: str) -> None:
        # a request for an earlier iteration that the rank served late is served here
        waiters = [pending for asked in sorted(self._snapshot_waiters) if asked <= iteration
                   for pending in self._snapshot_waiters.pop(asked)]
        if manifest is None:
            # told to every console: one that scheduled it waits for this
            self.server.publish("snapshot", {"iteration": iteration, "error": error})
            for pending in waiters:
                self.server.fail(pending, SnapshotFailed(f"no snapshot at iteration "
                                                         f"{iteration}: {error}"))
            return
        result = {"id": manifest.id, "iteration": manifest.iteration,
                  "bytes": manifest.image_bytes, "dump_s": manifest.dump_s,
                  "path": str(self.store.path(manifest.id))}
        self._taken[iteration] = result
        self.server.publish("snapshot", result)
        for pending in waiters:
            self.server.reply(pending, result)

    # -- verbs ------------------------------------------------------------------------

    def _snapshot(self, client: bytes, args: dict) -> dict:
        if self.exit_code is not None:
            raise RankUnavailable(f"the rank exited (code {self.exit_code}): restore a "
                                  "snapshot to go on")
        def answer(pending: Pending) -> None:
            def scheduled(message: dict) -> None:
                if (result := answered(self.server, pending, message)) is None:
                    return
                iteration = result["iteration"]
                if result.get("when") == "scheduled":
                    # taken when the rank gets to that boundary, which a paused
                    # rank does only once resumed: said now, announced as an event
                    self.server.reply(pending, result)
                elif iteration in self._taken:  # the dump was quicker than this reply
                    self.server.reply(pending, self._taken[iteration])
                elif sum(map(len, self._snapshot_waiters.values())) >= MAX_SNAPSHOT_WAITERS:
                    self.server.fail(pending, Busy(
                        f"{MAX_SNAPSHOT_WAITERS} requests wait for snapshots already: ask "
                        "again once they are taken"))
                else:
                    self._snapshot_waiters.setdefault(iteration, []).append(pending)
            self.server.ask_agent("snapshot", args, scheduled)
        raise Deferred(answer)

    def _snapshots(self, client: bytes, args: dict) -> dict:
        self._records_done()  # those dumped already are listed (a record: ≈0.4 s/GiB)
        manifests = self.store.list()
        return {"snapshots": [listed(m) for m in manifests]}

    def _restore(self, client: bytes, args: dict) -> dict:
        """Replace the rank by a copy restored from a snapshot, paused where
        the snapshot was taken; the session follows the copy from then on.
        Answered once the copy is back on the bus, or with why there is none
        (the rank then runs on as it was)."""
        if self._checking is not None:
            raise InvalidState("a restore is under way: wait for its answer")
        self._restore_lazy = args.get("lazy")  # None: lazily where it can be
        raise Deferred(lambda pending: self._start_restore(pending, args["id"]))

    def _start_restore(self, pending: Pending, snapshot_id: str) -> None:
        """The checks of a restore, off the loop; the loop restores once they pass."""
        self._checking = (pending, off_the_loop(lambda: self._restorable(snapshot_id)))

    def _restorable(self, snapshot_id: str) -> tuple[Manifest, criu_api.Criu, set[int]]:
        """Everything a restore needs, checked before anything is given up (off
        the loop): the manifest, the CRIU to use, and the pids the copy takes.
        A snapshot still being recorded is waited for."""
        if self._snapshotter is not None:
            self._snapshotter.recorder.wait()
        try:
            manifest = self.store.verify(snapshot_id)
            snapshots.check_unchanged(manifest)
        except PrismError as exc:
            raise InvalidState(str(exc)) from None
        if (manifest.rank, manifest.world_size) != (self.rank, self.world_size):
            raise InvalidState(f"snapshot {manifest.id} is of rank {manifest.rank} of "
                               f"{manifest.world_size}; this session runs rank {self.rank} of "
                               f"{self.world_size}")
        try:
            criu = snapshots.restore_tools(manifest)
            needed = criu_api.tree_pids(self.store.path(manifest.id))
        except PrismError as exc:
            raise SnapshotFailed(str(exc)) from None
        return manifest, criu, needed

    def take_restore(self) -> RestoreDue | None:
        """For the controller's loop: a console's restore whose checks passed
        (one that failed is answered here; the rank runs on as it was)."""
        if self._checking is None or not self._checking[1].done():
            return None
        pending, checks = self._checking
        self._checking = None
        # snapshots the rank took meanwhile join its timeline before a restore cuts it
        self._records_done()
        try:
            manifest, criu, needed = checks.result()
        except PrismError as exc:
            self.server.fail(pending, exc)
            return None
        except Exception as exc:  # a bug in the checks must not end the session
            self.server.fail(pending, SnapshotFailed(f"the checks before the restore failed: "
                                                     f"{exc}"))
            return None
        return RestoreDue(pending, (manifest,), criu, self.rank, frozenset(needed),
                          lazy=self._restore_lazy, history=self.ring is not None)

    def replacing(self, due: RestoreDue) -> None:
        self.server.agent_gone()
        self._fail_snapshot_waiters("the rank was replaced by a restored copy")
        self._taken.clear()
        self.server.agent_away()  # the copy's agent connects as it resumes

    def restored(self, due: RestoreDue, copies: dict[int, RestoredChild]) -> None:
        (manifest,), copy = due.members, copies[self.rank]
        if self.ring is not None:
            plan, _ = self._plans.get(due.pending, (None, None))
            self.ring.restored(manifest, plan.target if plan is not None else None)
        result = {"id": manifest.id, "iteration": manifest.iteration, "pid": copy.pid}
        self.server.publish("restored", result)
        self._message(f"prism-debug: restored snapshot {manifest.id} (after iteration "
                      f"{manifest.iteration}) as pid {copy.pid}")
        # answered when the copy is back on the bus, so the next command reaches it
        self._restores.append((due.pending, result))

    def restore_failed(self, due: RestoreDue, error: Exception, *, kept: bool) -> None:
        self._plans.pop(due.pending, None)
        if kept:
            self.server.fail(due.pending, SnapshotFailed(f"{error}; the rank runs on as it was"))
        else:
            self.server.fail(due.pending, SnapshotFailed(
                f"{error}; the rank had to end first, as the copy needs its pids (a run with "
                "--isolate keeps it through a failed restore)"))

    def rank_back(self, rank: int) -> None:
        for pending, result in self._restores:
            step_back = self._plans.pop(pending, None)
            if step_back is None:
                self.server.reply(pending, result)
            else:  # the copy runs on to where it was asked to stop
                run_to_stop(self.server, pending, result, *step_back, self.rank)
        self._restores.clear()

    # -- stepping back (run --history K) -----------------------------------------------

    def _back(self, client: bytes, args: dict) -> dict:
        """Go back ``iterations`` (default 1) before the one in progress:
        restore the nearest earlier snapshot of the history, run to where
        that iteration starts, pause there.  Answered as the copy runs there
        (with the number of the pause before its stop, as continue is)."""
        return self._step_back(args.get("iterations", 1))

    def _reverse_continue(self, client: bytes, args: dict) -> dict:
        """Go back to the last breakpoint hit before where the rank is, as back does."""
        return self._step_back(None)

    def _step_back(self, iterations: int | None) -> dict:
        verb = "back" if iterations is not None else "reverse-continue"
        ring = self.ring
        if ring is None:
            raise InvalidState(f"{verb} needs the run's history: run with --history K "
                               "(e.g. prism-debug run --history 8 …) to keep snapshots of the "
                               "last K iterations to go back to")
        if self._checking is not None or self._restores:
            raise InvalidState("a restore is under way: wait for its answer")
        if self.exit_code is not None:  # the run ends with it (its last K snapshots stay)
            raise RankUnavailable(f"the rank exited (code {self.exit_code}); its history's "
                                  "snapshots stay in the store: prism-debug snapshot restore ID")
        if not self.server.agent_connected:
            raise InvalidState(f"the rank is off the bus for a moment (starting, or being "
                               f"snapshotted): {verb} again")
        plan_step_back(self.server, verb, self.rank, ring, iterations, self._records_done,
                       self._go_back)

    def _go_back(self, pending: Pending, plan: Plan, breakpoints: list) -> None:
        if self._checking is not None or self._restores:
            self.server.fail(pending, InvalidState("a restore is under way: wait for its "
                                                   "answer"))
            return
        self._plans[pending] = (plan, breakpoints)
        self._restore_lazy = None  # lazily where it can be
        self._start_restore(pending, plan.snapshot.id)


def open_rank_session(rank: int, world_size: int, bind: str | None, files: dict[str, Path],
                      store: Store, snapshotter_factory: Callable[[], Snapshotter],
                      message: Message, history: int | None = None) -> Session | NoSession:
    """A run of one real rank's debugging session on the bus, or a silent
    stand-in without one; ``history``: keep the last K iterations' snapshots
    to step back to."""
    if bind is None:
        return NoSession(snapshotter_factory, files)
    return Session(ranks=(rank,), world_size=world_size, host=bind, message=message,
                   verbs=lambda session: RankVerbs(session, files, store, snapshotter_factory,
                                                   history))
