"""The watchdog's behaviour per torch's error-handling settings, and its log
lines word for word (ProcessGroupNCCL's)."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest
from torch.distributed import DistBackendError

from prism_debug.backend.watchdog import ErrorHandling, TimedOutOp, Watchdog

OP = TimedOutOp(global_rank=4097, group_rank=1, pg_id=2, seq=3, op="all_reduce",
                numel_in=1024, numel_out=1024, timeout_ms=600000, ran_for_ms=600000,
                last_enqueued=3, last_completed=2)
CAUGHT = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
          "OpType=ALLREDUCE, NumelIn=1024, NumelOut=1024, Timeout(ms)=600000) ran for 600000 "
          "milliseconds before timing out.")
_PREFIX = re.compile(r"^\[rank4097\]:\[E\d{4} \d\d:\d\d:\d\d\.\d{9} ProcessGroupNCCL\.cpp:\d+\] ")


def lines(stream: io.StringIO) -> list[str]:
    return [_PREFIX.sub("", line) for line in stream.getvalue().splitlines()]


@pytest.mark.parametrize("env, expected", [
    ({}, ErrorHandling(False, 3)),
    ({"TORCH_NCCL_BLOCKING_WAIT": "1"}, ErrorHandling(True, 3)),
    ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, ErrorHandling(False, 0)),
    ({"NCCL_ASYNC_ERROR_HANDLING": "2"}, ErrorHandling(False, 2)),
])
def test_error_handling_follows_torchs_variables(env, expected):
    assert ErrorHandling.from_env(env) == expected


def test_blocking_wait_raises_from_wait():
    stream = io.StringIO()
    error = Watchdog(ErrorHandling(True, 3), stream=stream).expired(OP)
    assert isinstance(error, DistBackendError) and str(error) == CAUGHT
    assert lines(stream) == [CAUGHT]


def test_no_handling_logs_and_lets_the_op_hang():
    stream = io.StringIO()
    assert Watchdog(ErrorHandling(False, 0), stream=stream).expired(OP) is None
    assert lines(stream) == [CAUGHT]


def test_clean_up_only_raises_at_the_next_wait_after_the_watchdogs_lines():
    stream = io.StringIO()
    error = Watchdog(ErrorHandling(False, 2), stream=stream,
                     dump_flight_record=lambda op: "/tmp/fr_4097").expired(OP)
    assert isinstance(error, DistBackendError)
    assert lines(stream) == [
        CAUGHT,
        "[PG ID 2 PG GUID 2 Rank 1]  failure detected by watchdog at work sequence id: 3 PG "
        "status: last enqueued work: 3, last completed work: 2",
        "[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
        "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
    ]


def test_the_default_takes_the_process_down_with_sigabrt():
    code = ("from prism_debug.backend.watchdog import *\n"
            f"op = {OP!r}\n"
            "Watchdog(ErrorHandling(False, 3)).expired(op)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -6  # SIGABRT, as torch's std::terminate
    got = [_PREFIX.sub("", line) for line in proc.stderr.splitlines()]
    assert got == [
        CAUGHT,
        "[PG ID 2 PG GUID 2 Rank 1]  failure detected by watchdog at work sequence id: 3 PG "
        "status: last enqueued work: 3, last completed work: 2",
        "Stack trace of the failed collective not found, potentially because FlightRecorder is "
        "disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero "
        "value.",
        "[Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
        "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        "[Rank 1] To avoid data inconsistency, we are taking the entire process down.",
        f"[PG ID 2 PG GUID 2 Rank 1] Process group watchdog thread terminated with exception: "
        f"{CAUGHT}",
        "terminate called after throwing an instance of 'c10::DistBackendError'",
        f"  what():  [PG ID 2 PG GUID 2 Rank 1] Process group watchdog thread terminated with "
        f"exception: {CAUGHT}",
    ]
