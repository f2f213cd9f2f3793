"""The maximum of n normals against closed forms (n = 1, 2, 3), an
independent dense integration at n = 10⁶, and seeded Monte Carlo within its
standard error at n = 8 and 1,024."""

import math

import numpy as np
import pytest
import scipy.stats
from scipy.special import log_ndtr

from prism_debug.variability import expected_max_normal, max_normal_quantile
from prism_debug.variability.order_stats import std_max_normal


def test_closed_forms():
    assert expected_max_normal(1, 3.5, 2.0) == pytest.approx(3.5, abs=1e-12)
    assert std_max_normal(1, 3.5, 2.0) == pytest.approx(2.0, rel=1e-9)
    # max of 2: mean + std/√π, variance std²(1 - 1/π); max of 3: mean + 3 std/(2√π)
    assert expected_max_normal(2, 1.0, 0.1) == pytest.approx(1 + 0.1 / math.sqrt(math.pi),
                                                             rel=1e-12)
    assert std_max_normal(2, 0.0, 1.0) == pytest.approx(math.sqrt(1 - 1 / math.pi), rel=1e-9)
    assert expected_max_normal(3, 0.0, 1.0) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-10)
    assert expected_max_normal(8, 0.0, 1.0) == pytest.approx(1.4236003, abs=1e-7)  # tabulated
    assert expected_max_normal(1000, 5.0, 0.0) == 5.0


@pytest.mark.parametrize("n", [1024, 1_000_000])
def test_large_n_against_a_dense_integration(n):
    """The max's density n·φ(x)·Φ(x)^{n-1} on a grid of 10⁶ points (trapezoid
    rule): an integration that shares no code with quad's."""
    x = np.linspace(-8, 10, 1_000_001)  # (outside: < 1e-14 of the mass)
    density = np.exp(math.log(n) + (n - 1) * log_ndtr(x) - x * x / 2) / math.sqrt(2 * math.pi)
    mean = np.trapezoid(x * density, x)
    assert expected_max_normal(n, 0.0, 1.0) == pytest.approx(mean, rel=1e-6)
    assert std_max_normal(n, 0.0, 1.0) ** 2 == pytest.approx(
        np.trapezoid(x * x * density, x) - mean * mean, rel=1e-6)


@pytest.mark.parametrize("n, samples", [(8, 200_000), (1024, 20_000)])
def test_monte_carlo_agrees_within_its_standard_error(n, samples):
    rng = np.random.default_rng(17)
    maxima = np.concatenate([rng.normal(2.0, 0.3, (samples // 10, n)).max(axis=1)
                             for _ in range(10)])
    error = std_max_normal(n, 2.0, 0.3) / math.sqrt(samples)
    assert abs(maxima.mean() - expected_max_normal(n, 2.0, 0.3)) < 4 * error
    for q in (0.5, 0.95):
        exact = max_normal_quantile(n, q, 2.0, 0.3)
        # the sample quantile's standard error: √(q(1-q)/m) / density at the quantile
        density = n * scipy.stats.norm.pdf(exact, 2.0, 0.3) * \
            scipy.stats.norm.cdf(exact, 2.0, 0.3) ** (n - 1)
        assert abs(np.quantile(maxima, q) - exact) < 4 * math.sqrt(q * (1 - q) / samples) / density


def test_quantile_is_where_the_max_cdf_reaches_q():
    for n in (1, 8, 65536, 10**6):
        for q in (0.01, 0.5, 0.99):
            x = max_normal_quantile(n, q, 0.0, 1.0)
            assert math.exp(n * log_ndtr(x)) == pytest.approx(q, rel=1e-9)
    assert max_normal_quantile(1, 0.975, 1.0, 2.0) == pytest.approx(1 + 2 * 1.959963985, rel=1e-9)


def test_bad_arguments():
    with pytest.raises(ValueError, match="n must be a whole number >= 1, got 0"):
        expected_max_normal(0, 0.0, 1.0)
    with pytest.raises(ValueError, match="std must be >= 0, got -1"):
        expected_max_normal(4, 0.0, -1)
    with pytest.raises(ValueError, match=r"a quantile is in \(0, 1\), got 1"):
        max_normal_quantile(4, 1, 0.0, 1.0)
