"""The replay engine against timelines worked out by hand.

Every op costs COST; gaps are in seconds.  Rank numbering is row-major over
the mesh: in a (dp=2, tp=2) mesh, rank = 2·dp + tp.
"""

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.engine.analysis import critical_path
from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph.execution import (
    ClassProgram,
    Event,
    ExecutionGraph,
    GraphError,
    Mesh,
    OpSpec,
)

COST = 0.1


def constant_cost(op, placement):
    return COST


def issue(op, gap=0.0):
    return Event("issue", gap, op)


def wait(op, gap=0.0):
    return Event("wait", gap, op)


def end(gap=0.0):
    return Event("end", gap)


def tp_then_dp_graph(gpus_per_node=4):
    """One class on (dp=2, tp=2): 1 s compute, TP all-reduce, 1 s, DP all-reduce, 0.5 s."""
    ops = (OpSpec("all_reduce", "tp", 64), OpSpec("all_reduce", "dp", 64))
    events = (issue(0, 1.0), wait(0), issue(1, 1.0), wait(1), end(0.5))
    return ExecutionGraph(
        mesh=Mesh((2, 2), ("dp", "tp")), families={"tp": ("tp",), "dp": ("dp",)},
        class_axis=None, programs=(ClassProgram(0, ops, (), events),),
        gpus_per_node=gpus_per_node)


def pipeline_graph():
    """Two stages on (pp=2, tp=2).  Stage 0: 1 s, TP all-reduce, send to stage 1.
    Stage 1: receive from stage 0, 1 s, TP all-reduce."""
    stage0 = ClassProgram(0, (OpSpec("all_reduce", "tp", 64), OpSpec("send", "pp", 64, peer=1)),
                          (), (issue(0, 1.0), wait(0), issue(1), wait(1), end()))
    stage1 = ClassProgram(1, (OpSpec("recv", "pp", 64, peer=-1), OpSpec("all_reduce", "tp", 64)),
                          (), (issue(0), wait(0), issue(1, 1.0), wait(1), end()))
    return ExecutionGraph(mesh=Mesh((2, 2), ("pp", "tp")), families={"tp": ("tp",), "pp": ("pp",)},
                          class_axis="pp", programs=(stage0, stage1), gpus_per_node=8)


def test_an_unperturbed_class_stays_on_the_scalar_fast_path():
    engine = ReplayEngine(tp_then_dp_graph(), constant_cost)
    engine.run(3)
    assert engine.iteration_times(3) == pytest.approx([2.7, 2.7, 2.7])
    assert isinstance(engine._states[0].t, float)


def test_a_straggler_delays_its_tp_group_then_its_dp_groups():
    engine = ReplayEngine(tp_then_dp_graph(), constant_cost)
    engine.slow([0], 2.0)
    engine.run(1)
    # rank 0 computes 2 s: TP {0,1} done 2.1, TP {2,3} 1.1.  Then rank 0 4.1,
    # rank 1 3.1, ranks 2/3 2.1: DP {0,2} done 4.2, DP {1,3} done 3.2.  Then 0.5 s
    # (1 s for rank 0).
    assert [engine.iteration_times(r)[0] for r in range(4)] == pytest.approx([5.2, 3.7, 4.7, 3.7])


def test_a_straggler_in_another_pipeline_stage_delays_by_the_chain():
    engine = ReplayEngine(pipeline_graph(), constant_cost)
    engine.run(1)
    base = [engine.iteration_times(r)[0] for r in range(4)]
    assert base == pytest.approx([1.2, 1.2, 2.3, 2.3])
    slowed = ReplayEngine(pipeline_graph(), constant_cost)
    slowed.slow([0], 3.0)  # stage 0, tp rank 0: 2 s late into its TP all-reduce
    slowed.run(1)
    times = [slowed.iteration_times(r)[0] for r in range(4)]
    # stage 0 sends at 3.1 (after TP), stage 1 receives at 3.2, computes, TP: 4.3
    assert times == pytest.approx([3.2, 3.2, 4.3, 4.3])
    assert times[3] - base[3] == pytest.approx(2.0)  # rank 3 shares no group with rank 0


