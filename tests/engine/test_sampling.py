"""Every rank stochastic (:mod:`prism_debug.engine.sampling`): with every
column simulated the sampled engine is the per-rank engine; sampled, its
iteration times agree in distribution with the exact engine's and with the
closed form of a max of normals; the timeline does not depend on how the
replay is driven.

Every op costs COST = 0.1 s (tests.engine.test_replay)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from scipy import integrate, stats

from prism_debug.engine import sampling
from prism_debug.engine.replay import SAMPLE_COLUMNS, ReplayEngine
from prism_debug.graph.execution import ClassProgram, ExecutionGraph, Mesh, OpSpec
from tests.engine.test_compute import all_times, pipeline_of
from tests.engine.test_replay import (
    COST,
    constant_cost,
    end,
    issue,
    perturb,
    pipeline_jobs,
    wait,
)


class PerRankJitter:
    """Every rank's gaps drawn around the graph's (lognormal, σ = 0.2) and a
    persistent per-rank factor (lognormal, σ = 0.1): a stand-in for the
    variability package's StochasticCompute."""

    per_rank = True

    def __init__(self) -> None:
        self.shapes: list[tuple] = []

    def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
        self.shapes.append(tuple(shape))
        return [base * rng.lognormal(0.0, 0.2, size=shape) for base in base_gaps_s]

    def rank_factors(self, class_id, shape, rng):
        return rng.lognormal(0.0, 0.1, size=shape)


class NormalGaps:
    """Gap ``base × (1 + cv·Z)``, Z standard normal per rank and event, as one
    (n_events, *shape) block."""

    per_rank = True

    def __init__(self, cv: float) -> None:
        self.cv = cv

    def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
        base = np.asarray(base_gaps_s).reshape((-1,) + (1,) * len(shape))
        return base * (1.0 + self.cv * rng.standard_normal((len(base_gaps_s), *shape)))


def run_times(graph, *, compress=True, sample_columns=None, seed=0, before=(), after=(),
              iterations=3):
    engine = ReplayEngine(graph, constant_cost, compress=compress, compute=PerRankJitter(),
                          seed=seed, sample_columns=sample_columns)
    perturb(engine, before)
    engine.run(1)
    perturb(engine, after)  # columns set apart mid-replay
    engine.run(iterations)
    return all_times(engine)


def pipeline_with_dp(dp: int) -> ExecutionGraph:
    """Two stages on pp=2 × dp × tp=2: TP all-reduce, stage-to-stage p2p, a
    DP all-reduce and a world all-reduce (across the stages), uneven gaps."""
    tp_op, dp_op = OpSpec("all_reduce", "tp", 64), OpSpec("all_reduce", "dp", 64)
    world = OpSpec("all_reduce", "world", 64)
    stage0 = ClassProgram(0, (tp_op, OpSpec("send", "pp", 64, peer=1), dp_op, world), (), (
        issue(0, 1.0), wait(0), issue(1, 0.2), issue(2, 0.5), wait(1), wait(2),
        issue(3, 0.3), wait(3), end(0.2)))
    stage1 = ClassProgram(1, (OpSpec("recv", "pp", 64, peer=-1), tp_op, dp_op, world), (), (
        issue(0), wait(0), issue(1, 1.0), wait(1), issue(2, 0.5), wait(2), issue(3, 0.3),
        wait(3), end(0.2)))
    return ExecutionGraph(mesh=Mesh((2, dp, 2), ("pp", "dp", "tp")),
                          families={"tp": ("tp",), "dp": ("dp",), "pp": ("pp",),
                                    "world": ("pp", "dp", "tp")},
                          class_axis="pp", programs=(stage0, stage1), gpus_per_node=2)


# -- every column simulated: the per-rank engine, exactly ------------------------------------


