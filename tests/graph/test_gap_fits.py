"""Graph version 3: fitted gap distributions made by the builder (per op,
pooled by op kind, pooled by class; gaps under 10 µs left deterministic),
kept by a file's round trip, each malformed one refused with its key path,
and older graphs still read with none."""

import copy
import gzip
import json

import numpy as np
import pytest
import scipy.stats

from prism_debug.errors import GraphError
from prism_debug.graph import ExecutionGraph, GapFit
from prism_debug.graph.build import (
    RecordedEnd,
    RecordedIssue,
    RecordedWait,
    SliceRecord,
    build_graph,
)
from prism_debug.graph.execution import GRAPH_VERSION, READABLE_VERSIONS
from prism_debug.graph.fits import FAMILIES, MIN_SAMPLES
from tests.graph.test_build import families

ADVICE = ": give a file prism-debug profile wrote, or profile the job again"
FAMS = families(4, tp=2, pp=1)  # mesh (dp 2, tp 2), one class


def ddp_slice(gaps_per_iteration: list[tuple[float, float, float]]) -> SliceRecord:
    """Per iteration: compute, a TP all-reduce, compute, its wait... the end.
    Each tuple gives the issue's, the wait's and the end's gaps; iteration 1
    is warm-up (the builder always takes it as such)."""
    iterations = tuple((RecordedIssue(a, "all_reduce", "tp", 64, "float32"), RecordedWait(b, 0),
                        RecordedEnd(c)) for a, b, c in gaps_per_iteration)
    return SliceRecord(0, FAMS, iterations)


def relative(values):
    values = np.asarray(values, dtype=float)
    return values / np.median(values)


def best_by_scipy(samples):
    """The family of FAMILIES at the least KS distance, computed here with
    scipy alone (gamma and lognormal with loc 0)."""
    fits = {"normal": scipy.stats.norm.fit(samples),
            "gamma": scipy.stats.gamma.fit(samples, floc=0),
            "lognormal": scipy.stats.lognorm.fit(samples, floc=0)}
    names = {"normal": "norm", "gamma": "gamma", "lognormal": "lognorm"}
    distance = {f: scipy.stats.kstest(samples, names[f], args=p).statistic
                for f, p in fits.items()}
    family = min(FAMILIES, key=lambda f: (distance[f], FAMILIES.index(f)))
    return family, fits[family], distance[family]


def test_enough_steady_iterations_fit_each_op_on_its_own():
    rng = np.random.default_rng(3)
    steady = 12
    issue = rng.lognormal(np.log(0.02), 0.3, steady)
    end = rng.gamma(9.0, 0.001, steady)
    graph = build_graph(4, 8, [ddp_slice([(0.5, 0.0, 0.1)] + [
        (a, 0.0, c) for a, c in zip(issue, end, strict=True)])])
    assert graph.version == 3 == GRAPH_VERSION
    issue_fit, wait_fit, end_fit = graph.gap_fits[0]
    assert wait_fit is None  # a gap of 0: deterministic
    for fit, samples in ((issue_fit, issue), (end_fit, end)):
        family, params, distance = best_by_scipy(relative(samples))
        assert (fit.family, fit.samples, fit.pooled) == (family, steady, "op")
        assert fit.params == pytest.approx(params, rel=1e-6, abs=1e-9)
        assert fit.ks == pytest.approx(distance, rel=1e-9)


def test_few_iterations_pool_by_op_kind_then_by_class():
    # 3 steady iterations: no event has 8 samples alone.  The all-reduce's
    # issue and wait (one kind, 6 samples, each over its own median) are
    # still too few alone: they and the end pool over the class (9).
    rows = [(1.0, 1.0, 1.0), (0.9, 0.09, 0.18), (1.0, 0.10, 0.2), (1.2, 0.11, 0.22)]
    graph = build_graph(4, 8, [ddp_slice(rows)])
    fits = graph.gap_fits[0]
    pooled = np.concatenate([relative([r[k] for r in rows[1:]]) for k in range(3)])
    family, params, distance = best_by_scipy(pooled)
    assert fits[0] == fits[1] == fits[2]  # one pool, fitted once
    assert (fits[0].family, fits[0].samples, fits[0].pooled) == (family, 9, "class")
    assert fits[0].params == pytest.approx(params, rel=1e-6, abs=1e-9)
    # 5 steady iterations: the all-reduce's two events make 10 samples of its kind
    rows += [(1.1, 0.12, 0.21), (0.95, 0.1, 0.19)]
    fits = build_graph(4, 8, [ddp_slice(rows)]).gap_fits[0]
    assert (fits[0].pooled, fits[0].samples) == ("kind", 10) and fits[0] == fits[1]
    family, params, _ = best_by_scipy(np.concatenate([relative([r[k] for r in rows[1:]])
                                                      for k in (0, 1)]))
    assert (fits[0].family, fits[0].params) == (family, pytest.approx(params, rel=1e-6))
    assert (fits[2].pooled, fits[2].samples) == ("class", 15)


def test_gaps_under_ten_microseconds_stay_deterministic():
    # (the host issuing ops back to back: 9 µs at most here, spread 100x)
    rows = [(0.5, 0.0, 1e-7)] + [(0.01 * (1 + 0.01 * i), 0.0, 9e-6 * (1 + 99 * (i % 2)) / 2)
                                 for i in range(9)]
    fits = build_graph(4, 8, [ddp_slice(rows)]).gap_fits[0]
    assert fits[1] is None and fits[2] is None and fits[0].pooled == "op"
    nothing = build_graph(4, 8, [ddp_slice([(0.0, 0.0, 0.0)] * 4)])
    assert nothing.gap_fits == {}


