"""Variability: compute that differs between ranks and iterations (pure core).

distributions (relative factors: draw, fit), spec (the ``--variability``
language and files), model (:class:`StochasticCompute`, the engine's
ComputeModel that draws them), order_stats (the maximum of n normals, the
closed form the Monte Carlo is checked against).
"""

from prism_debug.variability.distributions import FAMILIES, Distribution, Fit, fit
from prism_debug.variability.model import StochasticCompute
from prism_debug.variability.order_stats import (
    expected_max_normal,
    max_normal_quantile,
    std_max_normal,
)
from prism_debug.variability.spec import Rule, Variability, load_variability, parse_variability

__all__ = ["FAMILIES", "Distribution", "Fit", "Rule", "StochasticCompute", "Variability",
           "expected_max_normal", "fit", "load_variability", "max_normal_quantile",
           "parse_variability", "std_max_normal"]