def test_a_late_real_rank_delays_its_groups_and_everything_downstream():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3, record=True)
    tp_op, dp_op = graph.programs[0].ops
    handle = engine.real_issue(tp_op, arrival=1.5)  # virtual peers arrive at 1.0
    assert engine.real_completion(handle) == pytest.approx(1.6)
    handle = engine.real_issue(dp_op, arrival=2.6)
    assert engine.real_completion(handle) == pytest.approx(2.7)
    engine.real_iteration_end()
    # rank 0 never shares a group with rank 3 in TP, but its DP group waits for
    # rank 2, whom rank 3 held up: 2.7 + 0.5
    assert engine.iteration_times(0) == pytest.approx([3.2])


def test_the_real_rank_must_follow_the_graph():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=1)
    with pytest.raises(GraphError) as info:
        engine.real_issue(OpSpec("all_gather", "tp", 64), arrival=1.0)
    assert str(info.value) == (
        "the script does not follow the graph: in iteration 1 rank 1 issued all_gather of 64 "
        "bytes on tp where the graph has all_reduce of 64 bytes on tp")


def test_a_failed_peer_never_lets_its_groups_complete():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    engine.fail([2], at_iteration=1)
    handle = engine.real_issue(graph.programs[0].ops[0], arrival=1.0)
    assert engine.real_completion(handle) == math.inf


def test_a_degraded_link_slows_only_groups_that_cross_it():
    # two GPUs per node: TP groups stay inside a node, DP groups cross nodes 0-1
    engine = ReplayEngine(tp_then_dp_graph(gpus_per_node=2), constant_cost)
    engine.link([1], bandwidth_factor=0.5)
    engine.run(1)
    assert engine.iteration_times(0) == pytest.approx([1 + COST + 1 + 2 * COST + 0.5])


def test_a_delay_on_one_family_holds_only_its_ops():
    engine = ReplayEngine(tp_then_dp_graph(), constant_cost)
    engine.delay([1], 0.25, family="dp")
    engine.run(1)
    assert [engine.iteration_times(r)[0] for r in range(4)] == pytest.approx(
        [2.7, 2.95, 2.7, 2.95])


def test_a_world_collective_across_classes_waits_for_every_stage():
    stage0 = ClassProgram(0, (OpSpec("all_reduce", "world", 8),), (),
                          (issue(0, 1.0), wait(0), end()))
    stage1 = ClassProgram(1, (OpSpec("all_reduce", "world", 8),), (),
                          (issue(0, 3.0), wait(0), end()))
    graph = ExecutionGraph(mesh=Mesh((2, 2), ("pp", "dp")),
                           families={"world": ("pp", "dp")}, class_axis="pp",
                           programs=(stage0, stage1), gpus_per_node=8)
    engine = ReplayEngine(graph, constant_cost)
    engine.run(2)
    assert engine.iteration_times(0) == pytest.approx([3.1, 3.1])


def test_p2p_inside_a_class_pairs_each_rank_with_its_neighbour():
    ops = (OpSpec("send", "tp", 8, peer=1), OpSpec("recv", "tp", 8, peer=-1))
    program = ClassProgram(0, ops, (), (issue(0, 1.0), issue(1), wait(0), wait(1), end()))
    graph = ExecutionGraph(mesh=Mesh((4,), ("tp",)), families={"tp": ("tp",)},
                           class_axis=None, programs=(program,), gpus_per_node=8)
    engine = ReplayEngine(graph, constant_cost)
    engine.slow([1], 2.0)
    engine.run(1)
    # rank 1 sends at 2.0 to rank 2 (done 2.1) and receives from rank 0 at
    # max(1, 2) + 0.1 = 2.1; rank 0's send to 1 also completes at 2.1
    assert [engine.iteration_times(r)[0] for r in range(4)] == pytest.approx([2.1, 2.1, 2.1, 1.1])


def test_a_link_degrades_groups_spanning_degraded_nodes_not_those_inside_one():
    # two GPUs per node: TP groups stay inside a node; DP groups span nodes 0
    # and 1, both degraded, so their traffic crosses a degraded NIC
    engine = ReplayEngine(tp_then_dp_graph(gpus_per_node=2), constant_cost)
    engine.link([0, 1], bandwidth_factor=0.5)
    engine.run(1)
    assert engine.iteration_times(0) == pytest.approx([1 + COST + 1 + 2 * COST + 0.5])


