"""The replay engine behind the backend's seam: groups checked against the graph."""

import pytest

from prism_debug.engine.graph_engine import GraphEngine
from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph import GraphError, GroupRef
from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec


def graph_engine(real_rank):
    program = ClassProgram(0, (OpSpec("all_reduce", "tp", 64),), (),
                           (Event("issue", 1.0, 0), Event("wait", 0.0, 0), Event("end", 0.0)))
    graph = ExecutionGraph(mesh=Mesh((2, 4), ("dp", "tp")),
                           families={"tp": ("tp",), "dp": ("dp",)}, class_axis=None,
                           programs=(program,), gpus_per_node=8)
    return GraphEngine(graph, ReplayEngine(graph, lambda op, placement: 0.1,
                                           real_rank=real_rank))


def test_a_group_of_the_graphs_shape_is_accepted():
    engine = graph_engine(real_rank=5)
    assert engine.group([4, 5, 6, 7], GroupRef("tp", 1)).family == "tp"


def test_a_group_of_the_right_size_but_other_ranks_is_refused():
    engine = graph_engine(real_rank=5)
    with pytest.raises(GraphError) as info:
        engine.group([1, 3, 5, 7], GroupRef("tp", 1))
    assert str(info.value) == (
        "family 'tp': rank 5's group is [1, 3, 5, 7] in the script and [4, 5, 6, 7] in the graph")


def test_skipping_an_op_is_refused_at_the_iteration_end():
    engine = graph_engine(real_rank=5)
    with pytest.raises(GraphError, match="ended iteration 1 without issuing all_reduce of 64 "
                                         "bytes on tp"):
        engine.iteration_end()


def test_who_arrived_last_outlives_the_iteration_when_kept():
    """The console's timeline asks after the iteration ended, when the replay
    engine no longer knows: kept at the iteration's end, it is the answer the
    run table gave (rank 7, slowed to arrive at 6.0)."""
    for keep, expected in ((False, None), (True, (7, pytest.approx(6.0)))):
        engine = graph_engine(real_rank=5)
        engine.keep_last_arrivals = keep
        engine.replay.slow([7], 6.0)
        stream = engine.group([4, 5, 6, 7], GroupRef("tp", 1))
        deferred = engine.collective(stream, "all_reduce", 64, arrival=1.0)
        assert deferred() == pytest.approx(6.1)
        # while the iteration runs, the replay engine knows either way: the run table
        assert engine.last_arrival(deferred) == (7, pytest.approx(6.0))
        engine.iteration_end()
        assert engine.last_arrival(deferred) == expected
