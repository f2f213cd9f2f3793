"""Snapshots recorded off the controller's loop, one after another.

Recording a snapshot (an increment's comparison with its parent, the
commit's checksums, page index and fsync) takes about 0.4 s per GiB after
the rank was let go.  Done on the loop, it held the loop: a rank that came
to its next boundary meanwhile (``--snapshot-every 1``, ``run --history K``)
waited for it before its own dump could start.  One thread records them
instead, in the order they were dumped: an increment is compared with its
parent's page index, so the parent's record must be over first (its dump
need not: CRIU's dump of the child reads nothing of the parent's).  Whoever
needs a snapshot recorded waits for the recorder (:meth:`Recorder.wait`):
the answers to whoever asked for a snapshot, the end of a run, a restore.
A rank that comes to boundaries faster than its snapshots are recorded
waits for room before its next dump, so that the staged dumps waiting to be
recorded (each a copy of its memory on disk) stay few.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")
RECORDER_NICENESS = 10  # the recorder's thread's (at least): a record yields to a dump


class Recorder:
    """A queue of records and the one thread that works it; the thread is
    started by the first record and ends whenever the queue is empty."""

    def __init__(self) -> None:
        self._jobs: collections.deque = collections.deque()
        self._changed = threading.Condition()
        self._working = False  # a thread works the queue (or is about to)
        self._submitted = self._finished = 0  # records so far (finished in order)

    def submit(self, record: Callable[[], R]) -> concurrent.futures.Future:
        """Run ``record`` after every record submitted before it; its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._changed:
            self._jobs.append((record, future))
            self._submitted += 1
            if not self._working:
                self._working = True
                threading.Thread(target=self._work, name="prism-recorder", daemon=True).start()
        return future

    def _work(self) -> None:
        # below the dumps in the CPU's favour: the next snapshot's CRIU dump
        # (the rank held) runs beside this record, and the threads the commit
        # starts (its fsyncs) inherit the niceness
        try:
            me = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, me, max(RECORDER_NICENESS,
                                                    os.getpriority(os.PRIO_PROCESS, me)))
        except OSError:
            pass
        while True:
            with self._changed:
                if not self._jobs:
                    self._working = False
                    return
                record, future = self._jobs.popleft()
            try:
                future.set_result(record())
            except BaseException as exc:  # the caller's to see; the queue goes on
                future.set_exception(exc)
            finally:
                with self._changed:
                    self._finished += 1
                    self._changed.notify_all()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Until every record submitted so far is over (not those submitted
        meanwhile: a rank snapshotted at every boundary keeps adding); False
        on ``timeout_s``."""
        with self._changed:
            target = self._submitted
            return self._changed.wait_for(lambda: self._finished >= target, timeout_s)

    def make_room(self, most: int) -> None:
        """Until fewer than ``most`` records are under way or queued."""
        with self._changed:
            self._changed.wait_for(lambda: self._submitted - self._finished < most)

    @property
    def busy(self) -> bool:
        with self._changed:
            return self._finished < self._submitted
