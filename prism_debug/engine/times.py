"""Arithmetic on a class's times, which are a scalar while its ranks agree and a
numpy array once anything sets them apart (the replay engine's fast path)."""

from __future__ import annotations

from typing import overload

import numpy as np
from numpy.typing import NDArray

Time = float | NDArray[np.float64]


@overload
def max_over(times: NDArray[np.float64], axes: tuple[int, ...]) -> NDArray[np.float64]: ...


@overload
def max_over(times: Time, axes: tuple[int, ...]) -> Time: ...


def max_over(times: Time, axes: tuple[int, ...]) -> Time:
    """Each group's latest time: the max over the family's axes, kept as size-1 dims."""
    if not isinstance(times, np.ndarray):
        return times
    latest: NDArray[np.float64] = times.max(axis=axes, keepdims=True)
    return latest


def maximum(a: Time, b: Time) -> Time:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a > b else b


def least(times: Time) -> float:
    return float(times.min()) if isinstance(times, np.ndarray) else times


def squeeze(times: Time) -> Time:
    """A per-rank array whose ranks all agree, as a scalar (the fast path)."""
    if isinstance(times, np.ndarray):
        first = times.flat[0]
        if (times == first).all():
            return float(first)
    return times


def at(times: Time, index: tuple[int, ...], shape: tuple[int, ...]) -> float:
    """One rank's time, ``times`` standing for an array of ``shape``."""
    if isinstance(times, np.ndarray):
        if times.ndim == len(index):  # (indexing size-1 axes at 0 beats broadcast_to)
            return float(times[tuple(0 if n == 1 else i
                                     for i, n in zip(index, times.shape, strict=True))])
        return float(np.broadcast_to(times, shape)[index])
    return float(times)


def roll(times: Time, step: int, axis: int | None) -> Time:
    if axis is None or not isinstance(times, np.ndarray):
        return times
    return np.roll(times, step, axis=axis)
