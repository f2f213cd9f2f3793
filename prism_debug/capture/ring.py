"""The ``run --history K`` ring on disk: dumps marked as the ring's, the
timeline told of every snapshot and restore, and the snapshots it gives up
removed from the store.  ``capture/history.py`` decides; this does it, for the
controller's session."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import threading
from collections.abc import Callable

from prism_debug.capture.history import History, Kept, Plan, Position
from prism_debug.capture.snapshots import Release, Snapshotter
from prism_debug.errors import PrismError
from prism_debug.snapshot.manifest import Manifest
from prism_debug.snapshot.store import Store


class Ring:
    def __init__(self, size: int, store: Store, message: Callable[[str], None]) -> None:
        self.history = History(size)
        self.store = store
        self._message = message
        # snapshots join the timeline on the recorder's thread (in the order
        # they were dumped, each before the next one's parent is chosen); the
        # rest happens on the controller's loop
        self._lock = threading.RLock()

    @property
    def size(self) -> int:
        return self.history.size

    def take(self, snapshotter: Snapshotter, pid: int, iteration: int, cuda: bool,
             release: Release) -> concurrent.futures.Future:
        """Dump the rank for the ring, as ``snapshotter`` dumps (the run's CRIU,
        facts, files and recorder) but marked as the ring's, an increment only
        where ``--incremental`` asked and the ring's chain allows, and quiet
        on the terminal but for warnings (a dump every iteration is no news).
        The future of :meth:`Snapshotter.take`; the snapshot joins the
        timeline once recorded."""
        ring = dataclasses.replace(
            snapshotter, base={**snapshotter.base, "history": True},
            # a list of its own: the user's snapshots chain on theirs alone, so
            # none of them ever needs a ring snapshot the ring gives up
            taken=[],
            # by page comparison, right on any parent (CRIU's memory tracking
            # is right only on the process's last dump, which a restore is not)
            tracked=False, message=self._warnings)
        # chosen as it is recorded: every snapshot dumped before is in the timeline then
        parent = self._parent if snapshotter.incremental else (lambda: None)
        return ring.take(pid, iteration, cuda, release, parent=parent, recorded=self.taken)

    def _parent(self) -> str | None:
        with self._lock:
            return self.history.parent()

    def _warnings(self, line: str) -> None:
        if line.startswith("prism-debug:"):
            self._message(line)

    def taken(self, manifest: Manifest) -> None:
        """A snapshot of the rank (the ring's or the user's) joins the timeline."""
        with self._lock:
            self._remove(self.history.taken(_kept(manifest)))

    def hit(self, where: dict) -> None:
        with self._lock:
            self.history.hit(where)

    def restored(self, manifest: Manifest, target: Position | None = None) -> None:
        """The rank was replaced by a copy of ``manifest``: the timeline is cut
        there (or starts again from it)."""
        try:
            ancestors = {m.id for m in self.store.chain(manifest.id)[1:]}
        except PrismError:
            ancestors = set()
        with self._lock:
            self._remove(self.history.restored(_kept(manifest), ancestors, target))

    def plan(self, here: Position, iterations: int | None) -> Plan:
        """``back ITERATIONS`` (None: ``reverse-continue``) from ``here``."""
        with self._lock:
            if iterations is None:
                return self.history.reverse_continue(here)
            return self.history.back(here, iterations)

    def _remove(self, ids: list[str]) -> None:
        # newest first: an increment goes before the parent it needs
        for snapshot_id in reversed(ids):
            try:
                self.store.remove(snapshot_id)
            except (PrismError, OSError) as exc:
                self._message(f"prism-debug: warning: the history could not remove snapshot "
                              f"{snapshot_id}: {exc}")


def _kept(manifest: Manifest) -> Kept:
    return Kept(manifest.id, manifest.iteration, manifest.parent, manifest.history)
