"""What the controller's loop serves when a run has no bus (``--no-bus``):
snapshots still, recorded off the loop as a session's are, nothing else."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from prism_debug.runner.children import RankProcess
from prism_debug.runner.snapshots import Release, Snapshotter


class RankSnapshots:
    """One rank's snapshots as its controller takes them, without a bus: the
    snapshotter made on the first (so a run that takes none needs no CRIU),
    each recorded off the loop."""

    def __init__(self, snapshotter_factory: Callable[[], Snapshotter],
                 run_files: dict[str, Path]) -> None:
        self._snapshotter_factory = snapshotter_factory
        self._snapshotter: Snapshotter | None = None
        self.run_files = run_files

    def take(self, pid: int, event: dict) -> None:
        if self._snapshotter is None:
            self._snapshotter = self._snapshotter_factory()
            self._snapshotter.open_files = dict(self.run_files)
        # recorded off the loop; the end of the run waits for it
        self._snapshotter.take(pid, event["iteration"], bool(event.get("cuda")),
                               Release.of(event))

    def close(self) -> None:
        if self._snapshotter is not None:
            self._snapshotter.recorder.wait()  # a snapshot dumped is a snapshot kept

    @property
    def taken(self) -> list[str]:
        """The snapshots taken, in order, once recorded."""
        return [] if self._snapshotter is None else self._snapshotter.recorded()


class NoSession:

    commands_endpoint = None
    agent_curve = None
    agent_secret = None
    restoring = False

    def __init__(self, snapshotter_factory: Callable[[], Snapshotter],
                 run_files: dict[str, Path]) -> None:
        self.snapshots = RankSnapshots(snapshotter_factory, run_files)
        self.child: RankProcess | None = None
        self.run_files = run_files

    def poll(self, timeout_s: float) -> None:
        time.sleep(timeout_s)

    def output(self, line: str) -> None:
        pass

    def exited(self, exit_code: int) -> None:
        self.close()

    def close(self) -> None:
        self.snapshots.close()

    @property
    def snapshots_taken(self) -> list[str]:
        return self.snapshots.taken

    def take_snapshot(self, event: dict) -> None:
        self.snapshots.take(self.child.pid, event)
