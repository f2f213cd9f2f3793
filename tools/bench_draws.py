"""What drawing stochastic compute costs: StochasticCompute.gaps_s per class
and iteration on a graph (default: the bundled example's, profiled at
65,536 ranks and kept in ``--graph``), for a class shape of (columns, tp),
beside the bare cost of drawing as many standard normals (numpy's floor).

Rounds of the two are interleaved (A/B) and the best of each reported with
the median beside it: on a shared machine the best is the cost, the spread
the noise.  Times are the thread's CPU time (time.thread_time), which an
oversubscribed machine inflates far less than wall time.  Last line:
``draws: shape=64x8 events=N us_per_class_iteration=X normals_floor_us=Y``
for the first family.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from prism_debug.graph import ExecutionGraph
from prism_debug.variability import parse_variability
from prism_debug.variability.model import StochasticCompute


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", type=Path, default=Path("/tmp/a17-example.prism"))
    parser.add_argument("--world-size", type=int, default=65536)
    parser.add_argument("--shape", default="64x8", help="the class's shape: columns x tp")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--families", default="lognormal,normal,gamma")
    args = parser.parse_args()
    if not args.graph.exists():
        subprocess.run([sys.executable, "-m", "prism_debug.cli", "profile", "--world-size",
                        str(args.world_size), "--out", str(args.graph)], check=True)
    graph = ExecutionGraph.load(args.graph)
    shape = tuple(int(n) for n in args.shape.split("x"))
    bases = [tuple(e.gap_s for e in p.steady) for p in graph.programs]
    iteration = 1 + max(len(p.warmup) for p in graph.programs)
    drawn = sum(sum(1 for g in b if g) for b in bases) / len(bases)
    rng = np.random.default_rng(0)
    lines = []
    for family in args.families.split(","):
        compute = StochasticCompute(graph, parse_variability([f"cv=0.05 dist={family}"]))
        model, floor = [], []
        for _ in range(args.rounds):
            start = time.thread_time()
            for class_id, base in enumerate(bases):
                compute.gaps_s(class_id, iteration, base, shape, rng)
            model.append((time.thread_time() - start) / len(bases) * 1e6)
            start = time.thread_time()
            for _ in bases:
                rng.standard_normal((int(drawn), *shape))
            floor.append((time.thread_time() - start) / len(bases) * 1e6)
        print(f"{family:9s}: gaps_s {min(model):7.0f} µs per class-iteration (median "
              f"{statistics.median(model):.0f}); {drawn:.0f} events x {np.prod(shape)} ranks; "
              f"bare standard normals {min(floor):.0f} µs (median {statistics.median(floor):.0f})")
        lines.append(f"draws: family={family} shape={args.shape} events={drawn:.0f} "
                     f"us_per_class_iteration={min(model):.0f} normals_floor_us={min(floor):.0f}")
    print(lines[0])


if __name__ == "__main__":
    main()
