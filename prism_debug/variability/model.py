"""Stochastic compute: the replay engine's ComputeModel (engine/compute.py)
that draws every virtual rank's gaps from the stated variability.

Everything that does not change between iterations is decided once, when
the model is built: for each class program (each warm-up iteration's, and
the steady one) which events' gaps vary and by which distribution — the
last rule covering the class and the event's op kind (``fitted``: the
graph's fit of that steady event).  A gap shorter than
:data:`MIN_VARYING_GAP_S` never draws: it is the host issuing ops back to
back (a launch, a few µs), not device work, and it stays as profiled — on
the bundled example more than half the gaps, holding 0.5 % of the compute
and 0.002 % of its variance at any cv, so drawing them would double the cost
for nothing measurable.  Nor does a constant distribution (cv=0) draw.  Warm-up
iterations follow the ``cv`` rules like steady ones; ``fitted`` leaves them
deterministic (each warm-up gap was seen once: nothing was fitted).

Per call, one block of draws per family present — normal, gamma,
lognormal, in that order, each with per-row parameters — so the same seed
gives the same timeline however the engine is driven.  Each row's draws
multiply that event's base gap; gaps that do not vary stay floats (the
engine's scalar fast path).  The persistent per-rank factor
(``rank-cv``) is not in these gaps: the engine asks :meth:`rank_factors`
once per class and multiplies every gap of the class by it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph
from prism_debug.graph.fits import MIN_GAP_S, GapFit
from prism_debug.variability.distributions import FAMILIES, Distribution
from prism_debug.variability.spec import END, Rule, Variability

# Shorter gaps are the host issuing ops, not device work: they do not vary
# (the graph builder fits none below it either).
MIN_VARYING_GAP_S = MIN_GAP_S

#: one class's gaps in an iteration, as the engine's ComputeModel answers: an
#: entry per event (a float, or an array over the class's ranks), or one array
#: (events, *shape)
Gaps = Sequence[float | NDArray[np.float64]] | NDArray[np.float64]


@dataclasses.dataclass(frozen=True)
class _Block:
    """The rows of one family's draws and their parameters, as column
    vectors that broadcast over a class's shape."""

    family: str
    rows: NDArray[np.intp]  # event indices, ascending
    params: tuple[NDArray[np.float64], ...]  # one (len(rows), 1) array per parameter


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What varies in one class program: its blocks (empty: deterministic)."""

    events: int
    blocks: tuple[_Block, ...]


class StochasticCompute:
    """Every rank's gaps drawn per op and iteration (a ComputeModel)."""

    per_rank = True  # its gaps differ between ranks: the engine samples columns

    def __init__(self, graph: ExecutionGraph, variability: Variability) -> None:
        variability.check(graph)
        self.variability = variability
        fits = getattr(graph, "gap_fits", {}) or {}
        self._steady: list[_Plan] = []
        self._warmup: list[tuple[_Plan, ...]] = []
        self._rank: list[Distribution | None] = []
        for program in graph.programs:
            steady_fits = fits.get(program.class_id, ())
            self._steady.append(_plan(program, program.steady, variability.rules, steady_fits))
            self._warmup.append(tuple(_plan(program, events, variability.rules, ())
                                      for events in program.warmup))
            self._rank.append(_rank_distribution(program.class_id, variability.rules))

    def varies(self, class_id: int) -> bool:
        """Whether any gap of the class, or its ranks' factor, is drawn."""
        return self._rank[class_id] is not None or any(
            plan.blocks for plan in (self._steady[class_id], *self._warmup[class_id]))

    def gaps_s(self, class_id: int, iteration: int, base_gaps_s: tuple[float, ...],
               shape: tuple[int, ...], rng: np.random.Generator) -> Gaps:
        """``base_gaps_s`` itself where nothing of this iteration varies (the
        engine's scalar fast path), one array (events, *shape) where every gap
        varies alike, else the gaps that do not vary as floats beside arrays
        of ``shape`` for those that do."""
        warmup = self._warmup[class_id]
        plan = warmup[iteration - 1] if iteration <= len(warmup) else self._steady[class_id]
        if not plan.blocks:
            return base_gaps_s
        if len(base_gaps_s) != plan.events:
            raise ValueError(f"class {class_id} iteration {iteration}: {len(base_gaps_s)} "
                             f"gaps for a program of {plan.events} events")
        base = np.asarray(base_gaps_s, dtype=np.float64).reshape((-1,) + (1,) * len(shape))
        if len(plan.blocks) == 1 and len(plan.blocks[0].rows) == plan.events:
            # every gap drawn from one family (the usual case): the block is the answer
            return _gaps(plan.blocks[0], base, (plan.events, *shape), rng)
        out: list[float | NDArray[np.float64]] = list(base_gaps_s)
        for block in plan.blocks:
            drawn = _gaps(block, base[block.rows], (len(block.rows), *shape), rng)
            for row, event in enumerate(block.rows.tolist()):
                out[event] = drawn[row]
        return out

    def rank_factors(self, class_id: int, shape: tuple[int, ...], rng: np.random.Generator
                     ) -> NDArray[np.float64] | None:
        """The class's ranks' persistent factors (``rank-cv``), of ``shape``;
        None where its ranks have none.  The engine calls this once per class
        and multiplies every gap of the class by it."""
        distribution = self._rank[class_id]
        return None if distribution is None else distribution.draw(rng, shape)