def test_a_link_degrades_p2p_towards_a_degraded_receiver():
    # pp=2 x tp=2 with two GPUs per node: stage 0 on node 0, stage 1 on node 1
    graph = dataclasses.replace(pipeline_graph(), gpus_per_node=2)
    engine = ReplayEngine(graph, constant_cost)
    engine.link([1], bandwidth_factor=0.5)
    engine.run(1)
    # the send to node 1 costs 0.2; TP inside node 1 stays 0.1
    assert [engine.iteration_times(r)[0] for r in range(4)] == pytest.approx(
        [1.3, 1.3, 2.4, 2.4])


def test_slowing_ranks_mid_iteration_applies_to_the_rest_of_it():
    # stage 0: compute, TP all-reduce, send, compute, TP all-reduce
    tp = OpSpec("all_reduce", "tp", 64)
    stage0 = ClassProgram(0, (tp, OpSpec("send", "pp", 64, peer=1), tp), (),
                          (issue(0, 1.0), wait(0), issue(1), wait(1), issue(2, 1.0), wait(2),
                           end()))
    stage1 = ClassProgram(1, (tp, OpSpec("recv", "pp", 64, peer=-1)), (),
                          (issue(0), wait(0), issue(1), wait(1), end()))
    graph = dataclasses.replace(pipeline_graph(), programs=(stage0, stage1))
    engine = ReplayEngine(graph, constant_cost, real_rank=2)
    engine.slow([0], 2.0)
    engine.real_completion(engine.real_issue(tp, arrival=0.5))  # stage 0 sends at 2.1 …
    engine.slow([1], 4.0)  # … and waits for this receive, its next TP group's max known
    recv = engine.real_issue(stage1.ops[1], arrival=1.0)
    assert engine.real_completion(recv) == pytest.approx(2.2)
    engine.real_iteration_end()
    # after the send, rank 1 computes 4 s, not the 1 s (or 2 s) known before
    assert engine.iteration_times(0)[0] == pytest.approx(2.2 + 4.0 + COST)


def test_the_real_rank_may_wait_for_an_op_after_its_iteration_ends():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    tp_op, dp_op = graph.programs[0].ops
    tp_handle = engine.real_issue(tp_op, arrival=1.0)
    dp_handle = engine.real_issue(dp_op, arrival=2.0)
    engine.real_iteration_end()
    # rank 1 reaches DP at 2.1 (TP done 1.1, then 1 s): DP {1, 3} done 2.2
    assert engine.real_completion(dp_handle) == pytest.approx(2.2)
    assert engine.real_completion(tp_handle) == pytest.approx(1.1)


def test_the_real_rank_must_send_to_the_peer_the_graph_names():
    engine = ReplayEngine(pipeline_graph(), constant_cost, real_rank=2)
    with pytest.raises(GraphError) as info:
        engine.real_issue(OpSpec("recv", "pp", 64, peer=1), arrival=0.0)
    assert str(info.value) == (
        "the script does not follow the graph: in iteration 1 rank 2 issued recv of 64 bytes "
        "with the rank +1 along pp where the graph has recv of 64 bytes with the rank -1 "
        "along pp")


def test_the_real_rank_may_not_skip_ops_of_its_iteration():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    engine.real_issue(graph.programs[0].ops[0], arrival=1.0)
    with pytest.raises(GraphError) as info:
        engine.real_iteration_end()
    assert str(info.value) == (
        "the script does not follow the graph: rank 3 ended iteration 1 without issuing "
        "all_reduce of 64 bytes on dp, which the graph has next")


def test_classes_must_agree_on_a_collective_they_share():
    stage0 = ClassProgram(0, (OpSpec("all_reduce", "world", 8),), (), (issue(0), wait(0), end()))
    stage1 = ClassProgram(1, (OpSpec("all_reduce", "world", 16),), (), (issue(0), wait(0), end()))
    graph = ExecutionGraph(mesh=Mesh((2, 2), ("pp", "dp")), families={"world": ("pp", "dp")},
                           class_axis="pp", programs=(stage0, stage1), gpus_per_node=8)
    with pytest.raises(GraphError) as info:
        ReplayEngine(graph, constant_cost).run(1)
    assert str(info.value) == (
        "the classes disagree on collective 1 of iteration 1 on world: class 0 issues "
        "all_reduce of 8 bytes on world; class 1 issues all_reduce of 16 bytes on world")


