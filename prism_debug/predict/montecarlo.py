"""Monte Carlo over the whole world: ``prism-debug predict``.  Pure core
(numpy; the process pool is the standard library's).

Each sample is one replay of the whole world (the :class:`ReplayEngine`,
every virtual rank's compute drawn by the stochastic compute model) for the
graph's warm-up and K steady iterations; a sample's generators are seeded
from (seed, sample), so samples are independent and the same seed gives the
same prediction however many processes replay them.  The figures are one
rank's steady iteration times, pooled over samples and iterations, and its
time to K iterations, beside the deterministic replay's (the graph's own
gaps); faults from ``--perturb`` put a what-if in force on every replay, as
``replay --perturb`` does.  Tail attribution replays the first samples again
with one class's or one op kind's variance removed (:mod:`.draws`: the same
draws, so a difference in p99 is that variance's, not noise).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import cast

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.compute import ComputeModel
from prism_debug.engine.injection import apply_fault
from prism_debug.engine.loop import CostFn
from prism_debug.engine.replay import ReplayEngine
from prism_debug.errors import ConfigError
from prism_debug.faults import MISSING_ACTIONS, Action, Injection
from prism_debug.graph.execution import ExecutionGraph
from prism_debug.predict.attribution import attribute
from prism_debug.predict.draws import (
    GapMoments,
    Removal,
    SampleCompute,
    StochasticModel,
    probe_moments,
)
from prism_debug.predict.report import Prediction
from prism_debug.predict.stats import summarize
from prism_debug.variability import StochasticCompute, Variability

DEFAULT_SAMPLES = 1000
DEFAULT_ITERATIONS = 5
DEFAULT_SLOWDOWNS = (1.05, 1.1, 1.2)
# attribution replays this many samples (at most) once per class and top op kind
ATTRIBUTION_SAMPLES = 100
CHUNKS_PER_JOB = 4  # work units per process: an uneven chunk costs less at the end


def predict(graph: ExecutionGraph, cost: CostFn, variability: Variability, *,
            samples: int = DEFAULT_SAMPLES, iterations: int = DEFAULT_ITERATIONS, rank: int = 0,
            seed: int = 0, injections: Sequence[tuple[str, Injection]] = (),
            slowdowns: Sequence[float] = DEFAULT_SLOWDOWNS, attribution: bool = True,
            jobs: int | None = None) -> Prediction:
    """Predict ``rank``'s iteration time on ``graph`` under ``variability``
    from ``samples`` replays of the warm-up and ``iterations`` steady
    iterations, with ``injections`` (each fault as written, resolved) in
    force; ``jobs`` processes replay them (the CPU count by default)."""
    variability.check(graph)
    return sample(graph, cost, StochasticCompute(graph, variability), variability.describe(),
                  samples=samples, iterations=iterations, rank=rank, seed=seed,
                  injections=injections, slowdowns=slowdowns, attribution=attribution,
                  jobs=jobs)


def sample(graph: ExecutionGraph, cost: CostFn, compute: StochasticModel, description: str, *,
           samples: int = DEFAULT_SAMPLES, iterations: int = DEFAULT_ITERATIONS, rank: int = 0,
           seed: int = 0, injections: Sequence[tuple[str, Injection]] = (),
           slowdowns: Sequence[float] = DEFAULT_SLOWDOWNS, attribution: bool = True,
           jobs: int | None = None) -> Prediction:
    """:func:`predict` with any stochastic compute model (``description``
    says what it draws)."""
    _check(graph, samples, iterations, rank, slowdowns, injections)
    jobs = max(1, min(jobs or os.cpu_count() or 1, samples))
    warmup = max(len(p.warmup) for p in graph.programs)
    job = _Job(graph, cost, compute, tuple(i for _, i in injections), rank, warmup, iterations,
               seed)
    deterministic = job.deterministic()

    start = time.perf_counter()
    chunks = _run(job, [(None, a, b) for a, b in _chunks(samples, jobs)], jobs)
    seconds = time.perf_counter() - start
    times = np.concatenate([t for t, _ in chunks])

    slowdowns = tuple(slowdowns)
    found = None
    if attribution:
        count = min(samples, ATTRIBUTION_SAMPLES)
        moments = probe_moments(graph, compute, seed)
        removing = dataclasses.replace(job, moments=moments)
        found = attribute(graph, times[:count], moments,
                          lambda removals: _replay_removals(removing, removals, count, jobs))
    return Prediction(
        graph_world=graph.world_size, rank=rank, class_id=graph.class_of(rank), samples=samples,
        iterations=iterations, warmup=warmup, seed=seed, variability=description,
        faults=tuple((text, len(i.targets)) for text, i in injections),
        iteration=summarize(times, float(np.mean(deterministic)), slowdowns),
        total=summarize(times.sum(axis=1), float(np.sum(deterministic)), slowdowns),
        deterministic_times_s=tuple(float(t) for t in deterministic), attribution=found,
        jobs=jobs, seconds=seconds, cpu_seconds=sum(cpu for _, cpu in chunks), times_s=times)


def _check(graph: ExecutionGraph, samples: int, iterations: int, rank: int,
           slowdowns: Sequence[float], injections: Sequence[tuple[str, Injection]]) -> None:
    if samples < 1:
        raise ConfigError(f"--samples must be at least 1, got {samples}")
    if iterations < 1:
        raise ConfigError(f"--iterations must be at least 1, got {iterations}")
    if not 0 <= rank < graph.world_size:
        raise ConfigError(f"--rank {rank} is outside the graph's world of {graph.world_size} "
                          f"ranks (0-{graph.world_size - 1})")
    for x in slowdowns:
        if not (math.isfinite(x) and x > 0):
            raise ConfigError(f"--slowdown must be a positive number, got {x}")
    for text, injection in injections:
        if injection.action in MISSING_ACTIONS and not (
                injection.action == Action.HANG and injection.fault.stall_s is not None):
            raise ConfigError(
                f"--perturb {text!r} stops ranks for good: no iteration ends after it, so "
                "there is no step time to predict; ask prism-debug replay --perturb where "
                "ranks block")


def _chunks(samples: int, jobs: int) -> list[tuple[int, int]]:
    size = max(1, math.ceil(samples / (jobs * CHUNKS_PER_JOB))) if jobs > 1 else samples
    return [(a, min(a + size, samples)) for a in range(0, samples, size)]


def _replay_removals(job: _Job, removals: Sequence[Removal], count: int,
                     jobs: int) -> tuple[list[NDArray[np.float64]], float]:
    """Each removal's times over samples 0..count-1, every replay in one
    pool, and the CPU they took."""
    tasks = [(r, a, b) for r in removals for a, b in _chunks(count, jobs)]
    results = _run(job, tasks, jobs)
    per = len(_chunks(count, jobs))
    return ([np.concatenate([t for t, _ in results[i * per:(i + 1) * per]])
             for i in range(len(removals))], sum(cpu for _, cpu in results))


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every sample replays; worker processes inherit it (fork), so the
    graph and the cost model are never pickled."""

    graph: ExecutionGraph
    cost: CostFn
    compute: StochasticModel
    injections: tuple[Injection, ...]
    rank: int
    warmup: int
    iterations: int
    seed: int
    moments: GapMoments | None = None  # once attribution needs them

    def replay(self, compute: SampleCompute | None, engine_seed: int) -> NDArray[np.float64]:
        # (a per-rank model may answer one array (events, *shape), which the
        # engine takes: ComputeModel's docstring says so, its annotation not)
        model = cast(ComputeModel | None, compute)
        engine = ReplayEngine(self.graph, self.cost, compute=model, seed=engine_seed)
        for injection in self.injections:
            apply_fault(engine, injection)
        engine.run(self.warmup + self.iterations)
        return np.asarray(engine.iteration_times(self.rank)[self.warmup:], dtype=float)

    def deterministic(self) -> NDArray[np.float64]:
        return self.replay(None, self.seed)

    def sample(self, index: int, removal: Removal | None) -> NDArray[np.float64]:
        entropy = (self.seed, index, 2)
        engine_seed = int(np.random.SeedSequence([self.seed, index, 1]).generate_state(1)[0])
        compute = SampleCompute(self.graph, self.compute, entropy, removal, self.moments)
        return self.replay(compute, engine_seed)


_JOB: _Job | None = None  # the job a worker replays (set before the pool forks)


def _run_chunk(task: tuple[Removal | None, int, int]) -> tuple[NDArray[np.float64], float]:
    """Samples first..stop-1 without ``removal``'s variance, and the CPU they took."""
    removal, first, stop = task
    job = _JOB
    assert job is not None  # _run sets it before any chunk runs
    start = time.process_time()
    times = np.stack([job.sample(i, removal) for i in range(first, stop)])
    return times, time.process_time() - start


def _run(job: _Job, tasks: Sequence[tuple[Removal | None, int, int]],
         jobs: int) -> list[tuple[NDArray[np.float64], float]]:
    global _JOB
    _JOB = job
    try:
        if jobs == 1 or len(tasks) == 1:
            return [_run_chunk(t) for t in tasks]
        # fork: the workers start with the job in memory (a graph of 65,536
        # ranks and the compute model pickle slowly, and need not)
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            return pool.map(_run_chunk, tasks, chunksize=1)
    finally:
        _JOB = None
