"""Step time as a random variable (after PRISM): Monte Carlo over the whole
world's graph with stochastic compute — p50/p95/p99 and mean of the
iteration time and of K iterations, P(slowdown > x), which classes and op
kinds make the tail.  Pure core (numpy); :mod:`.plot` is the matplotlib
adapter, imported only to draw."""

from prism_debug.predict.attribution import Attribution, Contribution
from prism_debug.predict.montecarlo import (
    ATTRIBUTION_SAMPLES,
    DEFAULT_ITERATIONS,
    DEFAULT_SAMPLES,
    DEFAULT_SLOWDOWNS,
    predict,
    sample,
)
from prism_debug.predict.report import Prediction, prediction_dict, prediction_lines
from prism_debug.predict.stats import PERCENTILE_METHOD, Summary

__all__ = [
    "ATTRIBUTION_SAMPLES", "Attribution", "Contribution", "DEFAULT_ITERATIONS", "DEFAULT_SAMPLES",
    "DEFAULT_SLOWDOWNS", "PERCENTILE_METHOD", "Prediction", "Summary", "predict",
    "prediction_dict", "prediction_lines", "sample",
]