@settings(max_examples=60, deadline=None)
@given(pipeline_jobs())
def test_with_every_column_sampled_the_engine_is_the_per_rank_engine(job):
    graph, before, after = job
    columns = max(graph.mesh.shape[1:])
    exact = run_times(graph, compress=False, before=before, after=after)
    sampled = run_times(graph, sample_columns=max(columns, 2), before=before, after=after)
    assert sampled == pytest.approx(exact, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("slowed", [(), ((3, 1.5), (2 * 6 * 2 - 1, 2.0))])
@pytest.mark.parametrize("make", [pipeline_of, pipeline_with_dp])
def test_pipelines_of_six_columns_sampled_whole_equal_the_per_rank_engine(make, slowed):
    graph = make(6)
    before = [("slow", rank, factor) for rank, factor in slowed]
    exact = run_times(graph, compress=False, before=before, seed=4, iterations=4)
    sampled = run_times(graph, sample_columns=6, before=before, seed=4, iterations=4)
    assert sampled == pytest.approx(exact, rel=1e-12)
    assert len(set(np.round(exact, 12))) > 10  # the ranks' times differ


def test_the_model_draws_in_the_sampled_shape_and_factors_once_per_class():
    graph = pipeline_of(dp=40)  # pp=2 × dp=40 × tp=2: columns on dp
    model = PerRankJitter()
    calls = []
    model.rank_factors = lambda class_id, shape, rng: calls.append((class_id, shape)) or None
    engine = ReplayEngine(graph, constant_cost, compute=model, sample_columns=8,
                          real_rank=2 * 17 + 1)
    engine.slow([2 * 40 + 2 * 30], 1.5)  # stage 1, column 30
    assert engine.class_shape == (2, 10)  # the sample of 8, columns 17 and 30
    handle = engine.real_issue(OpSpec("all_reduce", "tp", 64), arrival=1.0)
    _, last = engine.last_arrival(handle)  # the real rank, or its TP partner's drawn gap
    assert last >= 1.0
    assert engine.real_completion(handle) == pytest.approx(last + COST)
    assert set(model.shapes) == {(10, 2)}  # mesh order (dp, tp), dp as wide as simulated
    assert calls == [(0, (10, 2)), (1, (10, 2))]


# -- sampled: the population of unsampled columns -----------------------------------------


def ddp_graph(dp: int, gap_s: float, end_s: float = 0.0) -> ExecutionGraph:
    """One class, one dp axis: compute ``gap_s``, one all-reduce, ``end_s``, the end."""
    program = ClassProgram(0, (OpSpec("all_reduce", "dp", 1 << 20),), (),
                           (issue(0, gap_s), wait(0), end(end_s)))
    return ExecutionGraph(mesh=Mesh((dp,), ("dp",)), families={"dp": ("dp",)},
                          class_axis=None, programs=(program,), gpus_per_node=8)


def expected_max_of_normals(n: int) -> float:
    """E[max of n iid standard normals] by numerical integration."""
    density = lambda x: n * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1) * x  # noqa: E731
    return integrate.quad(density, -10, 10, limit=200)[0]