def test_a_send_and_its_recv_must_agree_on_bytes():
    graph = pipeline_graph()
    stage1 = dataclasses.replace(graph.programs[1], ops=(
        OpSpec("recv", "pp", 32, peer=-1), OpSpec("all_reduce", "tp", 64)))
    graph = dataclasses.replace(graph, programs=(graph.programs[0], stage1))
    with pytest.raises(GraphError) as info:
        ReplayEngine(graph, constant_cost).run(1)
    assert str(info.value) == (
        "send 1 of iteration 1 from class 0 to class 1 on pp carries 64 bytes but the "
        "matching recv expects 32")


def test_the_last_arrival_at_a_world_collective_may_be_in_another_stage():
    stage = ClassProgram(0, (OpSpec("all_reduce", "world", 8),), (),
                         (issue(0, 1.0), wait(0), end()))
    graph = ExecutionGraph(mesh=Mesh((2, 2), ("pp", "dp")), families={"world": ("pp", "dp")},
                           class_axis="pp",
                           programs=(stage, dataclasses.replace(stage, class_id=1)),
                           gpus_per_node=8)
    engine = ReplayEngine(graph, constant_cost, real_rank=1)
    engine.slow([3], 6.0)
    handle = engine.real_issue(stage.ops[0], arrival=1.0)
    assert engine.real_completion(handle) == pytest.approx(6.1)
    assert engine.last_arrival(handle) == (3, pytest.approx(6.0))


def test_the_last_arrival_at_a_receive_is_its_sender():
    engine = ReplayEngine(pipeline_graph(), constant_cost, real_rank=2)
    handle = engine.real_issue(OpSpec("recv", "pp", 64, peer=-1), arrival=0.0)
    assert engine.real_completion(handle) == pytest.approx(1.2)
    assert engine.last_arrival(handle) == (0, pytest.approx(1.1))


def test_graph_round_trips_through_its_file_and_rejects_other_versions(tmp_path):
    graph = pipeline_graph()
    path = tmp_path / "g.prism"
    graph.save(path)
    assert ExecutionGraph.load(path) == graph
    data = graph.to_dict() | {"version": 99}
    with pytest.raises(GraphError, match="graph format version 99; this prism-debug reads "
                                         "versions 1, 2, 3: profile the job again"):
        ExecutionGraph.from_dict(data)
    # version 1 recorded no batches: read without point-to-point ops only
    with pytest.raises(GraphError, match="graph format version 1 does not record which "
                                         "point-to-point ops form one batch"):
        ExecutionGraph.from_dict(graph.to_dict() | {"version": 1})
    old = tp_then_dp_graph()
    assert ExecutionGraph.from_dict(old.to_dict() | {"version": 1}) == old
    (tmp_path / "junk").write_text("not gzip")
    with pytest.raises(GraphError, match="is not a prism-debug graph file"):
        ExecutionGraph.load(tmp_path / "junk")


@st.composite
def one_class_jobs(draw):
    dp, tp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 4]))
    num_ops = draw(st.integers(1, 6))
    ops = tuple(OpSpec("all_reduce", draw(st.sampled_from(["tp", "dp", "world"])), 64)
                for _ in range(num_ops))
    # Ops may be issued back to back before their waits (DDP's buckets), with
    # gaps shorter than an op: they queue on their group's stream.
    events, unwaited = [], []
    for i in range(num_ops):
        events.append(issue(i, draw(st.floats(0, 2) | st.floats(0, 2 * COST))))
        unwaited.append(i)
        for _ in range(draw(st.integers(0, len(unwaited)))):
            events.append(wait(unwaited.pop(0), draw(st.floats(0, 1))))
    events += [wait(i, draw(st.floats(0, 1))) for i in unwaited]
    events.append(end(draw(st.floats(0, 1))))
    graph = ExecutionGraph(mesh=Mesh((dp, tp), ("dp", "tp")),
                           families={"tp": ("tp",), "dp": ("dp",), "world": ("dp", "tp")},
                           class_axis=None, programs=(ClassProgram(0, ops, (), tuple(events)),),
                           gpus_per_node=2)
    slow = draw(st.lists(st.tuples(st.integers(0, dp * tp - 1), st.floats(1, 4)), max_size=3))
    return graph, slow


