"""Distributions of a relative compute factor: a draw multiplies a gap.

:class:`Distribution` is a family of :data:`FAMILIES` with scipy.stats's
parameters (shapes…, loc, scale).  :meth:`Distribution.draw` is on the
replay engine's path (once per class and iteration, thousands of factors a
call), so it calls numpy's Generator directly: ``rng.normal``,
``rng.standard_gamma``, ``exp`` of ``rng.standard_normal`` — a few ns a
factor where a scipy ``.rvs`` call costs tens of µs before its first.  The
slower questions (ppf, cdf, mean, std) go to scipy.stats, imported on first
use so that reading a ``--variability`` option does not pay for it.

Draws are factors >= 0: a normal's draws are clipped at 0 (a point mass at
0 of Φ(-loc/scale); with ``with_cv`` that is Φ(-1/cv), 3e-7 at cv=0.2, 31 %
at cv=2), and ``mean``, ``std``, ``cdf``, ``ppf`` describe the clipped
variable — what ``draw`` draws.  Gamma and lognormal have ``loc`` >= 0.

:func:`fit` is graph/fits.py's fitting (the graph's builder, a layer below,
fits profiles with it), wrapped in this module's types.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

from prism_debug.errors import VariabilityError
from prism_debug.graph.fits import (
    FAMILIES,
    MIN_SAMPLES,
    PARAMETERS,
    POOLINGS,
    GapFit,
    fit_samples,
    param_problem,
)

MAX_CV = 2.0  # beyond it a factor is mostly noise: 31 % of a clipped normal's draws are 0
MIN_CV = 1e-6  # below it a factor moves a 1 s gap by under 1 µs: with_cv gives the constant 1

__all__ = ["FAMILIES", "MAX_CV", "MIN_SAMPLES", "Distribution", "Fit", "fit"]


class _Frozen(Protocol):
    """What this module asks of a frozen scipy.stats distribution (scipy ships
    no types)."""

    def cdf(self, x: NDArray[np.float64]) -> NDArray[np.float64]: ...

    def ppf(self, q: NDArray[np.float64]) -> NDArray[np.float64]: ...

    def mean(self) -> float: ...

    def std(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class Distribution:
    """A relative factor's distribution: ``family`` with scipy.stats's ``params``."""

    family: str
    params: tuple[float, ...]

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise VariabilityError(f"distribution family {self.family!r}: use one of "
                                   f"{', '.join(FAMILIES)}")
        params = tuple(self.params)
        if (problem := param_problem(self.family, params)) is not None:
            raise VariabilityError(f"{self.family} parameters {problem}")
        object.__setattr__(self, "params", tuple(float(p) for p in params))

    @classmethod
    def with_cv(cls, family: str, cv: float) -> Distribution:
        """Mean 1 and coefficient of variation ``cv`` (0 to :data:`MAX_CV`).

        ``cv`` below :data:`MIN_CV` (0 too) gives the constant 1 (a normal of
        scale 0, whatever the family; a gamma's shape 1/cv² would overflow): it
        draws exactly 1, and :attr:`constant` tells callers they may skip it."""
        if family not in FAMILIES:
            raise VariabilityError(f"distribution family {family!r}: use one of "
                                   f"{', '.join(FAMILIES)}")
        if not (isinstance(cv, (int, float)) and 0 <= cv <= MAX_CV):
            raise VariabilityError(f"cv must be a number from 0 to {MAX_CV:g}, got {cv!r}")
        if cv < MIN_CV:
            return cls("normal", (1.0, 0.0))
        if family == "normal":
            return cls("normal", (1.0, float(cv)))
        if family == "gamma":
            return cls("gamma", (1 / cv**2, 0.0, cv**2))
        s = math.sqrt(math.log1p(cv**2))
        return cls("lognormal", (s, 0.0, math.exp(-s * s / 2)))

    @property
    def constant(self) -> bool:
        """Every draw is the same number (a normal of scale 0)."""
        return self.family == "normal" and self.params[1] == 0

    # -- drawing (the engine's path) ----------------------------------------------

    def draw(self, rng: np.random.Generator, size: int | tuple[int, ...]
             ) -> NDArray[np.float64]:
        """``size`` factors (float64, >= 0), drawn from ``rng`` alone."""
        if self.family == "normal":
            loc, scale = self.params
            if scale == 0:
                return np.full(size, max(loc, 0.0))
            out = rng.normal(loc, scale, size)
            return np.maximum(out, 0.0, out=out)
        if self.family == "gamma":
            a, loc, scale = self.params
            out = rng.standard_gamma(a, size)
            out *= scale
        else:
            s, loc, scale = self.params
            out = rng.standard_normal(size)
            out *= s
            out += math.log(scale)
            np.exp(out, out=out)
        if loc:
            out += loc
        return out

    # -- the slower questions (scipy.stats) ---------------------------------------

    def _scipy(self) -> _Frozen:
        import scipy.stats

        name = {"normal": "norm", "gamma": "gamma", "lognormal": "lognorm"}[self.family]
        frozen: _Frozen = getattr(scipy.stats, name)(*self.params)
        return frozen

    def cdf(self, x: ArrayLike) -> NDArray[np.float64]:
        x = np.asarray(x, dtype=np.float64)
        if self.constant:
            return np.where(x >= max(self.params[0], 0.0), 1.0, 0.0)
        return np.where(x >= 0, self._scipy().cdf(x), 0.0)

    def ppf(self, q: ArrayLike) -> NDArray[np.float64]:
        q = np.asarray(q, dtype=np.float64)
        if self.constant:
            return np.full(q.shape, max(self.params[0], 0.0))
        return np.maximum(self._scipy().ppf(q), 0.0)

    def mean(self) -> float:
        if self.family != "normal":
            return float(self._scipy().mean())
        mu, sigma = self.params
        if sigma == 0:
            return max(mu, 0.0)
        from scipy.stats import norm

        z = mu / sigma  # E[max(X, 0)] for X ~ N(mu, sigma²)
        return float(mu * norm.cdf(z) + sigma * norm.pdf(z))

    def std(self) -> float:
        if self.family != "normal":
            return float(self._scipy().std())
        mu, sigma = self.params
        if sigma == 0:
            return 0.0
        from scipy.stats import norm

        z = mu / sigma  # E[max(X, 0)²] - E[max(X, 0)]²
        second = (mu * mu + sigma * sigma) * norm.cdf(z) + mu * sigma * norm.pdf(z)
        return float(math.sqrt(max(second - self.mean() ** 2, 0.0)))

    def describe(self) -> str:
        names = PARAMETERS[self.family]
        return f"{self.family}(" + ", ".join(f"{n}={p:.4g}" for n, p in
                                             zip(names, self.params, strict=True)) + ")"

    # -- JSON ----------------------------------------------------------------------

    def to_json(self) -> list[str | float]:
        return [self.family, *self.params]

    @classmethod
    def from_json(cls, data: object) -> Distribution:
        """The distribution ``[family, params…]`` (as :meth:`to_json` writes) describes;
        :class:`VariabilityError` saying what to give otherwise."""
        if not (isinstance(data, list) and data and isinstance(data[0], str)):
            raise VariabilityError(f"a distribution must be [family, parameters…] with family "
                                   f"one of {', '.join(FAMILIES)}, got {data!r:.80}")
        return cls(data[0], tuple(data[1:]))

    @classmethod
    def from_gap_fit(cls, gap_fit: GapFit) -> Distribution:
        return cls(gap_fit.family, gap_fit.params)


@dataclasses.dataclass(frozen=True)
class Fit:
    """A distribution fitted to samples: its KS distance from them, how many,
    and where they were pooled from (one op, its kind in the class, the class)."""

    distribution: Distribution
    ks: float
    samples: int
    pooled: str  # "op" | "kind" | "class"

    def __post_init__(self) -> None:
        if self.pooled not in POOLINGS:
            raise VariabilityError(f"a fit's samples are pooled by {', '.join(POOLINGS)}, "
                                   f"not {self.pooled!r}")

    def to_gap_fit(self) -> GapFit:
        return GapFit(self.distribution.family, self.distribution.params, self.ks,
                      self.samples, self.pooled)

    @classmethod
    def from_gap_fit(cls, gap_fit: GapFit) -> Fit:
        return cls(Distribution.from_gap_fit(gap_fit), gap_fit.ks, gap_fit.samples,
                   gap_fit.pooled)


def fit(samples: Sequence[float], pooled: str = "op") -> Fit:
    """The family of :data:`FAMILIES` nearest ``samples`` by Kolmogorov–Smirnov
    distance, with its maximum-likelihood parameters (gamma and lognormal
    with loc 0: graph/fits.py says why).  Fewer than :data:`MIN_SAMPLES`
    samples, or any not finite or negative: :class:`VariabilityError`."""
    x = np.asarray(samples, dtype=np.float64).ravel()
    if len(x) < MIN_SAMPLES:
        raise VariabilityError(f"fitting a distribution needs at least {MIN_SAMPLES} samples, "
                               f"got {len(x)}: profile more iterations")
    if not np.all(np.isfinite(x)) or float(x.min()) < 0:
        raise VariabilityError("fitting a distribution needs finite samples >= 0 (relative "
                               "compute times)")
    # (fit_samples reads any array: np.asarray; graph/fits.py annotates a Sequence)
    return Fit.from_gap_fit(fit_samples(cast(Sequence[float], x), pooled))