def iteration_times(graph, seed, iterations, sample_columns, cv):
    engine = ReplayEngine(graph, constant_cost, compute=NormalGaps(cv), seed=seed,
                          sample_columns=sample_columns)
    engine.run(iterations)
    return np.array(engine.iteration_times(graph.world_size // 2 + 1))


def test_a_ddp_step_over_4096_ranks_sampled_matches_the_max_of_normals_and_the_exact_engine():
    # Every iteration: each rank computes 0.1 s × (1 + 0.05·Z), then the
    # all-reduce ends COST after the last of the 4096.  Iteration time =
    # 0.1 + 0.005·max(Z_1..Z_4096) + COST, independent between iterations.
    dp, gap, cv = 4096, 0.1, 0.05
    graph = ddp_graph(dp, gap)
    sampled = np.concatenate([iteration_times(graph, seed, 200, SAMPLE_COLUMNS, cv)
                              for seed in range(5)])
    exact = np.concatenate([iteration_times(graph, seed, 200, dp, cv) for seed in range(5)])
    closed = gap + gap * cv * expected_max_of_normals(dp) + COST
    sigma = gap * cv
    noise = 0.33 * sigma / math.sqrt(len(exact))  # the max's sd is 0.33σ: 7e-5 s a side
    assert exact.mean() == pytest.approx(closed, abs=4 * noise)  # the oracle agrees
    assert sampled.mean() == pytest.approx(closed, abs=5 * noise)
    assert sampled.mean() == pytest.approx(exact.mean(), abs=6 * noise)
    # n sampled columns estimate the normal's sd to ±1/√(2(n-1)) (±10 % at 48,
    # ±9 % at 64): at q ≈ 3.6 that widens the sampled max (sd 0.48σ against
    # 0.33σ at 64) and lifts its p95 by ~0.2σ (0.5 % of this iteration); 128
    # columns bring it to 0.04σ (measured)
    p95 = gap + sigma * stats.norm.ppf(0.95 ** (1 / dp)) + COST
    assert np.percentile(exact, 95) == pytest.approx(p95, abs=0.12 * sigma)
    assert np.percentile(sampled, 95) == pytest.approx(p95 + 0.22 * sigma, abs=0.15 * sigma)
    # no population, no maxima above the sample: a clearly lower mean
    no_population = gap + gap * cv * expected_max_of_normals(SAMPLE_COLUMNS) + COST
    assert sampled.mean() - no_population > 20 * noise


def test_a_sampled_replay_repeats_and_its_unsampled_ranks_read_a_sampled_column():
    graph = ddp_graph(1000, 0.1, end_s=0.05)  # ranks end their iterations apart
    runs = [iteration_times(graph, 9, 5, 16, 0.05) for _ in range(2)]
    assert runs[0].tolist() == runs[1].tolist()
    engine = ReplayEngine(graph, constant_cost, compute=NormalGaps(0.05), seed=9,
                          sample_columns=16)
    engine.run(5)
    # the sample is columns 0-15; the unsampled ones read them in turn
    assert engine.iteration_starts(16) == engine.iteration_starts(0)
    assert engine.iteration_starts(999) == engine.iteration_starts((999 - 16) % 16)
    assert engine.iteration_starts(999) != engine.iteration_starts(0)
    assert engine.describe(500)["time_ms"] == pytest.approx(engine.iteration_times(500)[-1] * 1e3)


def test_the_last_arrival_at_a_sampled_group_may_be_an_unsampled_rank():
    graph = ddp_graph(4096, 0.1)
    engine = ReplayEngine(graph, constant_cost, compute=NormalGaps(0.05), seed=1,
                          real_rank=5, sample_columns=16)
    handle = engine.real_issue(OpSpec("all_reduce", "dp", 1 << 20), arrival=0.05)
    done = engine.real_completion(handle)
    rank, arrived = engine.last_arrival(handle)
    # 16 sampled columns (0-4, 6-16) and rank 5: 4079 unsampled, the first is 17.
    # Their max (≈ 3.5σ above the mean) beats the sample's (≈ 1.8σ) almost surely.
    assert rank == 17
    assert done == pytest.approx(arrived + COST)
    assert arrived > 0.1


# -- same seed, same timeline however driven ----------------------------------------------


def test_a_sampled_replay_followed_op_by_op_by_a_real_rank_gives_the_run_replays_times():
    graph = pipeline_with_dp(24)
    real = 2 * 24 + 2 * 13 + 1  # stage 1, column 13
    at_once = ReplayEngine(graph, constant_cost, compute=PerRankJitter(), seed=11,
                           sample_columns=6, record=True)
    at_once.slow([real], 1.0)  # keep its column apart, as the real rank's is
    at_once.run(3)
    followed = ReplayEngine(graph, constant_cost, compute=PerRankJitter(), seed=11,
                            sample_columns=6, real_rank=real)
    program = graph.programs[graph.class_of(real)]
    told, expected = [], []
    for iteration in (1, 2, 3):
        times = at_once.op_times(real, iteration)
        handles = {}
        for event in program.events(iteration):
            if event.action == "issue":
                handles[event.op] = followed.real_issue(program.ops[event.op],
                                                        times[event.op][0])
            elif event.action == "wait":
                told.append(followed.real_completion(handles[event.op]))
                expected.append(times[event.op][1])
        followed.real_iteration_end()
    assert told == pytest.approx(expected, rel=1e-12)
    for rank in range(graph.world_size):
        assert followed.iteration_times(rank)[:2] == pytest.approx(
            at_once.iteration_times(rank)[:2], rel=1e-12)


def sampled_starts(graph, before, after, seed=3):
    engine = ReplayEngine(graph, constant_cost, compute=PerRankJitter(), seed=seed,
                          sample_columns=2)
    perturb(engine, before)
    engine.run(1)
    perturb(engine, after)
    engine.run(3)
    return np.array([engine.iteration_starts(rank) for rank in range(graph.world_size)])


def population_check(graph, before=(), after=(), seed=3):
    """Every rank's iteration starts with the population, and with the same
    draws but the unsampled columns' maxima left out."""
    with_population = sampled_starts(graph, before, after, seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "unsampled_max", lambda per_column, layout, uniform: -np.inf)
        sample_only = sampled_starts(graph, before, after, seed)
    return with_population, sample_only


# The replay is max-plus: raising a group max never lets anything end sooner.


@settings(max_examples=40, deadline=None)
@given(pipeline_jobs())
def test_the_population_only_ever_delays_the_sampled_timeline(job):
    graph, before, after = job
    with_population, sample_only = population_check(graph, before, after)
    assert (with_population >= sample_only - 1e-12).all()


@pytest.mark.parametrize("seed", range(4))
def test_the_unsampled_columns_delay_a_pipeline_with_dp_and_world_ops(seed):
    with_population, sample_only = population_check(pipeline_with_dp(40), seed=seed)
    assert (with_population >= sample_only - 1e-12).all()
    assert (with_population[:, -1] > sample_only[:, -1] + 1e-3).all()  # 36 columns unseen


@pytest.mark.parametrize("terms", [["cv=0.1"], ["cv=0.05 dist=gamma", "rank-cv=0.03"]])
def test_the_variability_models_replay_sampled_whole_is_the_per_rank_engines(terms):
    from prism_debug.variability import parse_variability
    from prism_debug.variability.model import StochasticCompute

    graph = pipeline_with_dp(6)
    times = []
    for options in ({"compress": False}, {"sample_columns": 6}):
        engine = ReplayEngine(graph, constant_cost, seed=2, **options,
                              compute=StochasticCompute(graph, parse_variability(terms)))
        engine.slow([5], 1.5)
        engine.run(3)
        times.append(all_times(engine))
    assert times[1] == pytest.approx(times[0], rel=1e-12)
    assert len(set(np.round(times[0], 12))) > 10
