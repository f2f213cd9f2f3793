"""The compute one Monte Carlo sample replays with: the stochastic compute
model with its draws keyed by (sample, class, iteration), and the same draws
with some of their variance removed (tail attribution).  Pure core (numpy).

Keyed draws are what makes attribution's differences exact: a replay with
class 3's variance removed draws every other class's gaps from the same
generators as the replay with it, whatever else the engine draws in between
(its population maxima draw from the engine's own generator, and a class that
turns scalar draws nothing there), so the two replays differ only by what was
removed — common random numbers, not two independent estimates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.replay import generator
from prism_debug.graph.execution import ExecutionGraph
from prism_debug.variability.model import Gaps

# how many draws per event the variance probe takes: its means (what a gap
# with its variance removed computes) carry a relative error of cv/√PROBE_DRAWS
PROBE_DRAWS = 1 << 12
_RANK_FACTORS = 0  # the key of a class's persistent factors (iterations count from 1)
# a model's rank_factors(class_id, shape, rng), where it has one
RankFactors = Callable[[int, tuple[int, ...], np.random.Generator], NDArray[np.float64] | None]


class StochasticModel(Protocol):
    """A stochastic :class:`~prism_debug.engine.compute.ComputeModel` (a
    :class:`~prism_debug.variability.StochasticCompute`) as samples draw from
    it: its gaps, and its ranks' persistent factors where it has a
    ``rank_factors`` (looked up, not required)."""

    def gaps_s(self, class_id: int, iteration: int, base_gaps_s: tuple[float, ...],
               shape: tuple[int, ...], rng: np.random.Generator) -> Gaps: ...


def event_kinds(graph: ExecutionGraph, class_id: int, iteration: int) -> tuple[str, ...]:
    """The op kind each event of ``class_id``'s program in ``iteration`` waits
    for or issues (``end`` for the iteration's end), as ``--variability op=``
    names them."""
    program = graph.programs[class_id]
    return tuple("end" if e.action == "end" else program.ops[e.op].kind
                 for e in program.events(iteration))


@dataclasses.dataclass(frozen=True)
class Removal:
    """What a replay runs without: the variance of these classes and of the
    gaps before these op kinds, each such gap set to its expected value."""

    classes: frozenset[int] = frozenset()
    op_kinds: frozenset[str] = frozenset()

    def describe(self) -> str:
        return ", ".join([*(f"class {c}" for c in sorted(self.classes)),
                          *(f"op {k}" for k in sorted(self.op_kinds))]) or "nothing"


@dataclasses.dataclass(frozen=True)
class GapMoments:
    """Mean and variance of every event's gap, per class and distinct
    iteration program (warm-up iterations, then the steady one)."""

    means: dict[tuple[int, int], NDArray[np.float64]]  # (class, iteration) -> per event, seconds
    variances: dict[tuple[int, int], NDArray[np.float64]]  # seconds²
    steady_iteration: int  # the iteration whose program every later one repeats

    def key(self, class_id: int, iteration: int) -> tuple[int, int]:
        return class_id, min(iteration, self.steady_iteration)


def probe_moments(graph: ExecutionGraph, compute: StochasticModel, seed: int = 0) -> GapMoments:
    """Each event's mean and variance, from :data:`PROBE_DRAWS` draws of
    ``compute`` (one call over that many ranks, so draws shared by a class's
    ranks are drawn afresh by repeating the call instead)."""
    steady = 1 + max(len(p.warmup) for p in graph.programs)
    means: dict[tuple[int, int], NDArray[np.float64]] = {}
    variances: dict[tuple[int, int], NDArray[np.float64]] = {}
    rng = generator([seed, 0x9E37])
    for program in graph.programs:
        for iteration in range(1, steady + 1):
            base = tuple(e.gap_s for e in program.events(iteration))
            repeats, width = 16, PROBE_DRAWS // 16
            draws = np.stack([_per_event(compute.gaps_s(program.class_id, iteration, base,
                                                        (width,), rng), len(base), width)
                              for _ in range(repeats)], axis=1)  # (events, repeats, width)
            flat = draws.reshape(len(base), -1)
            means[program.class_id, iteration] = flat.mean(axis=1)
            variances[program.class_id, iteration] = flat.var(axis=1)
    return GapMoments(means, variances, steady)


def _per_event(gaps: Gaps, events: int, width: int) -> NDArray[np.float64]:
    rows = [np.broadcast_to(np.asarray(g, dtype=float), (width,)) for g in list(gaps)]
    if len(rows) != events:
        raise AssertionError(f"a compute model answered {len(rows)} gaps for {events} events")
    return np.stack(rows)


class SampleCompute:
    """``inner`` (a stochastic :class:`~prism_debug.engine.compute.ComputeModel`)
    for one sample: each (class, iteration) draws from its own generator,
    seeded from ``entropy`` (the prediction's seed and the sample's number)
    and the pair, in place of the engine's; gaps ``removal`` names are set to
    their mean (from ``moments``) and a removed class's persistent factors
    to none.  The draws are taken either way, so what is kept is unchanged."""

    per_rank = True

    def __init__(self, graph: ExecutionGraph, inner: StochasticModel, entropy: tuple[int, ...],
                 removal: Removal | None = None, moments: GapMoments | None = None) -> None:
        if removal is not None and moments is None:
            raise AssertionError("removing variance needs the gaps' moments")
        self.graph = graph
        self.inner = inner
        self.entropy = entropy
        self.removal = removal
        self.moments = moments
        self._removed_events: dict[tuple[int, int], tuple[int, ...]] = {}

    def gaps_s(self, class_id: int, iteration: int, base_gaps_s: tuple[float, ...],
               shape: tuple[int, ...], rng: np.random.Generator) -> Gaps:
        own = generator([*self.entropy, class_id, iteration])
        gaps = self.inner.gaps_s(class_id, iteration, base_gaps_s, shape, own)
        removal, moments = self.removal, self.moments
        if removal is None:
            return gaps
        assert moments is not None  # __init__ refuses a removal without them
        removed = self._removed(class_id, iteration, removal, moments)
        if not removed:
            return gaps
        means = moments.means[moments.key(class_id, iteration)]
        entries = list(gaps)
        for index in removed:
            entries[index] = float(means[index])
        return entries

    def rank_factors(self, class_id: int, shape: tuple[int, ...],
                     rng: np.random.Generator) -> NDArray[np.float64] | None:
        found: RankFactors | None = getattr(self.inner, "rank_factors", None)
        if found is None:
            return None
        factors = found(class_id, shape, generator([*self.entropy, class_id, _RANK_FACTORS]))
        if self.removal is not None and class_id in self.removal.classes:
            return None
        return factors

    def _removed(self, class_id: int, iteration: int, removal: Removal,
                 moments: GapMoments) -> tuple[int, ...]:
        key = moments.key(class_id, iteration)
        found = self._removed_events.get(key)
        if found is None:
            kinds = event_kinds(self.graph, class_id, iteration)
            whole = class_id in removal.classes
            found = self._removed_events[key] = tuple(
                i for i, kind in enumerate(kinds) if whole or kind in removal.op_kinds)
        return found
