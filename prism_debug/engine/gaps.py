"""Where the event loop's gaps come from: the compute model, asked once per
class and iteration, for every class in class order when the first class
reaches the iteration (so the draws do not depend on how the replay is
driven), and, under a per-rank model, laid out once there (:mod:`.sampling`)
with the uniforms of the iteration's population maxima and, once per class
before its first gaps, the model's persistent per-rank factors."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.compute import ComputeModel, Gaps, RankFactors
from prism_debug.engine.layout import Layout
from prism_debug.engine.sampling import Draws, lay_out
from prism_debug.engine.state import ClassState
from prism_debug.engine.times import Time
from prism_debug.graph.execution import ClassProgram

# what a class takes for one iteration: its gaps, each gap's largest value
# (per-rank models only: empty for the others), and the draws of each op that needs them
Drawn = tuple[Gaps, Sequence[float], dict[int, Draws]]


def keyed_generator(seed: int, class_id: int, iteration: int, stream: int
                    ) -> np.random.Generator:
    """The generator of one class, iteration and stream (0: gaps, 1: the
    population maxima's uniforms, 2: per-rank factors), a function of the
    seed and the key alone: what several real ranks' replicas draw, so the
    draws do not depend on when each replica makes them."""
    return np.random.Generator(np.random.SFC64(np.random.SeedSequence(
        seed, spawn_key=(class_id, iteration, stream))))


class GapSource:
    def __init__(self, layout: Layout, compute: ComputeModel, rng: np.random.Generator,
                 states: list[ClassState], keyed_seed: int | None = None) -> None:
        """``keyed_seed`` (not None: several real ranks) draws from
        :func:`keyed_generator` instead of ``rng``, which one real rank keeps
        using as always (seeded timelines do not move)."""
        self.layout = layout
        self._compute = compute
        self._rng = rng
        self._keyed_seed = keyed_seed
        # the population maxima's uniforms come from a generator of their own,
        # so the compute model's draws are the unsampled engine's
        self._uniform_rng = rng.spawn(1)[0]
        self._states = states
        # a per-rank model: gaps are laid out once per class and iteration
        self.per_rank = bool(getattr(compute, "per_rank", False))
        self._base_gaps: dict[tuple[int, int], tuple[float, ...]] = {}
        # (class id, iteration, the steady state's past the warm-up) -> each op
        # needing draws, with the shape of its groups' draws
        self._needing: dict[tuple[int, int], list[tuple[int, tuple[int, ...]]]] = {}
        # iteration -> class id -> what it takes, until the class takes it
        self._ahead: dict[int, dict[int, Drawn]] = {}

    def take(self, state: ClassState) -> None:
        """Give the class its gaps for its iteration."""
        iteration = state.iteration
        ahead = self._ahead.get(iteration)
        if ahead is None:
            ahead = self._ahead[iteration] = {
                s.program.class_id: self._ask(s.program, iteration) for s in self._states}
        state.gaps, state.gap_tops, state.uniforms = ahead.pop(state.program.class_id)
        if not ahead:
            del self._ahead[iteration]

    def draw_rank_factors(self) -> None:
        """The model's persistent per-rank factors, once per class in class order."""
        draw: RankFactors | None = getattr(self._compute, "rank_factors", None)
        for state in self._states:
            class_id = state.program.class_id
            factors = None if draw is None else draw(class_id, self.layout.model_shape,
                                                     self._generator(class_id, 0, 2, self._rng))
            if factors is not None:
                factors = np.asarray(factors, dtype=float)
                state.rank_factors = self.layout.internal_drawn(factors) if factors.ndim \
                    else float(factors)
            state.forget_factors()

    def _generator(self, class_id: int, iteration: int, stream: int,
                   shared: np.random.Generator) -> np.random.Generator:
        if self._keyed_seed is None:
            return shared
        return keyed_generator(self._keyed_seed, class_id, iteration, stream)

    def relayout(self, column_map: Callable[[Time], Time]) -> None:
        """The layout changed: re-lay out what is drawn and not yet taken."""
        for ahead in self._ahead.values():
            for class_id, (gaps, tops, uniforms) in ahead.items():
                ahead[class_id] = (_map_gaps(gaps, column_map), tops, uniforms)

    def _ask(self, program: ClassProgram, iteration: int) -> Drawn:
        key = (program.class_id, min(iteration, len(program.warmup) + 1))
        base = self._base_gaps.get(key)
        if base is None:
            base = self._base_gaps[key] = tuple(float(e.gap_s) for e in program.events(iteration))
        shape = self.layout.model_shape if self.per_rank else self.layout.local_shape
        gaps = self._compute.gaps_s(program.class_id, iteration, base, shape,
                                    self._generator(program.class_id, iteration, 0, self._rng))
        if len(gaps) != len(base):
            raise ValueError(f"the compute model gave {len(gaps)} gaps for the {len(base)} "
                             f"events of class {program.class_id} in iteration {iteration}")
        if not self.per_rank:
            return gaps, (), {}
        gaps, tops = lay_out(gaps, shape, self.layout)
        return gaps, tops, self._uniforms(program, iteration, key)

    def _uniforms(self, program: ClassProgram, iteration: int, key: tuple[int, int]
                  ) -> dict[int, Draws]:
        """The draws of each op whose groups span sampled columns (see
        :mod:`.sampling`): one normal for the op, one per group."""
        if not self.layout.sampled:
            return {}
        needing = self._needing.get(key)
        if needing is None:
            ops = self._states[program.class_id].ops
            last = len(self.layout.order) - 1
            needing = self._needing[key] = [
                (e.op, tuple(1 if a in ops[e.op].axes or a == last else n
                             for a, n in enumerate(self.layout.class_shape)))
                for e in program.events(iteration)
                if e.action == "issue" and ops[e.op].population]
        rng = self._generator(program.class_id, iteration, 1, self._uniform_rng)
        normals = rng.standard_normal(sum(1 + math.prod(s) for _, s in needing))
        draws: dict[int, Draws] = {}
        at = 0
        for op, shape in needing:
            size = math.prod(shape)
            draws[op] = (float(normals[at]), normals[at + 1:at + 1 + size].reshape(shape))
            at += 1 + size
        return draws


def map_drawn(state: ClassState, column_map: Callable[[Time], Time]) -> None:
    """Re-lay out a class's gaps and per-rank factors (the layout changed)."""
    state.gaps = _map_gaps(state.gaps, column_map)
    if state.rank_factors is not None:
        state.rank_factors = column_map(state.rank_factors)


def _map_gaps(gaps: Gaps, column_map: Callable[[Time], Time]) -> Gaps:
    if isinstance(gaps, np.ndarray):
        # a column map takes an array to an array (it only re-lays out columns)
        return cast(NDArray[np.float64], column_map(gaps))
    if all(g.__class__ is float for g in gaps):
        return gaps
    return [column_map(g) for g in gaps]
