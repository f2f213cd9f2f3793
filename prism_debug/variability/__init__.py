"""Variability: compute that differs between ranks and iterations (pure core).

distributions (relative factors: draw, fit), spec (the ``--variability``
language and files), model (:class:`StochasticCompute`, the engine's
ComputeModel that draws them), order_stats (the maximum of n normals, the
closed form the Monte Carlo is checked against).
"""

from prism_debug.variability.distributions import FAMILIES, Distribution, Fit, fit
from prism_debug.variability.spec import Rule, Variability, load_variability, parse_variability

__all__ = ["FAMILIES", "Distribution", "Fit", "Rule", "Variability", "fit", "load_variability",
           "parse_variability"]
