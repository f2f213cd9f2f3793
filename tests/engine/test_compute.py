"""Compute models: per-rank gaps against timelines worked out by hand, seeded
draws, and the default model against the engine's own gaps.

Every op costs COST = 0.1 s.  Rank numbering is row-major over the mesh: in
a (dp=2, tp=2) mesh, rank = 2·dp + tp.
"""

import numpy as np
import pytest
from hypothesis import given, settings

from prism_debug.engine import GraphCompute
from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph.execution import ExecutionGraph, Mesh
from tests.engine.test_replay import (
    constant_cost,
    perturb,
    pipeline_graph,
    pipeline_jobs,
    tp_then_dp_graph,
)


class StretchedRanks:
    """The graph's gaps, but some ranks compute other gaps before some events
    of some iterations: ``{(iteration, event): {rank: gap}}``."""

    def __init__(self, graph: ExecutionGraph, changes: dict[tuple[int, int], dict[int, float]]):
        self.graph = graph
        self.changes = changes

    def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
        mesh = self.graph.mesh
        class_axis = mesh.axis(self.graph.class_axis) if self.graph.class_axis else None
        gaps = list(base_gaps_s)
        for (at_iteration, event), per_rank in self.changes.items():
            ranks = {r: gap for r, gap in per_rank.items() if self.graph.class_of(r) == class_id}
            if at_iteration == iteration and ranks:
                gaps[event] = np.full(shape, base_gaps_s[event])
                for rank, gap in ranks.items():
                    coords = list(mesh.coordinates(rank))
                    if class_axis is not None:
                        del coords[class_axis]
                    gaps[event][tuple(coords)] = gap
        return gaps


class Jitter:
    """Every rank's gaps drawn around the graph's (lognormal, σ = 0.2), from
    the engine's generator: a stand-in for fitted per-op distributions."""

    def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
        return [base * rng.lognormal(0.0, 0.2, size=shape) for base in base_gaps_s]


class SameAsGraph:
    """The graph's gaps, as arrays over the class's ranks."""

    def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
        return [np.full(shape, base) for base in base_gaps_s]


def pipeline_of(dp: int) -> ExecutionGraph:
    """:func:`pipeline_graph` (two stages, TP and stage-to-stage ops) on pp=2 × dp × tp=2."""
    return ExecutionGraph(mesh=Mesh((2, dp, 2), ("pp", "dp", "tp")),
                          families={"tp": ("tp",), "dp": ("dp",), "pp": ("pp",)},
                          class_axis="pp", programs=pipeline_graph().programs, gpus_per_node=8)


def all_times(engine: ReplayEngine) -> list[float]:
    return [t for rank in range(engine.mesh.world_size) for t in engine.iteration_times(rank)]


@pytest.mark.parametrize("compress", [True, False])
def test_one_ranks_longer_compute_delays_its_tp_group_then_its_dp_groups(compress):
    # Iteration 2: rank 0 computes 2 s (not 1) before the TP all-reduce, and
    # rank 3 computes 1.5 s (not 0.5) before the iteration ends.
    #   it 2 from 2.7: TP {0,1} 4.7 → 4.8, TP {2,3} 3.8; DP {0,2} and {1,3}
    #   5.8 → 5.9; ends at 6.4, rank 3 at 7.4.
    #   it 3: TP {2,3} waits for rank 3: 8.4 → 8.5, TP {0,1} 7.5; DP {0,2}
    #   and {1,3} wait for ranks 2, 3: 9.5 → 9.6; every rank ends at 10.1.
    graph = tp_then_dp_graph()
    model = StretchedRanks(graph, {(2, 0): {0: 2.0}, (2, 4): {3: 1.5}})
    engine = ReplayEngine(graph, constant_cost, record=True, compress=compress, compute=model)
    engine.run(4)
    assert [engine.iteration_times(rank) for rank in range(4)] == [
        pytest.approx([2.7, 3.7, 3.7, 2.7])] * 3 + [pytest.approx([2.7, 4.7, 2.7, 2.7])]
    done = [{op: d for op, (_, d, _) in engine.op_times(rank, 3).items()} for rank in range(4)]
    assert done == [{0: pytest.approx(7.5), 1: pytest.approx(9.6)}] * 2 \
        + [{0: pytest.approx(8.5), 1: pytest.approx(9.6)}] * 2


def test_slow_multiplies_a_models_per_rank_gaps():
    # Iteration 2, rank 0 slowed ×2 and computing 2 s before TP: 4 s.
    #   TP {0,1} 6.7 → 6.8, TP {2,3} 3.8; rank 0 then 2 s: DP {0,2} 8.8 → 8.9,
    #   DP {1,3} 7.8 → 7.9; ends: rank 0 9.9, rank 2 9.4, ranks 1, 3 8.4.
    #   it 3: TP {0,1} 10.9 → 11.0, TP {2,3} 10.4 → 10.5; DP 12.0 → 12.1; all end 12.6.
    graph = tp_then_dp_graph()
    engine = ReplayEngine(graph, constant_cost, compute=StretchedRanks(graph, {(2, 0): {0: 2.0}}))
    engine.slow([0], 2.0, first_iteration=2, iterations=1)
    engine.run(3)
    assert [engine.iteration_times(rank)[1:] for rank in range(4)] == [
        pytest.approx([7.2, 2.7]), pytest.approx([5.7, 4.2]), pytest.approx([6.7, 3.2]),
        pytest.approx([5.7, 4.2])]


