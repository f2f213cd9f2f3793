"""Distributions of a relative compute factor: with_cv's moments, what draws
draw, the JSON form, and fit() recovering the family and parameters of
large seeded samples (checked against the generating parameters, not against
what the code produced)."""

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.errors import VariabilityError
from prism_debug.variability import FAMILIES, Distribution, Fit, fit

N = 200_000  # draws per moment check


def moment_tolerances(dist: Distribution, n: int) -> tuple[float, float]:
    """Five standard errors of a sample mean and a sample std of ``n`` draws:
    σ/√n and σ·√((κ-1)/(4n)) (κ the kurtosis, from scipy's closed form)."""
    excess = float(scipy.stats.lognorm(dist.params[0], scale=dist.params[2]).stats("k")) \
        if dist.family == "lognormal" else \
        float(scipy.stats.gamma(dist.params[0], scale=dist.params[2]).stats("k")) \
        if dist.family == "gamma" else 0.0
    sigma = dist.std()
    return 5 * sigma / math.sqrt(n), 5 * sigma * math.sqrt((excess + 2) / (4 * n))


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cv", [0.05, 0.3])
def test_draws_have_mean_one_and_the_stated_cv(family, cv):
    dist = Distribution.with_cv(family, cv)
    # a normal's draws are clipped at 0, which moves its moments by less than cv·φ(1/cv)
    clipped = cv * scipy.stats.norm.pdf(1 / cv) if family == "normal" else 0.0
    assert dist.mean() == pytest.approx(1.0, abs=1e-9 + clipped)
    assert dist.std() == pytest.approx(cv, abs=1e-9 + clipped)
    draws = dist.draw(np.random.default_rng(7), N)
    mean_tol, std_tol = moment_tolerances(dist, N)
    assert draws.dtype == np.float64 and draws.shape == (N,)
    assert abs(draws.mean() - 1.0) < mean_tol
    assert abs(draws.std() - cv) < std_tol


def test_with_cv_parameters_are_the_closed_forms():
    assert Distribution.with_cv("normal", 0.1).params == (1.0, 0.1)
    gamma = Distribution.with_cv("gamma", 0.5)
    assert gamma.params == pytest.approx((4.0, 0.0, 0.25))
    lognormal = Distribution.with_cv("lognormal", 0.5)
    s = math.sqrt(math.log(1.25))
    assert lognormal.params == pytest.approx((s, 0.0, math.exp(-s * s / 2)))


@pytest.mark.parametrize("family", FAMILIES)
def test_cv_zero_is_the_constant_one(family):
    dist = Distribution.with_cv(family, 0)
    assert dist.constant
    assert dist.draw(np.random.default_rng(0), (3, 2)).tolist() == [[1.0, 1.0]] * 3
    assert (dist.mean(), dist.std()) == (1.0, 0.0)
    assert dist.ppf([0.01, 0.99]).tolist() == [1.0, 1.0]


def test_a_clipped_normal_reports_what_it_draws():
    dist = Distribution.with_cv("normal", 2.0)  # Φ(-0.5) = 31 % of draws are 0
    draws = dist.draw(np.random.default_rng(3), N)
    assert (draws == 0).mean() == pytest.approx(scipy.stats.norm.cdf(-0.5), abs=0.005)
    mean_tol, _ = moment_tolerances(dist, N)
    assert abs(draws.mean() - dist.mean()) < mean_tol
    assert dist.mean() > 1.0  # the clipped mass moved up to 0
    assert abs(draws.std() - dist.std()) < 0.02
    assert dist.ppf(0.2) == 0.0 and dist.cdf(-0.1) == 0.0


def test_ppf_inverts_cdf():
    for family in FAMILIES:
        dist = Distribution.with_cv(family, 0.2)
        q = np.array([0.01, 0.5, 0.99])
        assert dist.cdf(dist.ppf(q)) == pytest.approx(q, abs=1e-9)


@pytest.mark.parametrize("family", FAMILIES)
def test_json_round_trip(family):
    dist = Distribution.with_cv(family, 0.17)
    assert Distribution.from_json(dist.to_json()) == dist
    assert dist.to_json()[0] == family


