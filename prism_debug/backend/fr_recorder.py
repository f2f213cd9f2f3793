"""The real rank's flight recorder, and the dump its watchdog writes.

On with ``TORCH_FR_BUFFER_SIZE`` (or ``TORCH_NCCL_TRACE_BUFFER_SIZE``) set to
a positive size, as torch's ProcessGroupNCCL records and dumps.  Every op the
rank issues is noted as a tuple in a ring of that size: sizes, dtype, group,
sequence numbers and how to learn its completion, never its tensors.  The
entries torch writes are built only at the dump, by
:class:`~prism_debug.backend.fr_dump_format.FlightRecorder`.

When the watchdog fires, the dump holds the timed-out op's group: the real
rank's file at ``TORCH_FR_DUMP_TEMP_FILE`` + rank, and one per virtual peer
of the group beside it (``peers/``), each the real rank's record as that peer
would have written it:

* a peer that fail-stopped writes nothing (a dead process dumps nothing);
* a hung peer never issued the timed-out collective: its record ends before;
* a desynchronised peer issued another one: a different size, dtype or
  collective, or the one after it (skip);
* every other peer issued what the real rank did (where the real rank sent
  to it, it received, and the other way round).

Each op is recorded as ProcessGroupNCCL records it (backend/fr_nccl_names.py):
a list-form all-gather's outputs stacked into one tensor, and so on.

So ``python -m torch.distributed.flight_recorder.fr_trace DIR`` names the
missing ranks or the mismatch, as it would for the full-size job.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from prism_debug.backend.fr_dump_format import (
    BUFFER_SIZE_ENV,
    FlightRecorder,
    buffer_size_from_env,
    dump_prefix_from_env,
    python_frames,
    write_group_dumps,
)
from prism_debug.backend.fr_nccl_names import nccl_call_of
from prism_debug.faults import MISSING_ACTIONS, Action, DesyncFault, Fault, Injection

log = logging.getLogger(__name__)

_OTHER_DTYPE = {"Float": "BFloat16", "BFloat16": "Float", "Half": "Float", "Double": "Float"}
_OTHER_OP = {"all_reduce": "all_gather", "all_gather": "all_reduce",
             "reduce_scatter": "all_reduce", "broadcast": "all_reduce"}


class FlightLog:
    def __init__(self, rank: int, buffer_size: int, prefix: str, clock) -> None:
        self.rank = rank
        self.prefix = prefix
        self._clock = clock
        self._ring: collections.deque = collections.deque(maxlen=buffer_size)
        self._groups: dict[int, tuple[str, str, tuple[int, ...]]] = {}
        self._counters: dict[int, list[int]] = {}  # pg_id -> [collectives, p2p ops, ops]

    @classmethod
    def from_env(cls, rank: int, clock, env=os.environ) -> FlightLog | None:
        """On when a buffer size is set and positive (0 or unset: off)."""
        if not any(name in env for name in BUFFER_SIZE_ENV):
            return None
        size = buffer_size_from_env(env)
        return cls(rank, size, dump_prefix_from_env(env), clock) if size > 0 else None

    # -- the hot path -------------------------------------------------------------

    def note(self, pg, call: str, outputs: list, inputs: list | None, peer: int | None,
             done, iteration: int) -> None:
        """One op issued: ``call`` names it as :mod:`~prism_debug.backend.fr_nccl_names`
        does ("all_gather", "_all_gather_base", ...), ``outputs`` and ``inputs``
        are the tensors the group was handed; ``done`` is its completion (a
        float, or a callable that resolves it, inf while not known)."""
        pg_id = pg.pg_id
        counters = self._counters.get(pg_id)
        if counters is None:
            counters = self._counters[pg_id] = [0, 0, 0]
            self._groups[pg_id] = (pg.getGroupName() or str(pg_id), pg.getGroupDesc(),
                                   tuple(pg.global_ranks))
        is_p2p = peer is not None
        counters[1 if is_p2p else 0] += 1
        counters[2] += 1
        # what NCCL records: list forms flattened, as it flattens them
        record = nccl_call_of(call, outputs, inputs, group_size=len(pg.global_ranks),
                              group_rank=pg.rank(), peer=peer)
        self._ring.append((pg_id, record, counters[0], counters[1], counters[2],
                           time.time_ns(), round(pg.timeout_s * 1000), peer, done, iteration))

    # -- the dump -------------------------------------------------------------------

    def dump(self, pg_id: int, seq: int,
             faults: Iterable[Injection]) -> tuple[Path, list[int]] | None:
        """Write the dumps of group ``pg_id`` timed out at its op ``seq`` (the
        group's op count); where the real rank's went and the ranks with no
        file.  ``faults`` are the faults in force."""
        if pg_id not in self._groups:
            return None
        name, desc, members = self._groups[pg_id]
        recorder = FlightRecorder(self.rank, len(self._ring) or 1)
        now_ns = time.time_ns()
        current = max((r[-1] for r in self._ring), default=1)
        stuck_at = None  # the timed-out op's collective sequence number
        frames = _main_thread_frames()
        for (ring_pg, record, coll, p2p, op_id, created, timeout_ms, peer, done,
             iteration) in self._ring:
            if ring_pg != pg_id:
                continue
            if callable(done):
                done = done()
            # An op the engine has forgotten (older than two iterations) ended
            # long ago: the rank got past it.
            finished = done <= self._clock.now() or (done == math.inf and iteration < current - 1)
            timed_out = op_id == seq
            if timed_out:
                stuck_at = coll
            entry = recorder.record(
                pg_id=pg_id, pg_name=name, pg_desc=desc, ranks=members, collective_seq_id=coll,
                p2p_seq_id=p2p, op_id=op_id, profiling_name=record.profiling_name,
                input_sizes=record.input_sizes, input_dtypes=record.input_dtypes,
                output_sizes=record.output_sizes, output_dtypes=record.output_dtypes,
                timeout_ms=timeout_ms,
                is_p2p=peer is not None, time_created_ns=created,
                frames=frames if timed_out else ())
            if finished and not timed_out:
                recorder.completed(entry, min(now_ns, created + 1))
        if stuck_at is None:
            return None
        own = recorder.entries()
        by_rank: dict[int, list[dict]] = {}
        absent: list[int] = []
        for group_rank, member in enumerate(members):
            if member == self.rank:
                by_rank[member] = own
                continue
            fault = _fault_of(member, faults)
            mine = _mirrored(own, group_rank)
            if fault is None:
                by_rank[member] = mine
            elif fault.action == Action.FAIL:
                absent.append(member)
            else:
                by_rank[member] = _as_peer(mine, stuck_at, fault)
        paths = write_group_dumps(self.prefix, by_rank, pg_config=recorder.pg_config(),
                                  pg_name=name, lead_rank=self.rank)
        return paths[self.rank], absent


def _fault_of(rank: int, faults: Iterable[Injection]) -> Fault | None:
    """The fault that keeps ``rank`` from the timed-out collective, if any."""
    for injection in faults:
        fault = injection.fault
        if fault.action in MISSING_ACTIONS and fault.stall_s is None and injection.hits(rank):
            return fault
    return None


def _mirrored(entries: list[dict], group_rank: int) -> list[dict]:
    """The real rank's record as the peer at ``group_rank`` holds it: where the
    real rank sent to that peer, the peer received ("nccl:send 0->1" is
    "nccl:recv 1<-0" in rank 1's record), and the other way round.

    (A peer's point-to-point ops with third ranks are not in the real rank's
    record; there the copy stands, and fr_trace, which matches a send of
    rank 0 against every member's op of the same sequence number, flags it
    in a group of more than two, as it would flag the real job's.)"""
    mirrored = []
    for entry in entries:
        if entry["is_p2p"]:
            kind, _, ends = entry["profiling_name"].partition(" ")
            me, peer = (ends.split("->") if "->" in ends else ends.split("<-"))
            if int(peer) == group_rank:
                other = "recv {}<-{}" if kind == "nccl:send" else "send {}->{}"
                entry = dict(entry, profiling_name="nccl:" + other.format(peer, me))
        mirrored.append(entry)
    return mirrored


def _as_peer(entries: list[dict], stuck_at: int, fault: Fault) -> list[dict]:
    """The real rank's record as a hung or desynchronised peer would hold it."""
    before = [dict(e) for e in entries if e["is_p2p"] or e["collective_seq_id"] < stuck_at]
    if not isinstance(fault, DesyncFault):  # a hang: the peer issued nothing after it
        return before
    later = [e for e in entries if not e["is_p2p"] and e["collective_seq_id"] >= stuck_at]
    if not later:
        return before
    mine = dict(later[0])
    kind = fault.kind
    if kind == "size":
        mine["input_sizes"] = [[2 * s[0], *s[1:]] if s else [2] for s in mine["input_sizes"]]
        mine["output_sizes"] = [[2 * s[0], *s[1:]] if s else [2] for s in mine["output_sizes"]]
    elif kind == "dtype":
        mine["input_dtypes"] = [_OTHER_DTYPE.get(d, "Float") for d in mine["input_dtypes"]]
        mine["output_dtypes"] = [_OTHER_DTYPE.get(d, "Float") for d in mine["output_dtypes"]]
    elif kind == "op":
        op = mine["profiling_name"].removeprefix("nccl:")
        mine["profiling_name"] = "nccl:" + _OTHER_OP.get(op, "all_reduce")
    elif kind == "skip":
        if len(later) < 2:
            return before  # what it issued instead is not in the real rank's record
        mine = dict(later[1], collective_seq_id=stuck_at, state=later[0]["state"],
                    time_discovered_completed_ns=None, retired=False)
    return before + [mine]


def _main_thread_frames(limit: int = 32) -> list[dict]:
    """The script's stack where it waits (innermost first), without the harness's frames."""
    main = threading.main_thread().ident
    assert main is not None  # (the main thread has started: it runs the script)
    frame = sys._current_frames().get(main)
    harness = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frames = python_frames(frame=frame, limit=None) if frame is not None else []
    return [f for f in frames if not f["filename"].startswith(harness)][:limit]
