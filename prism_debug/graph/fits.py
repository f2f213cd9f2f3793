"""Fitted compute-gap distributions: what a version 3 graph stores beside
each steady gap, and the fitting itself (scipy.stats).

A fit describes a *relative* factor: the graph's gap is the median of the
profiled gaps, and a draw from the fit multiplies it.  So the samples fitted
are each gap divided by its own event's median (dimensionless, about 1).

Three families compete — normal, gamma and lognormal, as scipy.stats names
their parameters (shapes…, loc, scale) — and the one at the least
Kolmogorov–Smirnov distance from the samples wins.  Gamma and lognormal are
fitted with ``loc`` fixed at 0: the three-parameter fits are ill-posed on a
few dozen samples (the likelihood grows without bound as ``loc`` approaches
the least sample), and a negative ``loc`` would draw negative compute.  The
normal keeps its own two parameters (its draws are clipped at 0).

This module holds plain data and numbers only: the variability package (a
layer above) turns a :class:`GapFit` into a drawable distribution.  scipy is
imported when a fit is made, not when a graph is read.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # (numpy is imported with scipy, when a fit is made: not to read a graph)
    import numpy as np
    from numpy.typing import NDArray

#: the families a fit may take, in the order ties are broken
FAMILIES = ("normal", "gamma", "lognormal")
#: scipy.stats parameters per family: shapes…, loc, scale
PARAMETERS = {"normal": ("loc", "scale"), "gamma": ("a", "loc", "scale"),
              "lognormal": ("s", "loc", "scale")}
POOLINGS = ("op", "kind", "class")  # where a fit's samples came from
MIN_SAMPLES = 8  # fewer samples fit nothing: 8 is where a KS distance starts to mean something
# A median gap under 10 µs is the host issuing ops back to back (a launch),
# not device work: it stays deterministic, and its samples — whose relative
# spread on a busy host runs to 100x — never join a pool that prices real compute.
MIN_GAP_S = 10e-6
_SCIPY_NAMES = {"normal": "norm", "gamma": "gamma", "lognormal": "lognorm"}


@dataclasses.dataclass(frozen=True)
class GapFit:
    """A steady gap's fitted distribution (a factor on the graph's gap)."""

    family: str  # one of FAMILIES
    params: tuple[float, ...]  # PARAMETERS[family], in order
    ks: float  # Kolmogorov–Smirnov distance from the samples, in [0, 1]
    samples: int  # how many samples it was fitted to
    pooled: str  # "op": its own event's; "kind": its op kind's in the class; "class": the class's

    def to_json(self) -> list[str | float | int | list[float]]:
        return [self.family, list(self.params), self.ks, self.samples, self.pooled]


def param_problem(family: str, params: Sequence[float]) -> str | None:
    """What is wrong with ``params`` for ``family`` (a check in checked's form), or None.

    Draws must be factors >= 0: shapes and scales positive (a normal's scale
    may be 0: a constant), gamma and lognormal ``loc`` >= 0."""
    names = PARAMETERS[family]
    if len(params) != len(names):
        return f"must be {len(names)} numbers ({', '.join(names)}) for a {family}, got " \
               f"{len(params)}"
    if not all(isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p)
               for p in params):
        return f"must be finite numbers, got {list(params)}"
    values = dict(zip(names, params, strict=True))
    if family == "normal":
        return None if values["scale"] >= 0 else f"scale must be >= 0, got {values['scale']}"
    shape = names[0]
    if values[shape] <= 0 or values["scale"] <= 0:
        return f"{shape} and scale must be > 0 for a {family}, got {list(params)}"
    return None if values["loc"] >= 0 else f"loc must be >= 0 for a {family}, got " \
                                            f"{values['loc']}"


def fit_samples(samples: Sequence[float], pooled: str = "op") -> GapFit:
    """The best of :data:`FAMILIES` for ``samples`` (at least
    :data:`MIN_SAMPLES` finite numbers >= 0, the caller checks), by KS distance."""
    import numpy as np
    import scipy.stats

    x = np.asarray(samples, dtype=np.float64)
    spread = float(x.std())
    if spread <= 1e-12 * max(abs(float(x.mean())), 1.0):
        # every sample alike: the families' fits degenerate; a constant is exact
        return GapFit("normal", (float(x.mean()), 0.0), 0.0, len(x), pooled)
    best = None
    for family in FAMILIES:
        params = _fit(scipy.stats, family, x)
        if params is None:
            continue
        ks = float(scipy.stats.kstest(x, _SCIPY_NAMES[family], args=params).statistic)
        if best is None or ks < best.ks:  # strictly less: ties go to the earlier family
            best = GapFit(family, params, ks, len(x), pooled)
    assert best is not None, "the normal always fits"
    return best


def _fit(stats: ModuleType, family: str, x: NDArray[np.float64]) -> tuple[float, ...] | None:
    """scipy's maximum-likelihood parameters, or None where the family cannot
    hold the samples (gamma and lognormal with loc 0 need them all > 0)."""
    if family == "normal":
        loc, scale = stats.norm.fit(x)
        return float(loc), float(scale)
    if float(x.min()) <= 0:
        return None
    import warnings

    with warnings.catch_warnings():  # scipy's optimiser warns on near-normal samples
        warnings.simplefilter("ignore", RuntimeWarning)
        params = getattr(stats, _SCIPY_NAMES[family]).fit(x, floc=0)
    params = tuple(float(p) for p in params)
    return params if param_problem(family, params) is None else None


class FitsSummary(TypedDict):
    """What :func:`fits_summary` counts (``graph show --json`` prints it)."""

    fitted: int
    steady_gaps: int
    families: dict[str, int]  # fits per family
    pooled: dict[str, int]  # fits per pooling
    median_ks: float | None  # None: no fits


def fits_summary(gap_fits: Mapping[int, tuple[GapFit | None, ...]], steady_events: int
                 ) -> FitsSummary:
    """How many of a graph's ``steady_events`` gaps have fits, by family and
    pooling, and their median KS distance (``graph show``)."""
    made = [f for fits in gap_fits.values() for f in fits if f is not None]
    distances = sorted(f.ks for f in made)
    return {
        "fitted": len(made), "steady_gaps": steady_events,
        "families": {name: sum(f.family == name for f in made) for name in FAMILIES},
        "pooled": {name: sum(f.pooled == name for f in made) for name in POOLINGS},
        "median_ks": distances[len(distances) // 2] if distances else None,
    }


def fits_line(summary: FitsSummary) -> str:
    """:func:`fits_summary` as one line of text."""
    if not summary["fitted"]:
        return "fits: none (profile again with this prism-debug: graph version 3 fits the " \
               "steady gaps)"
    families = ", ".join(f"{name} {n}" for name, n in summary["families"].items() if n)
    pooled = ", ".join(f"{name} {n}" for name, n in summary["pooled"].items() if n)
    return (f"fits: {summary['fitted']} of {summary['steady_gaps']} steady gaps ({families}; "
            f"samples pooled by {pooled}); median KS distance {summary['median_ks']:.3f}")