@settings(max_examples=60, deadline=None)
@given(one_class_jobs())
def test_no_collective_completes_before_its_last_member_and_replays_repeat(job):
    graph, slow = job

    def replay():
        engine = ReplayEngine(graph, constant_cost, record=True)
        for rank, factor in slow:
            engine.slow([rank], factor)
        engine.run(2)
        return engine

    first, second = replay(), replay()
    previous = {}  # family -> the done of its last op: a group's ops run in issue order
    for record in first.records:
        op = graph.programs[0].ops[record.op]
        arrival = np.broadcast_to(record.arrival, graph.mesh.shape)
        axes = graph.family_axes(op.family)
        last = np.broadcast_to(arrival.max(axis=axes, keepdims=True), graph.mesh.shape)
        done = np.broadcast_to(record.done, graph.mesh.shape)
        assert np.all(done >= last + COST - 1e-9)
        assert np.all(done >= previous.get(op.family, -math.inf) + COST - 1e-9)
        previous[op.family] = done
    assert [(r.op, r.iteration, np.array(r.done).tolist()) for r in first.records] == [
        (r.op, r.iteration, np.array(r.done).tolist()) for r in second.records]


@settings(max_examples=60, deadline=None)
@given(one_class_jobs())
def test_the_lazy_fast_path_gives_the_timeline_of_full_per_rank_arrivals(job):
    graph, slow = job
    times = []
    for record in (True, False):  # recording forms every per-rank arrival
        engine = ReplayEngine(graph, constant_cost, record=record)
        for rank, factor in slow:
            engine.slow([rank], factor)
        engine.run(3)
        times.append([t for r in range(graph.world_size) for t in engine.iteration_times(r)])
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_the_last_arrival_at_a_real_rank_op_names_the_straggler():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    engine.slow([0], 2.0)
    tp_op, dp_op = graph.programs[0].ops
    assert engine.real_completion(engine.real_issue(tp_op, arrival=1.0)) == pytest.approx(1.1)
    handle = engine.real_issue(dp_op, arrival=2.1)
    # DP group {1, 3}: rank 1 waited for rank 0 in TP (done 2.1) then computed 1 s
    assert engine.real_completion(handle) == pytest.approx(3.2)
    assert engine.last_arrival(handle) == (1, pytest.approx(3.1))


def test_recorded_ops_of_a_virtual_rank():
    engine = ReplayEngine(tp_then_dp_graph(), constant_cost, record=True)
    engine.slow([0], 2.0)
    engine.run(1)
    assert [(spec.family, arrival, done) for spec, arrival, done in engine.ops_of(0, 1)] == [
        ("tp", pytest.approx(2.0), pytest.approx(2.1)), ("dp", pytest.approx(4.1),
                                                        pytest.approx(4.2))]


def unwaited_isend_graph():
    """Stage 0 computes 1 s and isends to stage 1 without ever waiting on it."""
    stage0 = ClassProgram(0, (OpSpec("send", "pp", 64, peer=1),), (), (issue(0, 1.0), end()))
    stage1 = ClassProgram(1, (OpSpec("recv", "pp", 64, peer=-1),), (),
                          (issue(0), wait(0), end()))
    return ExecutionGraph(mesh=Mesh((2,), ("pp",)), families={"pp": ("pp",)},
                          class_axis="pp", programs=(stage0, stage1), gpus_per_node=8)


def test_a_send_nobody_waits_for_still_pairs_after_its_iteration_ended():
    engine = ReplayEngine(unwaited_isend_graph(), constant_cost)
    engine.run(3)
    # stage 1 receives stage 0's k-th send at k·1.0 + 0.1
    assert engine.iteration_times(1) == pytest.approx([1.1, 1.0, 1.0])


def test_a_class_that_never_blocks_does_not_run_away_from_the_real_rank():
    graph = unwaited_isend_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=1)
    handle = engine.real_issue(graph.programs[1].ops[0], arrival=0.5)
    assert engine.real_completion(handle) == pytest.approx(1.1)
    assert engine._states[0].iteration <= 3


