"""The real rank's shortcuts (:mod:`prism_debug.engine.real`) against the
full per-rank path they stand in for: its arrival written into an array the
size of its class, and an advance before every completion asked.

Every op costs COST; rank = 2·dp + tp in a (dp=2, tp=2) mesh."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph.execution import ClassProgram, ExecutionGraph, Mesh, OpSpec
from tests.engine.test_replay import (
    constant_cost,
    end,
    issue,
    one_class_jobs,
    perturb,
    pipeline_jobs,
    tp_then_dp_graph,
    wait,
)


def drive(graph, rank, offsets, shortcuts, before=(), after=(), slow=(), iterations=3):
    """The real rank follows its program, arriving ``offsets`` (cycled)
    later than the graph's gaps say, and asks all the backend may ask: each
    op's completion as it issues it and as it waits, who arrived last.
    Returns what it was told and every rank's iteration starts."""
    engine = ReplayEngine(graph, constant_cost, real_rank=rank)
    engine._loop.real_shortcuts = shortcuts
    for target, factor in slow:
        engine.slow([target], factor)
    perturb(engine, before)
    program = graph.programs[graph.class_of(rank)]
    clock, told, k = 0.0, [], 0
    for iteration in range(1, iterations + 1):
        if iteration == 2:
            perturb(engine, after)
        handles = {}
        for event in program.events(iteration):
            clock += event.gap_s
            if event.action == "issue":
                k += 1
                handle = handles[event.op] = engine.real_issue(
                    program.ops[event.op], clock + offsets[k % len(offsets)])
                told.append(("issued", engine.real_completion(handle)))
            elif event.action == "wait":
                done = engine.real_completion(handles[event.op])
                told.append((done, engine.last_arrival(handles[event.op])))
                clock = max(clock, done)
        told.append([engine.last_arrival(h) for h in handles.values()])
        engine.real_iteration_end()
    return told, [engine.iteration_starts(r) for r in range(graph.world_size)]


# the real rank as early as its peers, earlier, later, and about one op later
offsets = st.lists(st.sampled_from([0.0, -0.05, 0.05, 0.1]) | st.floats(-1, 1),
                   min_size=1, max_size=6)


@settings(max_examples=80, deadline=None)
@given(one_class_jobs(), offsets, st.data())
def test_the_real_ranks_shortcuts_give_the_full_paths_answers_in_one_class(job, offsets, data):
    graph, slow = job
    rank = data.draw(st.integers(0, graph.world_size - 1))
    slow = slow if data.draw(st.booleans()) else ()
    fast = drive(graph, rank, offsets, True, slow=slow)
    assert fast == drive(graph, rank, offsets, False, slow=slow)  # exactly


@settings(max_examples=80, deadline=None)
@given(pipeline_jobs(), offsets, st.data())
def test_the_real_ranks_shortcuts_give_the_full_paths_answers_in_a_pipeline(job, offsets, data):
    graph, before, after = job
    rank = data.draw(st.integers(0, graph.world_size - 1))
    fast = drive(graph, rank, offsets, True, before, after)
    assert fast == drive(graph, rank, offsets, False, before, after)  # exactly


def test_a_real_rank_no_later_than_its_peers_keeps_its_class_on_the_fast_path():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    tp_op, dp_op = graph.programs[0].ops
    handle = engine.real_issue(tp_op, arrival=0.9)  # its peers arrive at 1.0
    assert engine.real_completion(handle) == pytest.approx(1.1)
    assert isinstance(engine._states[0].t, float)
    assert engine.last_arrival(handle) == (2, pytest.approx(1.0))
    handle = engine.real_issue(dp_op, arrival=2.1)  # as late as its peers: a tie
    assert engine.real_completion(handle) == pytest.approx(2.2)
    assert engine.last_arrival(handle) == (1, pytest.approx(2.1))  # the lowest rank
    engine.real_iteration_end()
    assert engine.iteration_times(0) == engine.iteration_times(3) == [pytest.approx(2.7)]


def test_a_late_real_rank_still_sets_its_groups_apart():
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, real_rank=3)
    tp_op, dp_op = graph.programs[0].ops
    assert engine.real_completion(engine.real_issue(tp_op, arrival=1.5)) == pytest.approx(1.6)
    # TP group {2, 3} waited for it; {0, 1} did not
    assert engine._states[0].done[0].ravel().tolist() == pytest.approx([1.1, 1.6])
    handle = engine.real_issue(dp_op, arrival=2.6)
    assert engine.real_completion(handle) == pytest.approx(2.7)
    assert engine.last_arrival(handle) == (3, pytest.approx(2.6))
    engine.real_iteration_end()
    # rank 2 waited in TP, then DP held ranks 0 and 1 for it and rank 3
    assert [engine.iteration_times(r) for r in range(4)] == [[pytest.approx(3.2)]] * 4


def test_a_real_rank_between_its_groups_and_the_rest_waits_for_its_own_group():
    tp_op = OpSpec("all_reduce", "tp", 64)
    graph = ExecutionGraph(
        mesh=Mesh((2, 2), ("dp", "tp")), families={"tp": ("tp",), "dp": ("dp",)},
        class_axis=None, gpus_per_node=4, programs=(ClassProgram(
            0, (tp_op, tp_op), (), (issue(0, 1.0), wait(0), issue(1, 1.0), wait(1), end())),))
    for shortcuts in (True, False):
        engine = ReplayEngine(graph, constant_cost, real_rank=3)
        engine._loop.real_shortcuts = shortcuts
        assert engine.real_completion(engine.real_issue(tp_op, 1.5)) == pytest.approx(1.6)
        # its TP peer, rank 2, arrives at 2.6, the other group at 2.1
        handle = engine.real_issue(tp_op, 2.3)
        assert engine.real_completion(handle) == pytest.approx(2.7)
        assert engine.last_arrival(handle) == (2, pytest.approx(2.6))
