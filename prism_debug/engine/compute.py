"""How long the virtual peers compute between ops: the :class:`ComputeModel`
seam of the replay engine, and its default, the graph's own gaps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.times import Time

#: what a compute model answers for one class and iteration: a gap per event,
#: or (a per-rank model) one array of shape ``(n_events, *shape)``
Gaps = Sequence[Time] | NDArray[np.float64]


class ComputeModel(Protocol):
    def gaps_s(self, class_id: int, iteration: int, base_gaps_s: tuple[float, ...],
               shape: tuple[int, ...], rng: np.random.Generator) -> Gaps:
        """The compute before each event of class ``class_id``'s program in
        ``iteration`` (counted from 1), in seconds; ``slow`` factors multiply
        it afterwards.

        ``base_gaps_s[i]`` is the graph's gap before event ``i``; the answer
        has one entry per event.  An entry is a float when every rank of the
        class computes that long (a Python float keeps the class's times
        scalar: the fast path), or an array over the class's slice of the
        mesh when its ranks differ: ``shape`` is the mesh's shape with the
        class axis removed, in mesh axis order, and the array has that shape
        or size 1 along axes its ranks agree on (the class's times are then
        arrays until its ranks agree again at an iteration's end).

        The engine asks once per class and iteration, for every class in
        class order when the first class reaches the iteration, so the draws
        from ``rng`` (the one generator the engine owns and seeds) do not
        depend on how the replay is driven.  It reads entry ``i`` once, when
        the class reaches event ``i``; a lazy sequence that draws then should
        draw from a generator it spawned from ``rng`` in this call, for the
        same reason.

        A model whose ranks all draw their own gaps says so with ``per_rank
        = True`` (see :mod:`.sampling`).  The engine then simulates only a
        sample of the columns nothing else sets apart: ``shape`` has the
        columns' axis (the largest class axis) as wide as the columns
        simulated, the answer may also be one array of shape
        ``(n_events, *shape)``, it is laid out once per class and iteration,
        and the first iteration's draws wait for the replay's first step (so
        perturbations set before it shape them).  Such a model may have
        ``rank_factors(class_id, shape, rng)``: persistent per-rank factors
        (or None), asked once per class before its first gaps, that
        multiply its compute like ``slow``.
        """


class RankFactors(Protocol):
    """A per-rank model's optional ``rank_factors`` (see :meth:`ComputeModel.gaps_s`):
    the class's persistent per-rank factors, of ``shape``, or None."""

    def __call__(self, class_id: int, shape: tuple[int, ...],
                 rng: np.random.Generator) -> Time | None: ...


class GraphCompute:
    """Every rank of a class computes the graph's gap: the profiled times,
    deterministic (the default)."""

    def gaps_s(self, class_id: int, iteration: int, base_gaps_s: tuple[float, ...],
               shape: tuple[int, ...], rng: np.random.Generator) -> Sequence[Time]:
        return base_gaps_s
