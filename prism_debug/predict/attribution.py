"""Which classes and op kinds make the tail: each one's share of the compute
variance, and how much p99 (and the mean) moves when its variance is removed
— the same samples replayed with those gaps at their mean (common random
numbers, :mod:`.draws`).  Pure core (numpy)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from prism_debug.graph.execution import ExecutionGraph
from prism_debug.predict.draws import GapMoments, Removal, event_kinds
from prism_debug.predict.stats import percentile

TOP_OP_KINDS = 3  # op kinds replayed without their variance: the largest shares


@dataclasses.dataclass(frozen=True)
class Contribution:
    removed: str  # "class 3", "op all_reduce"
    variance_share: float  # of one steady iteration's summed gap variance, over every class
    p99_change_s: float  # p99 without that variance minus p99 with it (< 0: it made the tail)
    mean_change_s: float


@dataclasses.dataclass(frozen=True)
class Attribution:
    samples: int  # replayed once more for each contribution
    replays: int  # samples × contributions: what attribution cost, in replays
    seconds: float
    cpu_seconds: float  # summed over the processes
    p99_s: float  # p99 of the iteration time over those samples, with every variance
    mean_s: float
    contributions: tuple[Contribution, ...]


def variance_shares(graph: ExecutionGraph, moments: GapMoments
                    ) -> tuple[dict[int, float], dict[str, float]]:
    """Each class's and each op kind's share of the steady iteration's gap
    variance, summed over every class's events (per rank: a class of many
    ranks counts as much as a class of few)."""
    by_class: dict[int, float] = {}
    by_kind: dict[str, float] = {}
    iteration = moments.steady_iteration
    for program in graph.programs:
        variances = moments.variances[moments.key(program.class_id, iteration)]
        by_class[program.class_id] = float(variances.sum())
        kinds = event_kinds(graph, program.class_id, iteration)
        for kind, variance in zip(kinds, variances, strict=True):  # one of each per event
            by_kind[kind] = by_kind.get(kind, 0.0) + float(variance)
    total = sum(by_class.values())
    if total <= 0:
        return {c: 0.0 for c in by_class}, {k: 0.0 for k in by_kind}
    return ({c: v / total for c, v in by_class.items()},
            {k: v / total for k, v in by_kind.items()})


def attribute(graph: ExecutionGraph, base_times: NDArray[np.float64], moments: GapMoments,
              replay: Callable[[Sequence[Removal]], tuple[list[NDArray[np.float64]], float]]
              ) -> Attribution:
    """The contributions of every class with variance and of the
    :data:`TOP_OP_KINDS` op kinds with the most; ``base_times`` are the
    samples' times with every variance, ``replay`` replays the same samples
    without each removal's (and says how much CPU that took)."""
    start = time.perf_counter()
    by_class, by_kind = variance_shares(graph, moments)
    kinds = sorted((k for k, v in by_kind.items() if v > 0), key=lambda k: -by_kind[k])
    removals = [Removal(classes=frozenset({c})) for c, v in by_class.items() if v > 0]
    removals += [Removal(op_kinds=frozenset({k})) for k in kinds[:TOP_OP_KINDS]]
    shares = [by_class[next(iter(r.classes))] if r.classes else by_kind[next(iter(r.op_kinds))]
              for r in removals]
    p99, mean = percentile(base_times, 99), float(np.mean(base_times))
    replayed, cpu = replay(removals) if removals else ([], 0.0)
    contributions = []
    # replay answers one array of times per removal
    for removal, share, times in zip(removals, shares, replayed, strict=True):
        contributions.append(Contribution(removal.describe(), share,
                                          percentile(times, 99) - p99,
                                          float(np.mean(times)) - mean))
    return Attribution(samples=len(base_times), replays=len(base_times) * len(removals),
                       seconds=time.perf_counter() - start, cpu_seconds=cpu, p99_s=p99,
                       mean_s=mean,
                       contributions=tuple(contributions))