def fitted_graph() -> ExecutionGraph:
    rng = np.random.default_rng(1)
    rows = [(0.5, 0.0, 0.1)] + [(a, 0.0, 0.1 * b) for a, b in
                                zip(rng.lognormal(-4, 0.2, 10), rng.gamma(20, 0.05, 10),
                                    strict=True)]
    return build_graph(4, 8, [ddp_slice(rows)])


def test_a_version_3_file_keeps_its_fits(tmp_path):
    graph = fitted_graph()
    graph.save(tmp_path / "g.prism")
    loaded = ExecutionGraph.load(tmp_path / "g.prism")
    assert loaded == graph and loaded.gap_fits[0][0] == graph.gap_fits[0][0] is not None
    assert json.loads(gzip.decompress((tmp_path / "g.prism").read_bytes()))["version"] == 3


def test_older_versions_still_load_without_fits(tmp_path):
    assert READABLE_VERSIONS == (1, 2, 3)
    data = fitted_graph().to_dict()
    for version in (1, 2):
        old = copy.deepcopy(data) | {"version": version}
        del old["gap_fits"]
        with gzip.open(tmp_path / "old.prism", "wt") as f:
            json.dump(old, f)
        loaded = ExecutionGraph.load(tmp_path / "old.prism")
        assert loaded.gap_fits == {} and loaded.programs == fitted_graph().programs


def mutated(change) -> dict:
    data = copy.deepcopy(fitted_graph().to_dict())
    change(data)
    return data


def set_fit(index, value):
    return lambda d: d["gap_fits"]["0"][0].__setitem__(index, value)


@pytest.mark.parametrize("change, message", [
    (set_fit(0, "weibull"), "gap_fits.0[0][0] must be one of normal, gamma, lognormal, got "
                            "'weibull'"),
    (lambda d: d["gap_fits"]["0"].__setitem__(0, ["normal", [1.0], 0.1, 10, "op"]),
     "gap_fits.0[0][1] must be 2 numbers (loc, scale) for a normal, got 1"),
    (set_fit(1, [1.0, "x", 1.0]), "gap_fits.0[0][1][1] must be a number, got 'x'"),
    (set_fit(2, 1.5), "gap_fits.0[0][2] must be in [0, 1], got 1.5"),
    (set_fit(2, -0.1), "gap_fits.0[0][2] must be in [0, 1], got -0.1"),
    (set_fit(3, 3), "gap_fits.0[0][3] must be in [8, 16777216], got 3"),
    (set_fit(4, "rank"), "gap_fits.0[0][4] must be one of op, kind, class, got 'rank'"),
    (lambda d: d["gap_fits"]["0"].pop(), "gap_fits.0 must be a list of 3, got 2 items"),
    (lambda d: d["gap_fits"].__setitem__("5", []), "gap_fits.5 must name a class of the graph "
                                                   "(0-0)"),
    (lambda d: d["gap_fits"]["0"].__setitem__(0, [1, 2]), "gap_fits.0[0] must be a list of 5, "
                                                          "got 2 items"),
])
def test_a_malformed_fit_is_refused_with_its_key_path(change, message):
    data = mutated(change)
    with pytest.raises(GraphError) as caught:
        ExecutionGraph.from_dict(data, "g.prism")
    assert str(caught.value) == f"malformed graph g.prism: {message}{ADVICE}"


def test_a_negative_gamma_loc_is_refused():
    def change(d):
        d["gap_fits"]["0"][0] = ["gamma", [2.0, -0.5, 1.0], 0.1, 10, "op"]
    with pytest.raises(GraphError) as caught:
        ExecutionGraph.from_dict(mutated(change), "g.prism")
    assert str(caught.value) == ("malformed graph g.prism: gap_fits.0[0][1] loc must be >= 0 "
                                 f"for a gamma, got -0.5{ADVICE}")


def test_the_example_profiles_to_a_version_3_graph_with_fits(example_graph):
    graph = ExecutionGraph.load(example_graph)
    assert graph.version == 3 and set(graph.gap_fits) == set(range(len(graph.programs)))
    for class_id, fits in graph.gap_fits.items():
        assert len(fits) == len(graph.programs[class_id].steady)
        made = [f for f in fits if f is not None]
        assert made, f"class {class_id} fitted nothing"
        for fit in made:
            assert isinstance(fit, GapFit) and fit.family in FAMILIES
            assert 0 <= fit.ks <= 1 and fit.samples >= MIN_SAMPLES
            assert fit.pooled in ("op", "kind", "class")


def test_graph_show_says_what_was_fitted():
    from prism_debug.graph.fits import fits_line, fits_summary

    graph = fitted_graph()
    made = [f for f in graph.gap_fits[0] if f is not None]
    summary = fits_summary(graph.gap_fits, 3)
    assert summary["fitted"] == 2 and summary["pooled"] == {"op": 2, "kind": 0, "class": 0}
    families = ", ".join(f"{name} {n}" for name in FAMILIES
                         if (n := sum(f.family == name for f in made)))
    assert fits_line(summary) == (f"fits: 2 of 3 steady gaps ({families}; samples pooled by op "
                                  f"2); median KS distance {max(f.ks for f in made):.3f}")
    assert fits_line(fits_summary({}, 3)).startswith("fits: none")