@pytest.mark.parametrize("data, message", [
    (["weibull", 1.0, 2.0], "distribution family 'weibull': use one of normal, gamma, lognormal"),
    (["gamma", 1.0, 0.0], "gamma parameters must be 3 numbers (a, loc, scale) for a gamma, "
                          "got 2"),
    (["normal", 1.0, -0.1], "normal parameters scale must be >= 0, got -0.1"),
    (["lognormal", 0.5, -1.0, 1.0], "lognormal parameters loc must be >= 0 for a lognormal, "
                                    "got -1.0"),
    (["normal", "1", 0.1], "normal parameters must be finite numbers, got ['1', 0.1]"),
    (["normal", float("nan"), 0.1], "normal parameters must be finite numbers, got [nan, 0.1]"),
    ({"family": "normal"}, "a distribution must be [family, parameters…] with family one of "
                           "normal, gamma, lognormal, got {'family': 'normal'}"),
])
def test_bad_json_is_refused_saying_what_to_give(data, message):
    with pytest.raises(VariabilityError) as caught:
        Distribution.from_json(data)
    assert str(caught.value) == message


def test_with_cv_refuses_what_it_cannot_make():
    with pytest.raises(VariabilityError, match=r"^cv must be a number from 0 to 2, got 2.5$"):
        Distribution.with_cv("gamma", 2.5)
    with pytest.raises(VariabilityError, match=r"^distribution family 'beta': use one of"):
        Distribution.with_cv("beta", 0.1)


@settings(max_examples=60, deadline=None)
@given(family=st.sampled_from(FAMILIES), cv=st.floats(0, 2),
       shape=st.lists(st.integers(0, 5), max_size=3), seed=st.integers(0, 2**32 - 1))
def test_draws_are_factors_of_the_asked_shape(family, cv, shape, seed):
    draws = Distribution.with_cv(family, cv).draw(np.random.default_rng(seed), tuple(shape))
    assert draws.shape == tuple(shape) and draws.dtype == np.float64
    assert np.all(draws >= 0) and np.all(np.isfinite(draws))


def test_same_seed_same_draws():
    dist = Distribution.with_cv("gamma", 0.1)
    a = dist.draw(np.random.default_rng(5), 100)
    b = dist.draw(np.random.default_rng(5), 100)
    assert a.tolist() == b.tolist()


# -- fit -----------------------------------------------------------------------------

FIT_N = 20_000
# the generating distributions: distinct shapes (skewness 0, 1.0, 1.75)
TRUTHS = [Distribution("normal", (1.0, 0.1)), Distribution("gamma", (4.0, 0.0, 0.25)),
          Distribution("lognormal", (0.5, 0.0, 1.0))]


@pytest.mark.parametrize("truth", TRUTHS, ids=lambda d: d.family)
def test_fit_recovers_family_and_parameters(truth):
    samples = truth.draw(np.random.default_rng(11), FIT_N)
    found = fit(samples)
    assert found.distribution.family == truth.family
    # maximum-likelihood standard errors at n = 20,000 are under 1 % of each
    # parameter (a gamma's shape: a·√(2/n)·~1.1 ≈ 1.1 %); 4 % is > 3 of them
    assert found.distribution.params == pytest.approx(truth.params, rel=0.04, abs=1e-12)
    assert 0 <= found.ks < 1.63 / math.sqrt(FIT_N)  # below KS's 1 % critical value
    assert (found.samples, found.pooled) == (FIT_N, "op")


def test_fit_of_a_constant_is_the_constant():
    found = fit([1.25] * 10)
    assert found.distribution == Distribution("normal", (1.25, 0.0)) and found.ks == 0.0


def test_fit_ks_is_scipys_distance():
    samples = TRUTHS[2].draw(np.random.default_rng(2), 50)
    found = fit(samples, pooled="kind")
    s, loc, scale = found.distribution.params
    expected = scipy.stats.kstest(samples, "lognorm", args=(s, loc, scale)).statistic \
        if found.distribution.family == "lognormal" else None
    if expected is not None:
        assert found.ks == pytest.approx(expected)
    assert found.pooled == "kind" and found.samples == 50


def test_fit_needs_enough_good_samples():
    with pytest.raises(VariabilityError, match=r"^fitting a distribution needs at least 8 "
                                               r"samples, got 7: profile more iterations$"):
        fit([1.0] * 7)
    with pytest.raises(VariabilityError, match="finite samples >= 0"):
        fit([1.0] * 7 + [-0.5])
    with pytest.raises(VariabilityError, match="pooled by op, kind, class, not 'rank'"):
        Fit(Distribution.with_cv("normal", 0.1), 0.1, 10, "rank")


def test_fit_round_trips_through_the_graphs_plain_form():
    found = fit(TRUTHS[1].draw(np.random.default_rng(4), 100))
    assert Fit.from_gap_fit(found.to_gap_fit()) == found