def _rank_distribution(class_id: int, rules: Sequence[Rule]) -> Distribution | None:
    for rule in reversed(rules):  # the last rule stating rank-cv for the class
        # (rank_distribution is None where the rule states no rank-cv)
        if rule.covers_class(class_id) and (distribution := rule.rank_distribution()) is not None:
            return None if distribution.constant else distribution
    return None


def _plan(program: ClassProgram, events: Sequence[Event], rules: Sequence[Rule],
          fits: Sequence[GapFit | None]) -> _Plan:
    chosen: dict[int, Distribution] = {}
    for index, event in enumerate(events):
        if event.gap_s < MIN_VARYING_GAP_S:
            continue
        kind = END if event.action == "end" else program.ops[event.op].kind
        distribution = _distribution(program.class_id, kind, index, rules, fits)
        if distribution is not None and not distribution.constant:
            chosen[index] = distribution
    blocks = []
    for family in FAMILIES:
        rows = sorted(i for i, d in chosen.items() if d.family == family)
        if rows:
            params = np.array([chosen[i].params for i in rows], dtype=np.float64)
            blocks.append(_Block(family, np.array(rows),
                                 tuple(params[:, [k]] for k in range(params.shape[1]))))
    return _Plan(len(events), tuple(blocks))


def _distribution(class_id: int, kind: str, index: int, rules: Sequence[Rule],
                  fits: Sequence[GapFit | None]) -> Distribution | None:
    """The last rule's word on this gap: its cv, the graph's fit, or nothing."""
    for rule in reversed(rules):
        if rule.cv is None and not rule.fitted or not rule.covers(class_id, kind):
            continue
        if rule.fitted:
            fit = fits[index] if index < len(fits) else None
            return None if fit is None else Distribution.from_gap_fit(fit)
        return rule.noise()
    return None


def _gaps(block: _Block, base: NDArray[np.float64], size: tuple[int, ...],
          rng: np.random.Generator) -> NDArray[np.float64]:
    """One block's gaps: its rows' ``base`` gaps (a column) times factors drawn
    as Distribution.draw draws them, a parameter per row; the base gap is folded
    into the scale (and a lognormal's into its exponent) to spare a pass."""
    extra = (1,) * (len(size) - 2)  # the rows' parameters broadcast over the class's shape
    params = [p.reshape(p.shape + extra) for p in block.params]
    if block.family == "normal":
        loc, scale = params
        out = rng.standard_normal(size)
        out *= scale * base
        out += loc * base
        return np.maximum(out, 0.0, out=out)
    if block.family == "gamma":
        a, loc, scale = params
        out = rng.standard_gamma(np.broadcast_to(a, size))
        out *= scale * base
    else:
        s, loc, scale = params
        out = rng.standard_normal(size)
        out *= s
        out += np.log(scale * base)  # (a gap here is never 0: zero gaps do not draw)
        np.exp(out, out=out)
    if np.any(loc):
        out += loc * base
    return out


def draw_cost_us(compute: StochasticCompute, graph: ExecutionGraph, shape: tuple[int, ...],
                 repeats: int = 50, seed: int = 0) -> float:
    """Microseconds one :meth:`StochasticCompute.gaps_s` call costs, the best
    of ``repeats`` rounds over every class's steady program (a benchmark's helper)."""
    import time

    rng = np.random.default_rng(seed)
    bases = [tuple(e.gap_s for e in p.steady) for p in graph.programs]
    iteration = 1 + max((len(p.warmup) for p in graph.programs), default=0)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for class_id, base in enumerate(bases):
            compute.gaps_s(class_id, iteration, base, shape, rng)
        best = min(best, time.perf_counter() - start)
    return best / len(bases) * 1e6
