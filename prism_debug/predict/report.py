"""What ``prism-debug predict`` gives and prints: the :class:`Prediction`, its
text report and its JSON.  Pure core.  (The prediction is defined beside what
reads it, so that montecarlo, which makes one, imports this module and not the
other way round.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import NDArray

from prism_debug.predict.attribution import Attribution
from prism_debug.predict.stats import PERCENTILE_METHOD, Summary


@dataclasses.dataclass(frozen=True)
class Prediction:
    graph_world: int
    rank: int
    class_id: int
    samples: int
    iterations: int  # K, the steady iterations each sample replays (after the warm-up)
    warmup: int
    seed: int
    variability: str  # as Variability.describe() says it
    faults: tuple[tuple[str, int], ...]  # (the fault as written, how many ranks/nodes it hits)
    iteration: Summary  # the rank's steady iteration time
    total: Summary  # its time to K steady iterations
    deterministic_times_s: tuple[float, ...]  # the deterministic replay's K iterations
    attribution: Attribution | None
    jobs: int
    seconds: float  # the samples' wall time (attribution's is its own)
    cpu_seconds: float  # their CPU time, summed over the processes (what a quiet machine needs)
    times_s: NDArray[np.float64] = dataclasses.field(compare=False, repr=False)  # (samples, K)

    def to_dict(self) -> dict[str, Any]:
        return prediction_dict(self)


def prediction_lines(prediction: Prediction, graph_name: str = "the graph") -> list[str]:
    """The report: what was sampled, a table of the iteration time and the
    time to K iterations, P(slowdown > x), then the tail attribution."""
    p = prediction
    warm = f" after {p.warmup} warm-up" if p.warmup else ""
    lines = [
        f"predict: {graph_name}, world {p.graph_world:,}, rank {p.rank} (class {p.class_id}); "
        f"{p.samples:,} samples × {p.iterations} iterations{warm}, seed {p.seed}; "
        f"{p.seconds:.1f} s on {p.jobs} process{'es' if p.jobs > 1 else ''} "
        f"({p.cpu_seconds:.1f} s of CPU)",
        f"variability: {p.variability}",
    ]
    lines += [f"what-if: {text} (hits {count:,})" for text, count in p.faults]
    k = f"{p.iterations} iteration{'s' if p.iterations > 1 else ''}"
    lines.append(f"{'ms':<16} {'deterministic':>13} {'mean':>10} {'± s.e.':>8} {'p50':>10} "
                 f"{'p95':>10} {'p99':>10}")
    for name, s in (("iteration", p.iteration), (k, p.total)):
        lines.append(f"{name:<16} {_ms(s.deterministic_s, 13)} {_ms(s.mean_s, 10)} "
                     f"{_ms(s.stderr_s, 8)} {_ms(s.p50_s, 10)} {_ms(s.p95_s, 10)} "
                     f"{_ms(s.p99_s, 10)}")
    # (both summaries give one chance per stated slowdown)
    for (x, chance), (_, chance_k) in zip(p.iteration.exceed, p.total.exceed, strict=True):
        lines.append(f"P(slowdown > {x:g}×) = {chance:.1%} per iteration, {chance_k:.1%} over "
                     f"{k} (against the deterministic replay)")
    lines.append(f"percentiles: numpy's {PERCENTILE_METHOD!r} (Hyndman–Fan 7) over "
                 f"{p.iteration.values:,} iterations and {p.total.values:,} runs of {k}; s.e.: "
                 "the Monte Carlo standard error of the mean")
    a = p.attribution
    if a is None:
        return lines
    if not a.contributions:
        lines.append("tail attribution: no gap varies: nothing to attribute")
        return lines
    lines.append(f"tail attribution: the first {a.samples:,} samples again without one variance "
                 f"at a time (same draws otherwise: {a.replays:,} replays, {a.seconds:.1f} s, "
                 f"{a.cpu_seconds:.1f} s of CPU); "
                 f"their iteration p99 {a.p99_s * 1e3:.3f} ms, mean {a.mean_s * 1e3:.3f} ms")
    lines.append(f"  {'variance removed':<24} {'share':>7} {'Δ p99 ms':>10} {'Δ mean ms':>10}")
    for c in sorted(a.contributions, key=lambda c: c.p99_change_s):
        lines.append(f"  {c.removed:<24} {c.variance_share:>7.1%} {c.p99_change_s * 1e3:>+10.3f} "
                     f"{c.mean_change_s * 1e3:>+10.3f}")
    return lines


def _ms(seconds: float, width: int) -> str:
    return f"{seconds * 1e3:>{width}.3f}"


def prediction_dict(prediction: Prediction) -> dict[str, Any]:
    """The prediction as ``--json`` prints it: times in seconds, the raw
    iteration times per sample included."""
    p = prediction

    def summary(s: Summary) -> dict[str, Any]:
        out = dataclasses.asdict(s)
        out["exceed"] = [{"slowdown": x, "probability": chance} for x, chance in s.exceed]
        return out

    return {
        "world_size": p.graph_world, "rank": p.rank, "class": p.class_id,
        "samples": p.samples, "iterations": p.iterations, "warmup": p.warmup, "seed": p.seed,
        "variability": p.variability,
        "perturbations": [{"text": text, "hits": count} for text, count in p.faults],
        "percentile_method": PERCENTILE_METHOD,
        "iteration": summary(p.iteration), "total": summary(p.total),
        "deterministic_times_s": list(p.deterministic_times_s),
        "attribution": None if p.attribution is None else dataclasses.asdict(p.attribution),
        "jobs": p.jobs, "seconds": p.seconds, "cpu_seconds": p.cpu_seconds,
        "times_s": p.times_s.tolist(),
    }
