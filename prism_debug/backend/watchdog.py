"""What ProcessGroupNCCL's watchdog does when a collective misses its timeout.

A virtual peer that fail-stops (or hangs) never arrives, so the real rank's
op never completes.  Torch's NCCL backend then behaves according to two
environment variables, and so does the emulated rank, on the emulated clock:

* ``TORCH_NCCL_BLOCKING_WAIT=1``: ``wait()`` raises ``DistBackendError``.
* ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` 1 (tear down) or 3 (skip clean-up, the
  default): the watchdog logs the timeout and takes the process down —
  ``terminate called after throwing an instance of 'c10::DistBackendError'``,
  SIGABRT, exit code 134 — after writing the flight-recorder dump when one is
  configured.
* 2 (clean up only): the communicators are aborted and ``wait()`` raises.
* 0 (no handling): the timeout is logged and the op hangs on, as it would.

The log lines are ProcessGroupNCCL's, word for word, so tools that grep a
job's logs for them (and people who know them) recognise them.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

# ProcessGroupNCCL's OpType names, by the op names the prism group uses
OP_TYPES = {"all_reduce": "ALLREDUCE", "barrier": "ALLREDUCE", "broadcast": "BROADCAST",
            "reduce": "REDUCE", "all_gather": "ALLGATHER", "reduce_scatter": "REDUCE_SCATTER",
            "all_to_all": "ALLTOALL_BASE", "gather": "GATHER", "scatter": "SCATTER",
            "send": "SEND", "recv": "RECV", "coalesced": "COALESCED"}


@dataclasses.dataclass(frozen=True)
class ErrorHandling:
    blocking_wait: bool = False
    async_mode: int = 3  # TORCH_NCCL_ASYNC_ERROR_HANDLING: torch 2.x's default, SkipCleanUp

    @classmethod
    def from_env(cls, env=os.environ) -> ErrorHandling:
        blocking = env.get("TORCH_NCCL_BLOCKING_WAIT", env.get("NCCL_BLOCKING_WAIT", "0"))
        mode = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING",
                       env.get("NCCL_ASYNC_ERROR_HANDLING", "3"))
        try:
            async_mode = int(mode)
        except ValueError:
            async_mode = 3
        return cls(blocking.strip() in ("1", "true", "True"), async_mode)


@dataclasses.dataclass(frozen=True)
class TimedOutOp:
    """The op the watchdog caught, as WorkNCCL prints itself."""
    global_rank: int
    group_rank: int
    pg_id: int
    seq: int  # the group's collective sequence number
    op: str  # the prism group's name for it ("all_gather", "_all_gather_base", ...)
    numel_in: int  # as WorkNCCL counts them (backend/fr_nccl_names.py)
    numel_out: int
    timeout_ms: int
    ran_for_ms: int
    last_enqueued: int
    last_completed: int
    op_type: str = ""  # WorkNCCL's OpType; empty: the usual one for ``op``

    @property
    def work(self) -> str:
        op_type = self.op_type or OP_TYPES.get(self.op, self.op.upper())
        return (f"WorkNCCL(SeqNum={self.seq}, OpType={op_type}, "
                f"NumelIn={self.numel_in}, NumelOut={self.numel_out}, "
                f"Timeout(ms)={self.timeout_ms})")

    @property
    def caught(self) -> str:
        return (f"[Rank {self.group_rank}] Watchdog caught collective operation timeout: "
                f"{self.work} ran for {self.ran_for_ms} milliseconds before timing out.")

    @property
    def pg_prefix(self) -> str:
        return f"[PG ID {self.pg_id} PG GUID {self.pg_id} Rank {self.group_rank}]"


class Watchdog:
    """``expired`` is called once per op at the emulated moment its timeout
    runs out; ``dump_flight_record`` writes the dump and returns where, or
    None when no flight recorder is configured."""

    def __init__(self, handling: ErrorHandling, *,
                 dump_flight_record: Callable[[TimedOutOp], str | None] = lambda op: None,
                 on_fatal: Callable[[str], None] = lambda message: None,
                 stream: TextIO | None = None) -> None:
        self.handling = handling
        self._dump = dump_flight_record
        self._on_fatal = on_fatal
        self._stream = stream

    def _log(self, op: TimedOutOp, where: int, text: str) -> None:
        stamp = time.strftime("%m%d %H:%M:%S", time.localtime())
        fraction = f"{time.time_ns() % 1_000_000_000:09d}"
        stream = self._stream or sys.stderr
        stream.write(f"[rank{op.global_rank}]:[E{stamp}.{fraction} ProcessGroupNCCL.cpp:"
                     f"{where}] {text}\n")

    def expired(self, op: TimedOutOp) -> Exception | None:
        """Log as the watchdog does; then take the process down, or return the
        error ``wait()`` raises, or None (the op hangs on)."""
        from torch.distributed import DistBackendError

        self._log(op, 629, op.caught)
        dumped = self._dump(op)  # on timeout, in every mode (TORCH_NCCL_DUMP_ON_TIMEOUT)
        if self.handling.blocking_wait:
            return DistBackendError(op.caught)
        if self.handling.async_mode == 0:
            return None  # no handling: logged, and the collective never finishes
        self._log(op, 2168, f"{op.pg_prefix}  failure detected by watchdog at work sequence "
                            f"id: {op.seq} PG status: last enqueued work: {op.last_enqueued}, "
                            f"last completed work: {op.last_completed}")
        if dumped is None:
            self._log(op, 667, "Stack trace of the failed collective not found, potentially "
                               "because FlightRecorder is disabled. You can enable it by "
                               "setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.")
        self._log(op, 681, f"[Rank {op.group_rank}] Some NCCL operations have failed or timed "
                           "out. Due to the asynchronous nature of CUDA kernels, subsequent GPU "
                           "operations might run on corrupted/incomplete data.")
        if self.handling.async_mode == 2:  # clean up only: the next wait raises
            return DistBackendError(op.caught)
        self._log(op, 695, f"[Rank {op.group_rank}] To avoid data inconsistency, we are taking "
                           "the entire process down.")
        terminated = f"{op.pg_prefix} Process group watchdog thread terminated with exception: " \
                     f"{op.caught}"
        self._log(op, 1895, terminated)
        stream = self._stream or sys.stderr
        stream.write("terminate called after throwing an instance of 'c10::DistBackendError'\n"
                     f"  what():  {terminated}\n")
        stream.flush()
        self._on_fatal(op.caught)
        os.abort()
