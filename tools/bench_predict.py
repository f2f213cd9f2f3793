"""``prism-debug predict`` at scale, and checked against a closed form.

First the validation: a DDP-shaped world (one class on one dp axis of n
ranks: compute g = 100 ms, one 100 MiB all-reduce, wait, end; the graph built
by hand) with iid normal compute (``--variability 'cv=0.05 dist=normal'``)
has a mean iteration time of g·E[max of n normals] + the all-reduce's cost
(order statistics by numerical integration:
``prism_debug.variability.expected_max_normal``).  The Monte Carlo mean is
printed beside it at n = 8, 1,024 and 65,536, with its standard error as
the noise; the goal is agreement within 1 %.

Then the benchmark: 1,000 samples of the bundled example's graph (tp=8 ×
pp=4 × dp, profiled once with ``prism-debug profile`` and kept in
``--graph-dir``) at 65,536 ranks, variability ``cv=0.05`` (lognormal: the
language's default family), the default K, the ``h100-ib400`` profile, as
many processes as CPUs, with the tail attribution (timed apart).

Last line: ``predict: world=65536 samples=1000 seconds=X``, X the wall time
of the whole call as ``prism-debug predict`` makes it (the deterministic
replay, the samples and the tail attribution; not loading the graph).  Goal
(issue 17): ≤ 60 s on a 2-core machine.  The graph is profiled on this
machine: profile it on a quiet one (a busy host stretches the example's
CPU compute, and with it every figure but the timing).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_engine import example_graph  # noqa: E402  (a sibling tool)

from prism_debug.cost import CostModel, Placement, load_profile  # noqa: E402
from prism_debug.predict import DEFAULT_ITERATIONS, predict, prediction_lines  # noqa: E402
from prism_debug.predict.closedform import ddp_expected_iteration_s, ddp_graph  # noqa: E402
from prism_debug.variability import parse_variability  # noqa: E402

HARDWARE = "h100-ib400"
GAP_S = 0.1
CLOSED_FORM_CV = 0.05
# samples per world size: the standard error falls as 1/√(samples × K)
CLOSED_FORM_SAMPLES = {8: 2000, 1024: 500, 65536: 100}


def closed_form(jobs: int, scale: float) -> bool:
    model = CostModel(load_profile(HARDWARE))
    variability = parse_variability([f"cv={CLOSED_FORM_CV} dist=normal"])
    print(f"closed form: DDP, g = {GAP_S * 1e3:.0f} ms, iid normal compute (cv "
          f"{CLOSED_FORM_CV}), mean iteration = g·E[max of n normals] + all-reduce cost")
    print(f"{'ranks':>7} {'samples':>8} {'Monte Carlo ms':>15} {'± s.e.':>8} "
          f"{'closed form ms':>15} {'error':>8} {'error/s.e.':>10} {'seconds':>8}")
    ok = True
    for ranks, samples in CLOSED_FORM_SAMPLES.items():
        samples = max(10, int(samples * scale))
        graph = ddp_graph(ranks, GAP_S)
        cost_s = model.op_time_s(graph.programs[0].ops[0], Placement.of(range(ranks), 8))
        start = time.perf_counter()
        p = predict(graph, model.op_time_s, variability, samples=samples,
                    iterations=DEFAULT_ITERATIONS, attribution=False, jobs=jobs)
        seconds = time.perf_counter() - start
        expected = ddp_expected_iteration_s(ranks, GAP_S, CLOSED_FORM_CV, cost_s)
        error = p.iteration.mean_s - expected
        ok &= abs(error) / expected < 0.01
        print(f"{ranks:>7} {samples:>8} {p.iteration.mean_s * 1e3:>15.4f} "
              f"{p.iteration.stderr_s * 1e3:>8.4f} {expected * 1e3:>15.4f} "
              f"{error / expected:>+8.3%} {error / p.iteration.stderr_s:>+10.2f} {seconds:>8.1f}")
    print(f"closed form: {'every' if ok else 'NOT every'} Monte Carlo mean within 1 %")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=65536)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    parser.add_argument("--variability", default="cv=0.05")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--graph-dir", type=Path,
                        default=Path.home() / ".cache" / "prism-debug" / "bench-graphs",
                        help="Keep the profiled graphs here.")
    parser.add_argument("--closed-form-scale", type=float, default=1.0,
                        help="Scale the closed form's samples (0 skips it).")
    args = parser.parse_args()
    if args.closed_form_scale > 0:
        closed_form(args.jobs, args.closed_form_scale)
    args.graph_dir.mkdir(parents=True, exist_ok=True)
    graph = example_graph(args.world_size, args.graph_dir)
    model = CostModel(dataclasses.replace(load_profile(HARDWARE),
                                          gpus_per_node=graph.gpus_per_node))
    start = time.perf_counter()
    p = predict(graph, model.op_time_s, parse_variability([args.variability]),
                samples=args.samples, iterations=args.iterations, jobs=args.jobs)
    total = time.perf_counter() - start
    for line in prediction_lines(p, f"the bundled example at {args.world_size:,} ranks"):
        print(line)
    print(f"predict: samples {p.seconds:.1f} s wall, {p.cpu_seconds:.1f} s CPU over {p.jobs} "
          f"processes ({p.cpu_seconds / p.samples * 1e3:.1f} ms of CPU per sample of "
          f"{p.iterations} iterations: {p.cpu_seconds / p.jobs:.1f} s on {p.jobs} idle cores); "
          f"attribution {p.attribution.seconds:.1f} s wall, {p.attribution.cpu_seconds:.1f} s CPU; "
          f"the whole call {total:.1f} s")
    print(f"predict: world={args.world_size} samples={args.samples} seconds={total:.1f}")


if __name__ == "__main__":
    main()