def test_a_late_column_is_set_apart_and_the_rest_stay_shared():
    # dp is the columns' axis.  Rank 11 (stage 0, dp column 5, tp 1) computes
    # 2 s (not 1) before its TP all-reduce in iteration 2: from 1.2, TP 3.2 →
    # 3.3, the send to stage 1 (which posted its recv at 2.3) 3.4; stage 1
    # then 4.4 → TP 4.5.  Iteration 3 is back to 1.2 s everywhere.
    graph = pipeline_of(dp=64)
    engine = ReplayEngine(graph, constant_cost,
                          compute=StretchedRanks(graph, {(2, 0): {2 * 5 + 1: 2.0}}))
    engine.run(1)
    assert engine.class_shape == (2, 1)
    engine.run(3)
    assert engine.class_shape == (2, 2)  # column 5, and one for the other 63
    assert engine.iteration_times(2 * 5) == pytest.approx([1.2, 2.2, 1.2])
    assert engine.iteration_times(2 * 6) == pytest.approx([1.2, 1.2, 1.2])
    assert engine.iteration_times(2 * 64 + 2 * 5 + 1) == pytest.approx([2.3, 2.2, 1.2])
    assert engine.iteration_times(2 * 64 + 2 * 63) == pytest.approx([2.3, 1.2, 1.2])


@pytest.mark.parametrize("compress", [True, False])
def test_a_seeded_model_replays_bit_for_bit_and_another_seed_differs(compress):
    graph = pipeline_of(dp=4)
    runs = {}
    for seed in (7, 7, 8):
        engine = ReplayEngine(graph, constant_cost, compress=compress, compute=Jitter(), seed=seed)
        engine.slow([3], 1.5)
        engine.run(3)
        runs.setdefault(seed, []).append(all_times(engine))
    assert runs[7][0] == runs[7][1]
    assert runs[7][0] != runs[8][0]
    assert len(set(runs[7][0])) > 4  # the ranks' times differ


def test_draws_do_not_depend_on_how_the_replay_is_driven():
    graph = pipeline_of(dp=4)
    at_once = ReplayEngine(graph, constant_cost, compute=Jitter(), seed=3)
    at_once.run(4)
    in_steps = ReplayEngine(graph, constant_cost, compute=Jitter(), seed=3)
    for iterations in (1, 2, 4):
        in_steps.run(iterations)
    assert all_times(in_steps) == all_times(at_once)


def test_compression_keeps_a_random_models_timeline():
    times = []
    for compress in (True, False):
        engine = ReplayEngine(pipeline_of(dp=4), constant_cost, compress=compress,
                              compute=Jitter(), seed=1)
        engine.run(3)
        times.append(all_times(engine))
    assert times[0] == pytest.approx(times[1], rel=1e-12)


def test_the_graph_model_is_the_default():
    graph = pipeline_of(dp=4)
    engines = [ReplayEngine(graph, constant_cost, record=True, compute=compute)
               for compute in (None, GraphCompute())]
    for engine in engines:
        engine.slow([1], 2.0)
        engine.delay([2 * 4 + 3], 0.25, family="tp")
        engine.run(3)
    assert all_times(engines[0]) == all_times(engines[1])
    records = [[(r.class_id, r.iteration, r.op, np.array(r.done).tolist()) for r in e.records]
               for e in engines]
    assert records[0] == records[1]


def test_a_model_must_answer_one_gap_per_event_over_the_class():
    class TooFew:
        def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
            return base_gaps_s[1:]

    class WrongShape:
        def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
            return [np.zeros((3,) * len(shape))] * len(base_gaps_s)

    with pytest.raises(ValueError, match="5 events of class 0 in iteration 1"):
        ReplayEngine(tp_then_dp_graph(), constant_cost, compute=TooFew())
    engine = ReplayEngine(tp_then_dp_graph(), constant_cost, compute=WrongShape())
    with pytest.raises(ValueError, match=r"mesh \(2, 2\), got shape \(3, 3\)"):
        engine.run(1)


def test_scalar_gaps_keep_the_fast_path():
    class Halved:
        def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
            return [gap / 2 for gap in base_gaps_s]

    engine = ReplayEngine(tp_then_dp_graph(), constant_cost, compute=Halved())
    engine.run(2)
    assert engine.iteration_times(3) == pytest.approx([1.45, 1.45])
    assert isinstance(engine._states[0].t, float)


@settings(max_examples=60, deadline=None)
@given(pipeline_jobs())
def test_the_graphs_gaps_as_arrays_give_the_graphs_timeline(job):
    graph, before, after = job
    times = []
    for compute in (None, SameAsGraph()):
        engine = ReplayEngine(graph, constant_cost, compute=compute)
        perturb(engine, before)
        engine.run(1)
        perturb(engine, after)
        engine.run(3)
        times.append(all_times(engine))
    assert times[0] == pytest.approx(times[1], rel=1e-12)
