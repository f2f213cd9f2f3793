"""The maximum of n iid normals: the closed forms a collective's wait is
checked against (a collective starts when the last of its n members
arrives), and what the engine draws an unsampled population's maximum from.

For M the maximum of n standard normals, with F(x) = Φ(x)^n its cdf:

    E[M]  = ∫₀^∞ (1 - Φ(x)^n) dx - ∫₋∞⁰ Φ(x)^n dx
    E[M²] = ∫₀^∞ 2x ((1 - Φ(x)^n) + Φ(-x)^n) dx
    the q quantile = Φ⁻¹(q^{1/n})

integrated with scipy.integrate.quad, Φ(x)^n taken as exp(n·log Φ(x))
(scipy.special.log_ndtr) so it stays exact where Φ(x) rounds to 1, and
the integral split at M's mode Φ⁻¹(1 - 1/n) so that quad sees the narrow
step 1 - Φ^n makes at large n (1e-10 relative at n = 10⁶).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable


def expected_max_normal(n: int, mean: float, std: float) -> float:
    """E[max of ``n`` iid normal(``mean``, ``std``²)]."""
    _check(n, std)
    return mean + std * _standard_moments(n)[0]


def std_max_normal(n: int, mean: float, std: float) -> float:
    """The standard deviation of the max of ``n`` iid normal(``mean``, ``std``²)."""
    _check(n, std)
    first, second = _standard_moments(n)
    return std * math.sqrt(max(second - first * first, 0.0))


def max_normal_quantile(n: int, q: float, mean: float, std: float) -> float:
    """The ``q`` quantile of the max of ``n`` iid normals: Φ⁻¹(q^{1/n})."""
    from scipy.special import ndtri_exp

    _check(n, std)
    if not 0 < q < 1:
        raise ValueError(f"a quantile is in (0, 1), got {q}")
    return mean + std * float(ndtri_exp(math.log(q) / n))  # q^{1/n} without rounding to 1


def _check(n: int, std: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a whole number >= 1, got {n!r}")
    if not std >= 0:
        raise ValueError(f"std must be >= 0, got {std!r}")


def _standard_moments(n: int) -> tuple[float, float]:
    """E[M] and E[M²] for M the max of ``n`` standard normals."""
    from scipy.integrate import quad
    from scipy.special import log_ndtr, ndtri

    def below(x: float) -> float:  # Φ(x)^n
        return math.exp(n * float(log_ndtr(x)))

    def above(x: float) -> float:  # 1 - Φ(x)^n, exact where Φ(x)^n is near 1
        return -math.expm1(n * float(log_ndtr(x)))

    mode = float(ndtri(1 - 1 / n)) if n > 1 else 0.0
    # 1 - Φ(x)^n < n·Φ(-x) < 1e-30 beyond x = 11.5 + √(2 ln n): nothing left to integrate
    top = 11.5 + math.sqrt(2 * math.log(n))
    points = sorted({0.0, max(mode - 1, 0.0), max(mode, 0.0), mode + 1, top})
    options = dict(epsabs=1e-13, epsrel=1e-12, limit=200)

    def positive(f: Callable[[float], float]) -> float:  # ∫₀^top, piece by piece
        return float(sum(quad(f, a, b, **options)[0] for a, b in itertools.pairwise(points)))

    first = positive(above) - quad(below, -math.inf, 0.0, **options)[0]
    second = positive(lambda x: 2 * x * (above(x) + below(-x)))
    return first, second
