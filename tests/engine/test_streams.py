"""Stream order in the replay engine: a process group's ops run one after the
other (ProcessGroupNCCL: one communicator, one stream per group), worked out
by hand and against a plain per-rank replay.

Every op costs COST; rank = 2·dp + tp in a (dp=2, tp=2) mesh.
"""

import dataclasses
import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings

from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph.execution import ClassProgram, ExecutionGraph, GraphError, Mesh, OpSpec
from tests.engine.test_replay import COST, constant_cost, end, issue, one_class_jobs, wait

TP, DP = OpSpec("all_reduce", "tp", 64), OpSpec("all_reduce", "dp", 64)


def one_class(ops, events, mesh=((2, 2), ("dp", "tp"))):
    return ExecutionGraph(mesh=Mesh(*mesh), families={"tp": ("tp",), "dp": ("dp",)},
                          class_axis=None, programs=(ClassProgram(0, ops, (), tuple(events)),),
                          gpus_per_node=4)


def buckets_graph(num_buckets, gap):
    """1 s of compute, then ``num_buckets`` DP all-reduces issued ``gap`` apart
    (DDP's buckets), waited for together."""
    events = [issue(0, 1.0)] + [issue(i, gap) for i in range(1, num_buckets)]
    events += [wait(i) for i in range(num_buckets)] + [end()]
    return one_class((DP,) * num_buckets, events)


def test_an_all_reduce_issued_before_the_previous_one_ends_starts_at_its_end():
    engine = ReplayEngine(buckets_graph(2, 0.05), constant_cost)
    engine.run(2)
    # the first ends at 1.1; the second arrives at 1.05 and runs 1.1-1.2
    # (overlapping, as before streams, it would end at 1.15)
    assert engine.iteration_times(0) == pytest.approx([1.2, 1.2])


def test_an_all_reduce_issued_after_the_previous_one_ended_starts_at_once():
    engine = ReplayEngine(buckets_graph(2, 0.3), constant_cost)
    engine.run(1)
    assert engine.iteration_times(0) == pytest.approx([1.4])  # 1.3 + 0.1


def test_ops_of_different_groups_do_not_queue_behind_each_other():
    graph = one_class((TP, DP), [issue(0, 1.0), issue(1, 0.05), wait(0), wait(1), end()])
    engine = ReplayEngine(graph, constant_cost, record=True)
    engine.run(1)
    assert [done for _, _, done in engine.ops_of(0, 1)] == pytest.approx([1.1, 1.15])
    assert engine.iteration_times(0) == pytest.approx([1.15])


def test_a_straggler_holds_its_group_and_the_queue_behind_it():
    engine = ReplayEngine(buckets_graph(3, 0.02), constant_cost, record=True)
    engine.slow([0], 2.0)
    engine.run(1)
    # DP group {0, 2}: rank 0 arrives at 2.0, 2.04, 2.08; the ops run
    # 2.0-2.1, 2.1-2.2, 2.2-2.3.  DP group {1, 3} is untouched: 1.1, 1.2, 1.3.
    assert [done for _, _, done in engine.ops_of(2, 1)] == pytest.approx([2.1, 2.2, 2.3])
    assert [done for _, _, done in engine.ops_of(3, 1)] == pytest.approx([1.1, 1.2, 1.3])
    assert [engine.iteration_times(r)[0] for r in range(4)] == pytest.approx([2.3, 1.3, 2.3, 1.3])


def test_a_group_spanning_classes_queues_its_ops_too():
    world = OpSpec("all_reduce", "world", 8)
    stage0 = ClassProgram(0, (world, world), (),
                          (issue(0, 1.0), issue(1, 0.01), wait(0), wait(1), end()))
    stage1 = ClassProgram(1, (world, world), (),
                          (issue(0, 2.0), issue(1, 0.01), wait(0), wait(1), end()))
    graph = ExecutionGraph(mesh=Mesh((2, 2), ("pp", "dp")), families={"world": ("pp", "dp")},
                           class_axis="pp", programs=(stage0, stage1), gpus_per_node=8)
    engine = ReplayEngine(graph, constant_cost)
    engine.run(2)
    # stage 1 arrives last at 2.0 and 2.01: 2.0-2.1, then 2.1-2.2
    assert engine.iteration_times(0) == pytest.approx([2.2, 2.2])


