"""StochasticCompute: which gaps it draws (rules by class and op kind, later
rules winning, zero gaps never), their distribution (against with_cv's
closed forms), the same seed giving the same gaps, warm-up iterations, the
per-rank factor, and the replay engine meeting the expected maximum of
normals (a closed form) through it."""

import math

import numpy as np
import pytest

from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph.execution import ClassProgram, ExecutionGraph, Mesh, OpSpec
from prism_debug.variability import parse_variability
from prism_debug.variability.model import StochasticCompute
from prism_debug.variability.order_stats import expected_max_normal, std_max_normal
from tests.engine.test_replay import constant_cost, end, issue, pipeline_graph, wait

SHAPE = (64, 8)


def ddp_graph(world: int, warmup=()) -> ExecutionGraph:
    """One class: 1 s of compute, an all-reduce over every rank, 0.25 s, the end."""
    ops = (OpSpec("all_reduce", "dp", 1 << 20),)
    return ExecutionGraph(mesh=Mesh((world,), ("dp",)), families={"dp": ("dp",)},
                          class_axis=None, gpus_per_node=8,
                          programs=(ClassProgram(0, ops, warmup,
                                                 (issue(0, 1.0), wait(0), end(0.25))),))


def gaps(compute, class_id, iteration, graph, seed=0, shape=SHAPE):
    """The model's answer; floats beside arrays stacked into one block (as
    the engine lays them out)."""
    program = graph.programs[class_id]
    base = tuple(e.gap_s for e in program.events(iteration))
    out = compute.gaps_s(class_id, iteration, base, shape, np.random.default_rng(seed))
    if isinstance(out, list):
        return np.stack([np.broadcast_to(np.asarray(g, dtype=float), shape) for g in out])
    return out


def test_gaps_of_host_overhead_stay_floats_beside_drawn_arrays():
    # 5 µs between two ops is the host issuing them: it does not vary (and
    # stays a float: the engine's scalar fast path); 10 µs and more does
    ops = (OpSpec("all_reduce", "dp", 64),)
    events = (issue(0, 5e-6), wait(0, 1e-5), end(0.3))
    graph = ExecutionGraph(mesh=Mesh((4,), ("dp",)), families={"dp": ("dp",)}, class_axis=None,
                           programs=(ClassProgram(0, ops, (), events),), gpus_per_node=8)
    out = StochasticCompute(graph, parse_variability(["cv=0.1"])).gaps_s(
        0, 1, (5e-6, 1e-5, 0.3), (4,), np.random.default_rng(0))
    assert out[0] == 5e-6 and out[0].__class__ is float
    assert [type(g) for g in out[1:]] == [np.ndarray, np.ndarray]
    assert len(set(out[1].tolist())) == 4 and len(set(out[2].tolist())) == 4


def test_every_nonzero_gap_varies_with_the_stated_cv():
    graph = ddp_graph(8)
    out = gaps(StochasticCompute(graph, parse_variability(["cv=0.1"])), 0, 1, graph,
               shape=(400, 500))
    assert out.shape == (3, 400, 500)
    assert np.all(out[1] == 0.0)  # the wait's gap is 0: never drawn
    n = out[0].size
    for row, base in ((0, 1.0), (2, 0.25)):
        # lognormal with mean 1, cv 0.1: 5 standard errors of the mean and the std
        assert abs(out[row].mean() / base - 1) < 5 * 0.1 / math.sqrt(n)
        assert abs(out[row].std() / base - 0.1) < 5 * 0.1 * math.sqrt((2 + 0.27) / (4 * n))
    assert abs(np.corrcoef(out[0].ravel(), out[2].ravel())[0, 1]) < 5 / math.sqrt(n)


def test_same_seed_same_gaps_other_seed_other_gaps():
    graph = pipeline_graph()
    compute = StochasticCompute(graph, parse_variability(["cv=0.05 dist=gamma"]))
    assert np.array_equal(gaps(compute, 0, 4, graph, seed=9), gaps(compute, 0, 4, graph, seed=9))
    assert not np.array_equal(gaps(compute, 0, 4, graph, seed=9),
                              gaps(compute, 0, 4, graph, seed=10))


def test_rules_choose_classes_and_ops_later_rules_win():
    graph = pipeline_graph()  # class 0: 1 s before its all_reduce; class 1: 1 s before its
    base1 = tuple(e.gap_s for e in graph.programs[1].steady)
    only_one = StochasticCompute(graph, parse_variability(["class=1 cv=0.1"]))
    assert gaps(only_one, 0, 1, graph) == (1.0, 0.0, 0.0, 0.0, 0.0)  # untouched: the tuple
    assert np.asarray(gaps(only_one, 1, 1, graph)).std(axis=(1, 2)).tolist()[2] > 0
    assert gaps(only_one, 1, 1, graph)[0].tolist() == np.zeros(SHAPE).tolist()
    overridden = StochasticCompute(graph, parse_variability(["cv=0.1", "class=1 cv=0"]))
    assert gaps(overridden, 1, 1, graph) == base1
    by_op = StochasticCompute(graph, parse_variability(["op=send cv=0.1"]))
    assert gaps(by_op, 0, 1, graph) == (1.0, 0.0, 0.0, 0.0, 0.0)  # the send's gaps are 0


