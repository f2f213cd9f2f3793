"""The figures of a prediction against hand computations."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prism_debug.predict.stats import summarize


def test_percentiles_interpolate_linearly_between_order_statistics():
    # 0..11 in two samples of six: the q-th percentile sits at 11·q/100 between
    # the order statistics (Hyndman–Fan 7): p50 = 5.5, p95 = 10.45, p99 = 10.89
    s = summarize(np.arange(12.0).reshape(2, 6), deterministic_s=5.0, slowdowns=(1.5, 2.0))
    assert (s.p50_s, s.p95_s, s.p99_s) == pytest.approx((5.5, 10.45, 10.89))
    assert s.mean_s == pytest.approx(5.5)
    # the two samples' means are 2.5 and 8.5: standard error = std(ddof=1) / √2
    assert s.stderr_s == pytest.approx(np.std([2.5, 8.5], ddof=1) / math.sqrt(2))
    # P(t > 7.5) = 4/12 (8, 9, 10, 11); P(t > 10) = 1/12
    assert s.exceed == ((1.5, 4 / 12), (2.0, 1 / 12))
    assert s.values == 12


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.001, 10.0), min_size=2, max_size=60), st.floats(0.5, 3.0))
def test_percentiles_are_ordered_and_exceedance_falls_with_the_slowdown(values, x):
    s = summarize(np.array(values).reshape(len(values), 1), deterministic_s=1.0,
                  slowdowns=(x, x * 1.1))
    assert min(values) <= s.p50_s <= s.p95_s <= s.p99_s <= max(values)
    assert min(values) - 1e-12 <= s.mean_s <= max(values) + 1e-12
    assert s.exceed[0][1] >= s.exceed[1][1]
    assert s.exceed[0][1] == sum(v > x for v in values) / len(values)