def test_the_real_rank_waits_for_its_buckets_one_after_the_other():
    graph = buckets_graph(3, 0.02)
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    handles = [engine.real_issue(DP, arrival) for arrival in (1.0, 1.02, 1.04)]
    assert [engine.real_completion(h) for h in handles] == pytest.approx([1.1, 1.2, 1.3])


def test_a_real_rank_late_for_its_first_bucket_delays_the_rest():
    graph = buckets_graph(2, 0.02)
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    first = engine.real_issue(DP, 1.5)  # its peer, rank 1, arrives at 1.0 and 1.02
    second = engine.real_issue(DP, 1.52)
    assert engine.real_completion(first) == pytest.approx(1.6)
    assert engine.real_completion(second) == pytest.approx(1.7)


# -- against a plain per-rank replay ---------------------------------------------------


def plain_iteration_times(graph: ExecutionGraph, slow, iterations: int) -> list[float]:
    """Every rank's iteration times worked out rank by rank over the whole
    mesh, with no shortcut: each group's op starts at max(its last member's
    arrival, the end of the group's previous op) and takes COST."""
    program = graph.programs[0]
    factor = np.ones(graph.mesh.shape)
    for rank, value in slow:
        factor.flat[rank] *= value
    t = np.zeros(graph.mesh.shape)
    free: dict[str, np.ndarray] = {}
    starts = [t]
    for _ in range(iterations):
        done = {}
        for event in program.events(1):
            t = t + event.gap_s * factor
            if event.action == "issue":
                op = program.ops[event.op]
                last = t.max(axis=graph.family_axes(op.family), keepdims=True)
                free[op.family] = np.maximum(last, free.get(op.family, -math.inf)) + COST
                done[event.op] = np.broadcast_to(free[op.family], t.shape)
            elif event.action == "wait":
                t = np.maximum(t, done[event.op])
        starts.append(t)
    return [float(b.flat[r] - a.flat[r]) for r in range(graph.world_size)
            for a, b in pairwise(starts)]


@settings(max_examples=80, deadline=None)
@given(one_class_jobs())
def test_every_shortcut_gives_the_plain_per_rank_timeline_with_streams(job):
    graph, slow = job
    expected = plain_iteration_times(graph, slow, 3)
    for record, compress, shortcut in ((False, True, True), (True, True, True),
                                       (False, False, True), (False, True, False)):
        engine = ReplayEngine(graph, constant_cost, record=record, compress=compress)
        if not shortcut:  # every wait takes max(now, done) rank by rank
            engine._loop._factor_top = lambda state: math.inf
        for rank, factor in slow:
            engine.slow([rank], factor)
        engine.run(3)
        times = [t for r in range(graph.world_size) for t in engine.iteration_times(r)]
        assert times == pytest.approx(expected, rel=1e-9, abs=1e-12)


# -- point to point --------------------------------------------------------------------


def two_stages(stage0, stage1, ops0, ops1, stages=2):
    programs = [ClassProgram(0, ops0, (), tuple(stage0)), ClassProgram(1, ops1, (), tuple(stage1))]
    return ExecutionGraph(mesh=Mesh((stages,), ("pp",)), families={"pp": ("pp",)},
                          class_axis="pp", programs=tuple(programs), gpus_per_node=8)


SEND, RECV = OpSpec("send", "pp", 64, peer=1), OpSpec("recv", "pp", 64, peer=1)
SEND_BACK, RECV_BACK = OpSpec("send", "pp", 64, peer=-1), OpSpec("recv", "pp", 64, peer=-1)


def batched(op, gap=0.0, batch=1):
    return dataclasses.replace(issue(op, gap), batch=batch)


def exchange(stage0_issues, stage1_issues):
    """Stage 0 sends X to stage 1 and receives Y from it, stage 1 receives X
    and sends Y; each computes 1 s first and waits for both at the end."""
    return two_stages([*stage0_issues, wait(0), wait(1), end()],
                      [*stage1_issues, wait(0), wait(1), end()],
                      (SEND, RECV), (RECV_BACK, SEND_BACK))


