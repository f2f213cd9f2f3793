"""Futures and waits on ops whose completion the replay engine learns later.

The real rank (rank 0, pipeline stage 0 of two, tp=2) posts a receive for the
gradient of stage 1 *before* it sends stage 1 the activation that gradient
needs, in one ``batch_isend_irecv``: when the receive is issued,
the engine cannot say when it completes.  By hand, with every op costing
COST and emulated times counted from the real rank's first arrival ``a``:

* send issued at a + 1 (after 1 s of compute): stage 1 posted its receive at
  0, so the activation arrives at a + 1 + COST;
* stage 1 computes 1 s and sends the gradient at a + 2 + COST: the receive
  completes at a + 2 + 2·COST, and with it the batch (its send too: NCCL's
  group completes as one).
"""

from __future__ import annotations

import datetime
import io
import math
import threading
import time

import pytest
import torch

from prism_debug.backend.process_group import PrismProcessGroup
from prism_debug.backend.runtime import Runtime
from prism_debug.backend.tracker import IterationTracker
from prism_debug.backend.values import Values
from prism_debug.backend.watchdog import ErrorHandling, Watchdog
from prism_debug.engine import EmulatedClock
from prism_debug.engine.graph_engine import GraphEngine
from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph import FamilyRecorder, GroupRef
from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec

COST = 0.01
GAP = 0.05  # compute between the receive and the send (stage 0) and in stage 1


def pipeline() -> ExecutionGraph:
    recv, send = OpSpec("recv", "pp", 64, peer=1), OpSpec("send", "pp", 64, peer=1)
    stage0 = ClassProgram(0, (recv, send), (), (
        # one batch_isend_irecv: lone on the pair's stream, the receive would
        # hold the send back for good (as NCCL's stream would)
        Event("issue", 0.0, 0, batch=1), Event("issue", GAP, 1, batch=1), Event("wait", 0.0, 1),
        Event("wait", 0.0, 0), Event("end", 0.0)))
    back_recv, back_send = OpSpec("recv", "pp", 64, peer=-1), OpSpec("send", "pp", 64, peer=-1)
    stage1 = ClassProgram(1, (back_recv, back_send), (), (
        Event("issue", 0.0, 0), Event("wait", 0.0, 0), Event("issue", GAP, 1),
        Event("wait", 0.0, 1), Event("end", 0.0)))
    return ExecutionGraph(mesh=Mesh((2, 2), ("pp", "tp")), families={"pp": ("pp",)},
                          class_axis="pp", programs=(stage0, stage1), gpus_per_node=8)


class FakeWatchdog:
    """Records what the watchdog is told (the real one may end the process)."""

    def __init__(self) -> None:
        self.expired_ops = []

    def expired(self, op):
        self.expired_ops.append(op)
        return RuntimeError(op.caught)


def runtime(timeout_s: float, watchdog=None) -> tuple[Runtime, PrismProcessGroup]:
    graph = pipeline()
    replay = ReplayEngine(graph, lambda op, placement: COST, real_rank=0)
    clock = EmulatedClock()
    rt = Runtime(rank=0, world_size=4, clock=clock, engine=GraphEngine(graph, replay),
                 values=Values("mirror", 0),
                 tracker=IterationTracker(clock.now(), lambda record: None, False),
                 families=FamilyRecorder(4), collective_timeout_s=timeout_s,
                 watchdog=watchdog or FakeWatchdog())
    pg = PrismProcessGroup(rt, [0, 2], GroupRef("pp", 0), datetime.timedelta(seconds=600),
                           "nccl")
    return rt, pg


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_future_unknown_at_issue_completes_when_the_engine_learns_it():
    rt, pg = runtime(timeout_s=1.0)
    recv = pg.recv([torch.zeros(16)], 1)
    assert recv.done == math.inf  # the gradient needs the send still to come
    future = recv.get_future()
    assert rt.completer.unknown  # watched, not dropped
    spin(GAP)
    send = pg.send([torch.ones(16)], 1)
    assert not rt.completer.unknown  # the send's advance answered it
    a = recv.arrival
    assert send.arrival - a >= GAP  # the compute between them is the job's time
    assert recv.known == pytest.approx(send.arrival + GAP + 2 * COST)
    assert send.done == pytest.approx(recv.known)  # one batch: it completes as one
    future.wait()
    # completed at its emulated time, not before, and with no watchdog
    assert rt.clock.now() >= recv.known
    assert rt.clock.now() - recv.known < 0.02
    assert rt.watchdog.expired_ops == []
    rt.completer.close()


