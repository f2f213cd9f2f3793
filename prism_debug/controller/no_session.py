"""What the controller's loop serves when a run has no bus (``--no-bus``):
snapshots still, recorded off the loop as a session's are, nothing else."""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable
from pathlib import Path

from prism_debug.capture.ring import Ring
from prism_debug.capture.snapshots import Release, Snapshotter
from prism_debug.process.children import RankProcess


class RankSnapshots:
    """One rank's snapshots as its controller takes them, without a bus: the
    snapshotter made on the first (so a run that takes none needs no CRIU),
    each recorded off the loop.  ``dumper``: a rank of several dumped on a
    thread of its own, so that every rank of a cut is dumped at once, not
    one after the other while the others wait (each rank's own dumps stay
    in order: it announces the next only once let go).  ``ring``: the
    rank's ``--history`` ring, which its history's snapshots go to."""

    def __init__(self, snapshotter_factory: Callable[[], Snapshotter],
                 run_files: dict[str, Path], dumper: bool = False,
                 ring: Ring | None = None) -> None:
        self._snapshotter_factory = snapshotter_factory
        self._snapshotter: Snapshotter | None = None
        self.run_files = run_files
        self.ring = ring
        self._cut_run: str | None = None  # the timeline a console's restore began
        self._dumper = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="prism-dump") if dumper else None

    def _made(self) -> Snapshotter:
        if self._snapshotter is None:
            self._snapshotter = self._snapshotter_factory()
            self._snapshotter.open_files = dict(self.run_files)
        if self._cut_run is not None:
            self._snapshotter.cut_run = self._cut_run
        return self._snapshotter

    def take(self, pid: int, event: dict) -> None:
        snapshotter = self._made()
        args = (pid, event["iteration"], bool(event.get("cuda")), Release.of(event))
        # recorded off the loop; the end of the run waits for it
        dump: Callable[[], object]
        if self.ring is not None and event.get("history"):
            dump = functools.partial(self.ring.take, snapshotter, *args)
        else:  # (the user's snapshots are the ring's restore points too, never removed)
            dump = functools.partial(snapshotter.take, *args, recorded=(
                self.ring.taken if self.ring is not None else None))
        if self._dumper is None:
            dump()
        else:
            self._dumper.submit(dump)  # (take says what fails itself, and lets the rank go)

    def continue_as(self, cut_run: str) -> None:
        """A console restored the rank: its snapshots from now on are parts of
        the cuts of ``cut_run``, the new timeline's (a cut's id names its run
        and iteration, and the old timeline's cuts stay)."""
        self._cut_run = cut_run

    def drain(self) -> None:
        """Until every snapshot asked for so far is dumped and recorded (more
        may follow: a restored copy's)."""
        if self._dumper is not None:
            self._dumper.submit(lambda: None).result()
        self.wait_recorded()

    def close(self) -> None:
        if self._dumper is not None:
            self._dumper.shutdown(wait=True)
        if self._snapshotter is not None:
            self._snapshotter.recorder.wait()  # a snapshot dumped is a snapshot kept

    @property
    def taken(self) -> list[str]:
        """The snapshots taken, in order, once recorded."""
        return [] if self._snapshotter is None else self._snapshotter.recorded()

    def wait_recorded(self) -> None:
        """Until every snapshot dumped so far is recorded."""
        if self._snapshotter is not None:
            self._snapshotter.recorder.wait()

    def recorded_so_far(self) -> list[str]:
        """The snapshots recorded by now, in order (no wait for one in progress)."""
        return [] if self._snapshotter is None else self._snapshotter.recorded_so_far()


class NoBus:
    """What the controller's loop serves when a run has no bus: nothing but
    its sleep (no console, so no restore)."""

    restoring = False

    def poll(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def exited(self, rank: int, exit_code: int) -> None:
        pass

    def take_restore(self) -> None:
        return None

    def restore_refused(self, due: object, why: str) -> None:
        pass  # (no console asked)


class NoSession(NoBus):
    """A rank's side of a run without a bus: its relay, which takes its
    snapshots, and the bus's ends it has not got."""

    commands_endpoint = None
    agent_curve = None
    agent_secret = None

    def __init__(self, snapshotter_factory: Callable[[], Snapshotter],
                 run_files: dict[str, Path], snapshots: RankSnapshots | None = None) -> None:
        self.snapshots = snapshots or RankSnapshots(snapshotter_factory, run_files)
        self.child: RankProcess | None = None
        self.run_files = run_files

    def follows(self, rank: int, child: RankProcess) -> None:
        """``child`` is the rank's process now."""
        self.child = child

    def relay(self, rank: int, snapshots: RankSnapshots | None = None) -> NoSession:
        """The rank's relay: this stand-in itself, which takes its snapshots."""
        return self

    def output(self, line: str) -> None:
        pass

    def close(self) -> None:
        self.snapshots.close()

    @property
    def snapshots_taken(self) -> list[str]:
        return self.snapshots.taken

    def take_snapshot(self, event: dict) -> None:
        assert self.child is not None  # the rank announcing the snapshot is the one followed
        self.snapshots.take(self.child.pid, event)