def test_mixed_families_keep_deterministic_rows_exact():
    ops = (OpSpec("all_reduce", "dp", 64), OpSpec("broadcast", "dp", 64))
    events = (issue(0, 1.0), wait(0, 0.5), issue(1, 2.0), wait(1, 0.1), end(0.3))
    graph = ExecutionGraph(mesh=Mesh((4,), ("dp",)), families={"dp": ("dp",)}, class_axis=None,
                           programs=(ClassProgram(0, ops, (), events),), gpus_per_node=8)
    compute = StochasticCompute(graph, parse_variability(
        ["op=all_reduce cv=0.1 dist=normal", "op=broadcast cv=0.2 dist=gamma"]))
    out = gaps(compute, 0, 1, graph, shape=(200, 100))
    assert out.shape == (5, 200, 100)
    assert np.all(out[4] == 0.3)  # op=end has no rule: the graph's gap, exactly
    for row, base, cv in ((0, 1.0, 0.1), (1, 0.5, 0.1), (2, 2.0, 0.2), (3, 0.1, 0.2)):
        assert out[row].mean() / base == pytest.approx(1, abs=5 * cv / math.sqrt(20_000))
        assert out[row].std() / base == pytest.approx(cv, rel=0.05)


def test_warmup_follows_cv_rules():
    warmup = ((issue(0, 3.0), wait(0), end(0.0)),)
    graph = ddp_graph(8, warmup)
    compute = StochasticCompute(graph, parse_variability(["cv=0.1"]))
    first = gaps(compute, 0, 1, graph)
    assert first.shape == (3, *SHAPE) and first[0].mean() == pytest.approx(3.0, rel=0.02)
    assert np.all(first[2] == 0.0)
    assert gaps(compute, 0, 2, graph)[2].mean() == pytest.approx(0.25, rel=0.02)


def test_rank_factors_are_persistent_per_class():
    graph = pipeline_graph()
    compute = StochasticCompute(graph, parse_variability(["cv=0.01", "class=1 rank-cv=0.2"]))
    assert compute.rank_factors(0, SHAPE, np.random.default_rng(0)) is None
    factors = compute.rank_factors(1, (500, 400), np.random.default_rng(0))
    assert factors.shape == (500, 400) and np.all(factors > 0)
    assert factors.mean() == pytest.approx(1, abs=5 * 0.2 / math.sqrt(factors.size))
    assert factors.std() == pytest.approx(0.2, rel=0.03)
    plain = StochasticCompute(graph, parse_variability(["cv=0.1"]))
    assert plain.rank_factors(0, SHAPE, np.random.default_rng(0)) is None


def test_a_variability_the_graph_lacks_is_refused_when_built():
    with pytest.raises(Exception, match="class 5 is not in the graph"):
        StochasticCompute(pipeline_graph(), parse_variability(["class=5 cv=0.1"]))


def test_the_engine_waits_for_the_expected_maximum_of_normals():
    """A DDP step of 8 ranks, compute iid normal(1 s, 0.1 s): the all-reduce
    starts at the max of 8 draws, whose mean is 1 + 0.1 × 1.4236 (E[max of 8
    standard normals], a closed form to 4 digits); each iteration ends 0.25 s
    (not drawn: the rule covers the all-reduce's gaps) after the all-reduce's cost."""
    graph = ddp_graph(8)
    engine = ReplayEngine(graph, constant_cost, seed=5,
                          compute=StochasticCompute(graph, parse_variability(
                              ["op=all_reduce cv=0.1 dist=normal"])))
    iterations = 2000
    engine.run(iterations)
    times = np.asarray(engine.iteration_times(0))
    assert len(times) == iterations
    expected = 1 + 0.1 * 1.4236003 + 0.1 + 0.25  # max of the compute, the op's cost, the end
    assert expected_max_normal(8, 1.0, 0.1) == pytest.approx(1 + 0.1 * 1.4236003, abs=1e-7)
    # 5 standard errors of the mean (the max of 8 normals has std 0.1 × 0.6107)
    assert abs(times.mean() - expected) < 5 * std_max_normal(8, 1.0, 0.1) / math.sqrt(iterations)
    again = ReplayEngine(graph, constant_cost, seed=5, compute=StochasticCompute(
        graph, parse_variability(["op=all_reduce cv=0.1 dist=normal"])))
    again.run(iterations)
    assert again.iteration_times(3) == engine.iteration_times(3)  # same seed, same timeline


def test_fitted_draws_each_gap_from_its_fit_and_leaves_the_rest():
    import dataclasses

    from prism_debug.graph import GapFit

    warmup = ((issue(0, 3.0), wait(0), end(0.5)),)
    graph = dataclasses.replace(ddp_graph(8, warmup), gap_fits={0: (
        GapFit("gamma", (4.0, 0.0, 0.25), 0.05, 10, "op"), None, None)})
    compute = StochasticCompute(graph, parse_variability(["fitted"]))
    assert gaps(compute, 0, 1, graph) == (3.0, 0.0, 0.5)  # warm-up: nothing was fitted
    out = gaps(compute, 0, 2, graph, shape=(400, 500))
    assert np.all(out[2] == 0.25)  # no fit: the graph's gap
    n = out[0].size  # gamma(4, scale 0.25): mean 1, std 0.5, excess kurtosis 6/4
    assert abs(out[0].mean() - 1.0) < 5 * 0.5 / math.sqrt(n)
    assert abs(out[0].std() - 0.5) < 5 * 0.5 * math.sqrt((1.5 + 2) / (4 * n))
    # a later cv rule overrides the fits where it covers
    both = StochasticCompute(graph, parse_variability(["fitted", "op=end cv=0.1"]))
    assert gaps(both, 0, 2, graph, shape=(400, 500))[2].std() == pytest.approx(0.025, rel=0.05)