def test_a_future_unknown_past_its_deadline_is_a_real_timeout():
    # the send comes 0.05 s after the receive; with a 0.02 s timeout the
    # receive cannot have completed by its deadline: the watchdog is right
    rt, pg = runtime(timeout_s=0.02)
    recv = pg.recv([torch.zeros(16)], 1)
    future = recv.get_future()
    spin(GAP)
    assert [op.op for op in rt.watchdog.expired_ops] == ["recv"]
    pg.send([torch.ones(16)], 1)
    future.wait()  # its handling let it go on: it completes once known
    assert rt.clock.now() >= recv.known
    rt.completer.close()


def test_a_wait_on_an_unknown_completion_blocks_until_another_thread_advances_the_engine():
    rt, pg = runtime(timeout_s=1.0)
    recv = pg.recv([torch.zeros(16)], 1)
    waited = threading.Thread(target=recv.wait)
    waited.start()
    spin(GAP)
    assert waited.is_alive()
    pg.send([torch.ones(16)], 1)
    waited.join(timeout=5)
    assert not waited.is_alive()
    assert rt.clock.now() >= recv.known
    assert rt.watchdog.expired_ops == []
    rt.completer.close()


def test_a_coalesced_batch_completes_with_its_last_op_and_is_watched():
    rt, pg = runtime(timeout_s=1.0)
    pg._start_coalescing()
    recv = pg.recv([torch.zeros(16)], 1)
    spin(GAP)
    send = pg.send([torch.ones(16)], 1)
    batch = pg._end_coalescing()
    assert batch.group is pg and batch.deadline == pytest.approx(recv.arrival + 1.0)
    assert batch.done == pytest.approx(recv.done)
    assert batch.done == pytest.approx(send.arrival + GAP + 2 * COST)
    batch.wait()
    assert rt.clock.now() >= batch.done
    assert rt.watchdog.expired_ops == []
    rt.completer.close()


def test_a_coalesced_batch_that_never_completes_times_out_at_its_first_ops_deadline():
    rt, pg = runtime(timeout_s=0.03)
    rt.engine.replay.fail([2])  # stage 1's rank never arrives
    pg._start_coalescing()
    recv = pg.recv([torch.zeros(16)], 1)
    pg.send([torch.ones(16)], 1)
    batch = pg._end_coalescing()
    # ProcessGroupNCCL::endCoalescing makes the batch's Work with no tensors:
    # its numels stay 0 (was NumelIn=32, the batch's tensors summed: not what NCCL prints)
    with pytest.raises(RuntimeError, match="OpType=COALESCED, NumelIn=0, NumelOut=0,"):
        batch.wait()
    assert rt.clock.now() >= recv.arrival + 0.03
    assert [op.op for op in rt.watchdog.expired_ops] == ["coalesced"]
    rt.completer.close()


def test_the_default_watchdog_reports_a_coalesced_batch_as_nccl_does():
    stream = io.StringIO()
    watchdog = Watchdog(ErrorHandling(blocking_wait=True), stream=stream)
    rt, pg = runtime(timeout_s=0.01, watchdog=watchdog)
    rt.engine.replay.fail([2])
    pg._start_coalescing()
    pg.recv([torch.zeros(16)], 1)
    batch = pg._end_coalescing()
    with pytest.raises(Exception, match="Watchdog caught collective operation timeout"):
        batch.wait()
    assert "OpType=COALESCED" in stream.getvalue()
    rt.completer.close()
