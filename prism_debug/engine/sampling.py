"""Every rank stochastic at scale: the compute model's gaps laid out once per
class and iteration, and group maxima over sampled columns that stand for the
whole population of columns.

Under a per-rank compute model (``per_rank = True``) the engine simulates the
explicit columns and a sample of the others (a sampled :class:`.Layout`).  A
group max over the columns' axis must be the max over *every* column of the
group: the simulated columns' max, and the max of the N unsampled ones.  Those
are iid (statistically identical columns, independent draws), so their max is
drawn as one value: with mean m and standard deviation s (ddof=1) of the
sample's values, ``m + s·Φ⁻¹(u^(1/N))`` is the u-quantile of the max of N
normals.  The uniforms are drawn with the class's gaps, from a generator of
their own (the compute model's draws are those of the unsampled engine), as
normals: one W per op and iteration and one E per group, u = Φ(√ρ·W +
√(1-ρ)·E) with ρ the mean correlation between the groups' values over the
sample.  Ranks of one column are tied by the ops inside the column, so the
groups' maxima rise and fall together: one uniform for all of them (ρ = 1)
makes a later max over the groups too low, independent ones (ρ = 0) too
high (measured on the bundled example at 8,192 ranks: -0.18 % and +0.12 %
of the mean iteration time).

Exactness: with every column simulated (N = 0) nothing is drawn and the
engine is the per-rank engine; otherwise the unsampled maxima are as good as
the normal fitted to the sample, which sums of many gaps are close to.
"""

from __future__ import annotations

import math
from typing import cast, overload

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.compute import Gaps
from prism_debug.engine.layout import Layout
from prism_debug.engine.times import Time, max_over

# an op's W, and its groups' E (shaped like its group maxima)
Draws = tuple[float, NDArray[np.float64]]


@overload
def group_max(times: NDArray[np.float64], axes: tuple[int, ...], layout: Layout,
              draws: Draws | None) -> NDArray[np.float64]: ...


@overload
def group_max(times: Time, axes: tuple[int, ...], layout: Layout, draws: Draws | None) -> Time: ...


def group_max(times: Time, axes: tuple[int, ...], layout: Layout, draws: Draws | None) -> Time:
    """Each group's latest time over ``axes`` (size-1 dims kept), the
    unsampled columns' max included when ``axes`` hold the columns' axis
    (the last) and ``draws`` are the op's."""
    if draws is None or not layout.unsampled or not isinstance(times, np.ndarray) \
            or times.shape[-1] == 1:
        return max_over(times, axes)  # every column agrees, or the group is inside one
    inner = tuple(a for a in axes if a != times.ndim - 1)
    per_column = times.max(axis=inner, keepdims=True) if inner else times
    latest: NDArray[np.float64] = np.maximum(per_column.max(axis=-1, keepdims=True),
                                             unsampled_max(per_column, layout, draws))
    return latest


def unsampled_max(per_column: NDArray[np.float64], layout: Layout, draws: Draws
                  ) -> NDArray[np.float64]:
    """The max of the unsampled columns, one per group: ``per_column`` is each
    column's latest time in each group."""
    sample = per_column[..., layout.sample]
    n = sample.shape[-1]
    mean = sample.sum(axis=-1, keepdims=True) / n
    spread = sample - mean
    sd = np.sqrt((spread * spread).sum(axis=-1, keepdims=True) / (n - 1))
    together, alone = draws
    groups = mean.size
    if groups > 1:
        # (axes along which the times agree hold one group: their first draw)
        alone = alone[tuple(slice(0, k) for k in mean.shape)]
        unit = (spread / np.where(sd > 0, sd, 1.0)).reshape(groups, n)
        correlation = (unit @ unit.T) / (n - 1)
        mean_correlation = (correlation.sum() - np.trace(correlation)) / (groups * (groups - 1))
        rho = min(max(float(mean_correlation), 0.0), 1.0)
        z: Time = math.sqrt(rho) * together + math.sqrt(1.0 - rho) * alone
    else:
        z = together
    # (imported here: scipy costs every rank and controller 0.15 s to import, and
    # only stochastic peers beyond the sampled columns need it; its special
    # functions come untyped: ndtri of an array is one)
    from scipy.special import ndtr, ndtri

    maxima: NDArray[np.float64] = mean + sd * ndtri(ndtr(z) ** (1.0 / layout.unsampled))
    return maxima


def lay_out(gaps: Gaps, shape: tuple[int, ...], layout: Layout) -> tuple[Gaps, list[float]]:
    """A compute model's answer for one class and iteration, in the internal
    axis order once (not per event), and each gap's largest value (what the
    wait shortcut adds up): floats stay floats (the fast path)."""
    if isinstance(gaps, np.ndarray) and gaps.ndim == len(shape) + 1:
        block = np.asarray(gaps, dtype=float)
        _check(block.shape[1:], shape)
        tops = block.reshape(len(block), -1).max(axis=1).tolist()
        return layout.internal_drawn(block, leading=1), tops
    # floats (gaps alike on every rank: the fast path) beside arrays of
    # ``shape``: the arrays laid out together, once
    drawn = [i for i, g in enumerate(gaps) if g.__class__ is not float]
    if not drawn or not all(type(gap := gaps[i]) is np.ndarray and gap.shape == shape
                            for i in drawn):
        return _lay_out_each(gaps, shape, layout)
    block = np.stack([gaps[i] for i in drawn]).astype(float, copy=False)
    block_tops = block.reshape(len(block), -1).max(axis=1).tolist()
    block = layout.internal_drawn(block, leading=1)
    laid: list[Time] = list(gaps)
    # floats where nothing was drawn (``__class__ is float`` above); the drawn
    # gaps' tops go in below
    tops = cast(list[float], list(gaps))
    for row, i in enumerate(drawn):
        laid[i], tops[i] = block[row], block_tops[row]
    return laid, tops


def _lay_out_each(gaps: Gaps, shape: tuple[int, ...], layout: Layout
                  ) -> tuple[list[Time], list[float]]:
    laid: list[Time] = []
    tops: list[float] = []
    for gap in gaps:
        if gap.__class__ is not float:
            gap = np.asarray(gap, dtype=float)
            if not gap.ndim:
                gap = float(gap)
        if isinstance(gap, float):  # (a float itself by now, or an array of 1 or more dims)
            laid.append(gap)
            tops.append(gap)
            continue
        _check(gap.shape, shape)
        laid.append(layout.internal_drawn(gap))
        tops.append(float(gap.max()))
    return laid, tops


def _check(got: tuple[int, ...], shape: tuple[int, ...]) -> None:
    if len(got) != len(shape) or any(g not in (1, s) for g, s in zip(got, shape, strict=True)):
        raise ValueError(f"a compute model's gaps must be floats or arrays over the class's "
                         f"slice of the mesh {shape}, got shape {got}")