@st.composite
def pipeline_jobs(draw):
    """Two stages on pp x dp x tp with TP, DP and stage-to-stage ops, and
    perturbations to apply before the replay and after its first iteration."""
    dp, tp = draw(st.integers(1, 6)), draw(st.sampled_from([1, 2]))
    tp_op, dp_op = OpSpec("all_reduce", "tp", 64), OpSpec("all_reduce", "dp", 64)
    gaps, short = st.floats(0, 2), st.floats(0, 2 * COST)  # waits about as long as an op
    # two DP all-reduces back to back (DDP's buckets): the second may queue
    # behind the first on the DP group's stream
    # a lone p2p op or a batch of one: on its pair's stream or the group's batches'
    send = dataclasses.replace(issue(1, draw(gaps)), batch=draw(st.sampled_from([0, 1])))
    recv = dataclasses.replace(issue(0, draw(gaps)), batch=draw(st.sampled_from([0, 1])))
    stage0 = ClassProgram(0, (tp_op, OpSpec("send", "pp", 64, peer=1), dp_op, dp_op), (), (
        issue(0, draw(gaps)), wait(0, draw(short)), send, issue(2, draw(gaps)),
        issue(3, draw(short)), wait(1, draw(short)), wait(2, draw(short)), wait(3, draw(short)),
        end(draw(gaps))))
    stage1 = ClassProgram(1, (OpSpec("recv", "pp", 64, peer=-1), tp_op, dp_op, dp_op), (), (
        recv, wait(0, draw(short)), issue(1, draw(gaps)), wait(1, draw(short)),
        issue(2, draw(gaps)), issue(3, draw(short)), wait(2, draw(short)), wait(3, draw(short)),
        end(draw(gaps))))
    graph = ExecutionGraph(mesh=Mesh((2, dp, tp), ("pp", "dp", "tp")),
                           families={"tp": ("tp",), "dp": ("dp",), "pp": ("pp",)},
                           class_axis="pp", programs=(stage0, stage1), gpus_per_node=2)
    ranks = st.integers(0, 2 * dp * tp - 1)
    perturbation = st.one_of(
        st.tuples(st.just("slow"), ranks, st.floats(1, 4)),
        st.tuples(st.just("delay"), ranks, st.floats(0, 1)),
        st.tuples(st.just("link"), st.integers(0, dp * tp - 1), st.floats(0.25, 1)))
    return graph, draw(st.lists(perturbation, max_size=3)), draw(st.lists(perturbation,
                                                                         max_size=2))


def perturb(engine, perturbations):
    for kind, target, value in perturbations:
        if kind == "slow":
            engine.slow([target], value)
        elif kind == "delay":
            engine.delay([target], value)
        else:
            engine.link([target], bandwidth_factor=value)


