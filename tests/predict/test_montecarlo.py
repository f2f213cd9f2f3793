"""The Monte Carlo driver: seeds, processes, keyed draws, what-ifs, attribution."""

import numpy as np
import pytest

from prism_debug.cost import CostModel, Placement, load_profile
from prism_debug.errors import ConfigError
from prism_debug.faults import parse_fault, resolve
from prism_debug.predict import sample
from prism_debug.predict.closedform import ddp_graph
from prism_debug.predict.draws import Removal, SampleCompute, probe_moments
from tests.engine.test_replay import pipeline_graph

COST = CostModel(load_profile("h100-ib400")).op_time_s


class UniformCompute:
    """A stand-in stochastic compute model: every gap × U(1 - w, 1 + w), per
    rank, event and iteration; class ``quiet`` draws but keeps its gaps."""

    per_rank = True

    def __init__(self, width=0.1, quiet=None):
        self.width, self.quiet = width, quiet

    def gaps_s(self, class_id, iteration, base_gaps_s, shape, rng):
        factors = rng.uniform(1 - self.width, 1 + self.width, (len(base_gaps_s), *shape))
        if class_id == self.quiet:
            return base_gaps_s
        base = np.asarray(base_gaps_s).reshape((-1,) + (1,) * len(shape))
        return base * factors

    def rank_factors(self, class_id, shape, rng):
        return None


def run(graph, compute=None, **kwargs):
    kwargs.setdefault("samples", 6)
    kwargs.setdefault("iterations", 3)
    kwargs.setdefault("jobs", 1)
    kwargs.setdefault("attribution", False)
    return sample(graph, COST, compute or UniformCompute(), "uniform ±10 %", **kwargs)


def test_the_same_seed_gives_the_same_prediction_on_any_number_of_processes():
    graph = pipeline_graph()
    one = run(graph, seed=7, jobs=1)
    two = run(graph, seed=7, jobs=2)
    assert np.array_equal(one.times_s, two.times_s)
    assert one.iteration == two.iteration
    other = run(graph, seed=8)
    assert not np.array_equal(one.times_s, other.times_s)


def test_samples_are_independent_replays_each_keyed_by_its_number():
    graph = pipeline_graph()
    six = run(graph, samples=6).times_s
    three = run(graph, samples=3).times_s
    assert np.array_equal(six[:3], three)  # sample i is sample i, however many there are
    assert len({tuple(row) for row in six}) == 6


def test_a_removed_class_gets_its_mean_and_the_others_their_very_draws():
    graph = pipeline_graph()
    inner = UniformCompute()
    moments = probe_moments(graph, inner)
    program = graph.programs[1]
    base = tuple(e.gap_s for e in program.steady)
    kept = SampleCompute(graph, inner, (0, 4, 2))
    removed = SampleCompute(graph, inner, (0, 4, 2), Removal(classes=frozenset({1})), moments)
    rng = np.random.default_rng(0)  # the engine's: keyed draws do not read it
    for class_id in (0, 1):
        events = graph.programs[class_id].steady
        base = tuple(e.gap_s for e in events)
        a = kept.gaps_s(class_id, 1, base, (2,), rng)
        b = removed.gaps_s(class_id, 1, base, (2,), np.random.default_rng(1))
        if class_id == 0:
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        else:
            # U(0.9, 1.1) has mean 1: the probe's mean is the gap within 0.2 %
            assert b == pytest.approx(list(base), rel=2e-3, abs=1e-12)
            assert all(isinstance(x, float) for x in b)


def test_attribution_finds_no_change_where_a_class_has_no_variance():
    graph = pipeline_graph()
    prediction = run(graph, UniformCompute(quiet=1), attribution=True, samples=8)
    rows = {c.removed: c for c in prediction.attribution.contributions}
    assert "class 1" not in rows  # no variance: nothing replayed for it
    assert rows["class 0"].variance_share == pytest.approx(1.0)
    assert prediction.attribution.replays == 8 * len(rows)


def test_removing_the_only_variance_gives_back_the_deterministic_time():
    # DDP: one class; without its variance every rank computes the mean gap
    graph = ddp_graph(16, 0.1)
    prediction = run(graph, attribution=True, samples=10)
    rows = {c.removed: c for c in prediction.attribution.contributions}
    without = prediction.attribution.p99_s + rows["class 0"].p99_change_s
    assert without == pytest.approx(prediction.iteration.deterministic_s, rel=1e-3)
    assert rows["class 0"].p99_change_s < -0.005  # the max of 16 draws of ±10 %


def test_a_what_if_slows_the_deterministic_and_the_sampled_times():
    graph = ddp_graph(200, 0.1)
    fault = "slow fraction:0.01 1.2"
    injection = resolve(parse_fault(fault, 200, 8), 200, 8, graph)
    assert len(injection.targets) == 2
    cost_s = COST(graph.programs[0].ops[0], Placement.of(range(200), 8))
    prediction = run(graph, injections=[(fault, injection)])
    # two ranks compute 1.2 g: every rank leaves the all-reduce after them
    assert prediction.iteration.deterministic_s == pytest.approx(0.12 + cost_s, rel=1e-12)
    assert prediction.iteration.mean_s > 0.12 + cost_s
    assert prediction.faults == ((fault, 2),)


def test_faults_that_stop_ranks_for_good_are_refused():
    graph = ddp_graph(8, 0.1)
    text = "fail 3 at 2"
    with pytest.raises(ConfigError) as info:
        run(graph, injections=[(text, resolve(parse_fault(text, 8, 8), 8, 8, graph))])
    assert str(info.value) == (
        "--perturb 'fail 3 at 2' stops ranks for good: no iteration ends after it, so there is "
        "no step time to predict; ask prism-debug replay --perturb where ranks block")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"samples": 0}, "--samples must be at least 1, got 0"),
    ({"iterations": 0}, "--iterations must be at least 1, got 0"),
    ({"rank": 8}, "--rank 8 is outside the graph's world of 8 ranks (0-7)"),
])
def test_bad_numbers_are_refused(kwargs, message):
    with pytest.raises(ConfigError) as info:
        run(ddp_graph(8, 0.1), **kwargs)
    assert str(info.value) == message
