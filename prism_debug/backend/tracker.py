"""Per-iteration accounting in the real rank: time, waits, collectives, digest.

Pure Python (no torch): the backend feeds it bytes and timestamps on the
emulated clock; at every iteration boundary it closes one record and hands it
to a sink (the agent appends it to the run's event log).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable

# When an op completes on the emulated clock: a float, or the graph engine's
# DeferredCompletion (a zero-argument callable, inf while not known yet).
Completion = float | Callable[[], float]


class OpRecord:
    """One collective of the iteration, as the trace and the debugger's
    timeline see it.  Its Work fills in when it completed and how long the
    script blocked on it; the record holds no tensors, so keeping an
    iteration's records keeps none of its buffers alive."""

    __slots__ = ("op", "family", "index", "nbytes", "arrival", "done_s", "deferred", "waited_s")

    def __init__(self, op: str, family: str, index: int, nbytes: int, arrival: float,
                 done: Completion) -> None:
        self.op, self.family, self.index, self.nbytes, self.arrival = (
            op, family, index, nbytes, arrival)
        # a float, or the graph engine's deferred answer (resolved by the Work)
        self.deferred: Callable[[], float] | None = done if callable(done) else None
        self.done_s: float | None = None if callable(done) else done
        self.waited_s = 0.0

    def resolve(self) -> float:
        """When it completed (on the rank's main thread: may ask the engine)."""
        if self.done_s is None:
            assert self.deferred is not None  # (one of the two is set from the start)
            return self.deferred()
        return self.done_s


class IterationTracker:
    def __init__(self, start: float, sink: Callable[[dict], None], record_ops: bool) -> None:
        self.iteration = 1  # the iteration in progress, 1-based like optimizer steps
        self.record_ops = record_ops  # per-op records go into the iteration's record
        # keep the last finished iteration's ops (the debugger's timeline)
        self.keep_last_ops = False
        self.last_ops: tuple[int, float, list[OpRecord]] | None = None  # iteration, start, ops
        self._sink = sink
        self._lock = threading.Lock()  # the future completer thread adds waits too
        self._reset(start)

    def _reset(self, start: float) -> None:
        self.start = start
        self.num_collectives = 0
        self.comm_wait_s = 0.0
        # SHA-256: hardware-accelerated (SHA-NI) on current x86, twice BLAKE2b here
        self.hasher = hashlib.sha256()
        self.ops: list[OpRecord] = []  # when recording
        # when recording: the digest of the iteration's values up to and
        # including each op, so a regression test names the first op whose
        # values differ (a copy of the running hash: about a microsecond)
        self.op_digests: list[str] = []
        self.waits: list[tuple[float, float]] = []  # (start, end) when recording
        # every op's kind, arrival and completion (a float, or the graph
        # engine's deferred answer): the report's distribution of waits
        self.spans: list[tuple[str, float, Completion]] = []

    # -- the collective path (hot) ---------------------------------------------

    def collective(self, op: str, ref, nbytes: int, arrival: float,
                   done: Completion) -> OpRecord | None:
        """``done``: when the op completes, or the graph engine's deferred
        answer; the record (when recording) for the op's Work to complete."""
        self.num_collectives += 1
        self.spans.append((op, arrival, done))
        if self.record_ops or self.keep_last_ops:
            record = OpRecord(op, ref.family, ref.index, nbytes, arrival, done)
            self.ops.append(record)
            if self.record_ops:
                self.op_digests.append(self.hasher.copy().hexdigest()[:16])
            return record
        return None

    def waited(self, start: float, seconds: float) -> None:
        if seconds <= 0:
            return
        with self._lock:
            self.comm_wait_s += seconds
            if self.record_ops:
                self.waits.append((start, start + seconds))

    # -- boundaries -------------------------------------------------------------

    def _op_waits(self) -> dict[str, list[float]]:
        """How long each of the iteration's ops took from the rank's arrival
        to its completion, on the emulated clock, by op kind (an op that never
        completes — a failed peer's — is left out).  At a boundary every
        op's completion is known: asking the engine again costs no draw."""
        waits: dict[str, list[float]] = {}
        for op, arrival, done in self.spans:
            done_s = done() if callable(done) else done
            if done_s != float("inf"):
                waits.setdefault(op, []).append(round(max(0.0, done_s - arrival), 9))
        return waits

    def boundary(self, now: float, extra: dict) -> dict:
        """Close the iteration in progress at ``now``; return and emit its record."""
        with self._lock:
            time_s = now - self.start
            record = {
                "kind": "iteration",
                "iteration": self.iteration,
                "start_s": self.start,
                "time_s": time_s,
                "compute_s": max(0.0, time_s - self.comm_wait_s),
                "comm_wait_s": self.comm_wait_s,
                "num_collectives": self.num_collectives,
                "digest": self.hasher.hexdigest()[:32],
                "op_waits": self._op_waits(),
                **extra,
            }
            if self.record_ops:
                record["ops"] = [(op.op, op.family, op.index, op.nbytes, op.arrival,
                                  op.resolve()) for op in self.ops]
                record["waits"] = self.waits
                record["op_digests"] = self.op_digests
            if self.keep_last_ops:
                self.last_ops = (self.iteration, self.start, self.ops)
            self.iteration += 1
            self._reset(now)
        self._sink(record)
        return record
