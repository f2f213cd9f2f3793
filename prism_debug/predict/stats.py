"""The figures of a prediction: mean, percentiles and exceedance
probabilities of sampled times, beside the deterministic replay's.  Pure
core (numpy)."""

from __future__ import annotations

import dataclasses
import math
from typing import Final

import numpy as np
from numpy.typing import NDArray

# numpy's default: linear interpolation between order statistics, Hyndman
# and Fan's definition 7 (as R's quantile() and Excel's PERCENTILE.INC)
PERCENTILE_METHOD: Final = "linear"
PERCENTILES = (50, 95, 99)


@dataclasses.dataclass(frozen=True)
class Summary:
    """One sampled time (an iteration, or K of them) in seconds."""

    deterministic_s: float  # the replay with the graph's own gaps
    mean_s: float
    stderr_s: float  # the Monte Carlo standard error of the mean (over samples)
    std_s: float  # the spread of the time itself
    p50_s: float
    p95_s: float
    p99_s: float
    values: int  # how many times the figures are over
    # (x, P(time > x × deterministic)) for each stated slowdown x
    exceed: tuple[tuple[float, float], ...]

    def percentile(self, q: int) -> float:
        return {50: self.p50_s, 95: self.p95_s, 99: self.p99_s}[q]


def percentile(values: NDArray[np.float64], q: float) -> float:
    return float(np.percentile(values, q, method=PERCENTILE_METHOD))


def summarize(per_sample: NDArray[np.float64], deterministic_s: float,
              slowdowns: tuple[float, ...]) -> Summary:
    """The figures of ``per_sample`` (one row per sample; every value of
    every row is one observation of the time).  The standard error is that
    of the row means, so values correlated within a sample (iterations of one
    replay) count no more than they are worth."""
    rows = np.asarray(per_sample, dtype=float).reshape(len(per_sample), -1)
    values = rows.ravel()
    means = rows.mean(axis=1)
    stderr = float(means.std(ddof=1) / math.sqrt(len(means))) if len(means) > 1 else math.nan
    p50, p95, p99 = (percentile(values, q) for q in PERCENTILES)
    return Summary(
        deterministic_s=float(deterministic_s), mean_s=float(values.mean()), stderr_s=stderr,
        std_s=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        p50_s=p50, p95_s=p95, p99_s=p99, values=len(values),
        exceed=tuple((float(x), float(np.mean(values > x * deterministic_s)))
                     for x in slowdowns))