@settings(max_examples=80, deadline=None)
@given(pipeline_jobs())
def test_compressed_columns_give_the_timeline_of_every_column(job):
    graph, before, after = job
    times = []
    for compress in (True, False):
        engine = ReplayEngine(graph, constant_cost, compress=compress)
        perturb(engine, before)
        engine.run(1)
        perturb(engine, after)  # columns set apart mid-replay
        engine.run(3)
        times.append([t for r in range(graph.world_size) for t in engine.iteration_times(r)])
    assert times[0] == pytest.approx(times[1], rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(pipeline_jobs())
def test_waits_shorter_than_their_op_give_the_timeline_of_per_rank_maxima(job):
    graph, before, after = job
    times = []
    for shortcut in (True, False):
        engine = ReplayEngine(graph, constant_cost)
        if not shortcut:  # every wait takes max(now, done) rank by rank
            engine._loop._factor_top = lambda state: math.inf
        perturb(engine, before)
        engine.run(1)
        perturb(engine, after)
        engine.run(3)
        times.append([t for r in range(graph.world_size) for t in engine.iteration_times(r)])
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_untouched_columns_share_one_array_column():
    graph = ExecutionGraph(mesh=Mesh((2, 64, 2), ("pp", "dp", "tp")),
                           families={"tp": ("tp",), "dp": ("dp",), "pp": ("pp",)},
                           class_axis="pp", programs=pipeline_graph().programs, gpus_per_node=8)
    engine = ReplayEngine(graph, constant_cost, real_rank=2 * 5 + 1)  # dp column 5
    engine.slow([2 * 64 + 2 * 9], 2.0)  # stage 1, dp column 9
    assert engine.class_shape == (2, 3)  # columns 5, 9 and one for the other 62
    handle = engine.real_issue(OpSpec("all_reduce", "tp", 64), arrival=1.0)
    assert engine.real_completion(handle) == pytest.approx(1.1)
    assert engine.iteration_starts(2 * 63) == [0.0]


def ring_graph(gpus_per_node=8):
    ops = (OpSpec("send", "tp", 8, peer=1), OpSpec("recv", "tp", 8, peer=-1))
    program = ClassProgram(0, ops, (), (issue(0, 1.0), issue(1), wait(0), wait(1), end()))
    return ExecutionGraph(mesh=Mesh((4,), ("tp",)), families={"tp": ("tp",)},
                          class_axis=None, programs=(program,), gpus_per_node=gpus_per_node)


def test_a_degraded_link_costs_each_ring_pair_that_crosses_it():
    # nodes {0, 1} and {2, 3}; node 1 degraded: the pairs 1→2 and 3→0 cross it
    engine = ReplayEngine(ring_graph(gpus_per_node=2), constant_cost, record=True)
    engine.link([1], bandwidth_factor=0.5)
    engine.run(1)
    done = [{spec.kind: d for spec, _, d in engine.ops_of(rank, 1)} for rank in range(4)]
    assert [d["recv"] for d in done] == pytest.approx([1.2, 1.1, 1.2, 1.1])
    assert [d["send"] for d in done] == pytest.approx([1.1, 1.2, 1.1, 1.2])


def test_the_last_arrival_in_a_ring_wraps_around():
    graph = ring_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=0)
    engine.real_issue(graph.programs[0].ops[0], arrival=1.0)
    handle = engine.real_issue(graph.programs[0].ops[1], arrival=1.0)
    assert engine.last_arrival(handle) == (3, pytest.approx(1.0))


def test_the_critical_path_runs_through_a_send_nobody_waits_for():
    path = critical_path(unwaited_isend_graph(), constant_cost)
    assert [(s.class_id, s.what, s.duration_s) for s in path] == [
        (0, "compute", pytest.approx(1.0)), (1, "recv on pp", pytest.approx(COST))]


def test_slowing_a_rank_leaves_the_compute_it_already_did_at_its_old_pace():
    graph = tp_then_dp_graph()
    tp_op, dp_op = graph.programs[0].ops
    completions = []
    for shortcut in (True, False):
        engine = ReplayEngine(graph, constant_cost, real_rank=3)
        if not shortcut:
            engine._loop._factor_top = lambda state: math.inf
        engine.real_issue(tp_op, arrival=1.0)  # rank 1 arrived at 1.0: TP done 1.1
        engine.slow([1], 10.0)
        completions.append(engine.real_completion(engine.real_issue(dp_op, arrival=2.1)))
    # rank 1 then computes 1 s × 10: DP {1, 3} at 11.1 + COST
    assert completions == [pytest.approx(11.2), pytest.approx(11.2)]


@pytest.mark.parametrize("compress", [True, False])
def test_ties_for_the_last_arrival_go_to_the_lowest_rank(compress):
    graph = ExecutionGraph(mesh=Mesh((4, 2), ("dp", "tp")), families={"tp": ("tp",),
                                                                       "dp": ("dp",)},
                           class_axis=None, programs=tp_then_dp_graph().programs,
                           gpus_per_node=8)
    tp_op, dp_op = graph.programs[0].ops
    engine = ReplayEngine(graph, constant_cost, real_rank=5, compress=compress)
    engine.real_issue(tp_op, arrival=1.0)
    handle = engine.real_issue(dp_op, arrival=2.1)  # every DP member arrives at 2.1
    assert engine.last_arrival(handle) == (1, pytest.approx(2.1))


def test_a_negative_delay_is_refused():
    with pytest.raises(ValueError, match="a delay cannot be negative, got -1"):
        ReplayEngine(tp_then_dp_graph(), constant_cost).delay([0], -1)