def test_a_send_then_a_recv_with_one_peer_run_one_after_the_other():
    engine = ReplayEngine(exchange([issue(0, 1.0), issue(1)], [issue(0, 1.0), issue(1)]),
                          constant_cost, record=True)
    engine.run(1)
    # X runs 1.0-1.1 on the pair's stream; Y, issued at 1.0 too, runs 1.1-1.2
    assert [done for _, _, done in engine.ops_of(0, 1)] == pytest.approx([1.1, 1.2])
    assert engine.iteration_times(1) == pytest.approx([1.2])


def test_a_batch_of_a_send_and_a_recv_with_one_peer_runs_together():
    # as a pipeline's 1F1B step: each stage sends first and receives second,
    # which issued alone would wait for each other for ever (NCCL deadlocks)
    graph = exchange([batched(0, 1.0), batched(1)], [batched(1, 1.0), batched(0)])
    engine = ReplayEngine(graph, constant_cost, record=True)
    engine.run(2)
    assert [done for _, _, done in engine.ops_of(1, 1)] == pytest.approx([1.1, 1.1])
    assert engine.iteration_times(0) == pytest.approx([1.1, 1.1])


def test_lone_ops_crossing_on_one_pair_never_complete_as_in_nccl():
    graph = exchange([issue(0, 1.0), issue(1)], [issue(1, 1.0), issue(0)])
    with pytest.raises(GraphError, match="the replay cannot progress"):
        ReplayEngine(graph, constant_cost).run(1)


def test_a_batch_ends_with_its_last_op_and_the_next_batch_starts_then():
    # stage 0: batch 1 sends X at 1.0; batch 2 sends Z at 1.0 (unwaited sends)
    # stage 1: batch 1 receives X at 1.5, batch 2 receives Z at 1.0 + 0.5
    ops0 = (SEND, SEND)
    ops1 = (RECV_BACK, RECV_BACK)
    graph = two_stages([batched(0, 1.0, 1), batched(1, 0.0, 2), wait(0), wait(1), end()],
                       [batched(0, 1.5, 1), batched(1, 0.0, 2), wait(0), wait(1), end()],
                       ops0, ops1)
    engine = ReplayEngine(graph, constant_cost, record=True)
    engine.run(1)
    # X: 1.5-1.6; Z waits for batch 1 on both sides: 1.6-1.7
    assert [done for _, _, done in engine.ops_of(0, 1)] == pytest.approx([1.6, 1.7])


def test_lone_ops_to_different_peers_run_together():
    # three stages: the middle one sends to both neighbours at 1.0
    middle = ClassProgram(1, (SEND, SEND_BACK), (),
                          (issue(0, 1.0), issue(1), wait(0), wait(1), end()))
    first = ClassProgram(0, (RECV,), (), (issue(0, 1.0), wait(0), end()))
    last = ClassProgram(2, (RECV_BACK,), (), (issue(0, 1.0), wait(0), end()))
    graph = ExecutionGraph(mesh=Mesh((3,), ("pp",)), families={"pp": ("pp",)},
                           class_axis="pp", programs=(first, middle, last), gpus_per_node=8)
    engine = ReplayEngine(graph, constant_cost)
    engine.run(1)
    assert [engine.iteration_times(r)[0] for r in range(3)] == pytest.approx([1.1, 1.1, 1.1])


def test_a_straggler_delays_the_pair_and_the_queue_behind_it():
    engine = ReplayEngine(exchange([issue(0, 1.0), issue(1)], [issue(0, 1.0), issue(1)]),
                          constant_cost, record=True)
    engine.slow([1], 2.0)  # stage 1 issues both at 2.0
    engine.run(1)
    assert [done for _, _, done in engine.ops_of(0, 1)] == pytest.approx([2.1, 2.2])


def test_the_real_rank_in_a_batch_completes_with_the_batch():
    graph = exchange([batched(0, 1.0), batched(1)], [batched(1, 1.0), batched(0)])
    engine = ReplayEngine(graph, constant_cost, real_rank=1)
    send = engine.real_issue(SEND_BACK, 1.5)  # its peer, stage 0, issues at 1.0
    assert engine.real_completion(send) == math.inf  # the batch is not launched yet
    recv = engine.real_issue(RECV_BACK, 1.6)
    assert engine.real_completion(send) == pytest.approx(1.7)
    assert engine.real_completion(recv) == pytest.approx(1.7)
    assert engine.last_arrival(recv) == (1, pytest.approx(1.6))
