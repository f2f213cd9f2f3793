"""Replay-engine cost at scale: engine time per iteration as a share of the
emulated iteration time, and the engine's resident memory.

The graph is the bundled example's (tp=8 × pp=4 × dp), profiled at each world
size with ``prism-debug profile`` (graphs are kept in ``--graph-dir`` and
reused).  Each world size replays unperturbed and with 1 % of the ranks
slowed ×1.2, then with every rank stochastic (every gap × a lognormal draw
of cv 0.05 per rank, op and iteration: the variability package's
StochasticCompute), alone and with
1 % slowed; the engine runs alone, as in ``prism-debug replay``.  Its time
includes the compute model's draws (``model ms`` says how much).

Accuracy (8,192 and 65,536 ranks): the sampled engine's mean and p95
iteration time of rank world//2+1 against the exact per-rank engine's
(``compress=False``: every rank simulated), over the same seeds and
iterations, with each side's standard error of the mean as the noise.

Last lines: ``engine stochastic: world=65536 engine_share_pct=X rss_mb=Y``
(every rank stochastic: issue 17's goal; with 1 % slowed as well the slowed
ranks' columns are simulated whole, see the table), then ``engine: world=N
engine_share_pct=X rss_mb=Y`` for the largest N with 1 % perturbed.  Goals
(issues 3, 17) at 65,536: share ≤ 5 %, RSS ≤ 500 MB.
"""

from __future__ import annotations

import argparse
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from prism_debug.cost import CostModel, load_profile
from prism_debug.engine import ReplayEngine
from prism_debug.graph import ExecutionGraph
from prism_debug.variability import parse_variability
from prism_debug.variability.model import StochasticCompute


def example_graph(world: int, graph_dir: Path) -> ExecutionGraph:
    path = graph_dir / f"example-{world}.prism"
    if not path.exists():
        print(f"profiling the bundled example at {world} ranks …", flush=True)
        subprocess.run([sys.executable, "-m", "prism_debug.cli", "profile", "--world-size",
                        str(world), "--out", str(path)], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL)
    return ExecutionGraph.load(path)


class Timed:
    """A compute model, and the time spent in its draws."""

    per_rank = True

    def __init__(self, model) -> None:
        self.model = model
        self.draw_s = 0.0

    def gaps_s(self, *args):
        start = time.perf_counter()
        gaps = self.model.gaps_s(*args)
        self.draw_s += time.perf_counter() - start
        return gaps

    def rank_factors(self, *args):
        return self.model.rank_factors(*args)


def stochastic(graph: ExecutionGraph):
    """Every rank's gaps × a lognormal of cv 0.05 (the variability package's
    StochasticCompute for ``--variability "cv=0.05 dist=lognormal"``)."""
    return Timed(StochasticCompute(graph, parse_variability(["cv=0.05 dist=lognormal"])))


def measure(graph: ExecutionGraph, perturbed: float, iterations: int, compute=None,
            seed: int = 0, **options) -> tuple[float, float, ReplayEngine]:
    world = graph.world_size
    model = CostModel(load_profile("h100-ib400"))
    engine = ReplayEngine(graph, model.op_time_s, compute=compute, seed=seed, **options)
    if perturbed:
        rng = np.random.default_rng(0)
        engine.slow(rng.choice(world, int(world * perturbed), replace=False), 1.2)
    warmup = max(1, max(len(p.warmup) for p in graph.programs))
    engine.run(warmup)  # and the placements and costs are cached
    draw_s = getattr(compute, "draw_s", 0.0)
    start = time.perf_counter()
    engine.run(warmup + iterations)
    engine_s = (time.perf_counter() - start) / iterations
    if compute is not None and hasattr(compute, "draw_s"):
        compute.draw_s = (compute.draw_s - draw_s) / iterations
    emulated_s = float(np.mean(engine.iteration_times(world // 2 + 1)[warmup:]))
    return engine_s, emulated_s, engine


def accuracy(graph: ExecutionGraph, seeds: int, iterations: int) -> None:
    """Sampled against exact: mean and p95 iteration time of rank world//2+1."""
    world = graph.world_size
    warmup = max(1, max(len(p.warmup) for p in graph.programs))
    sides = {}
    for name, options in (("sampled", {}), ("exact", {"compress": False})):
        times, cost_s = [], 0.0
        for seed in range(seeds):
            engine_s, _, engine = measure(graph, 0.0, iterations, stochastic(graph), seed,
                                          **options)
            times += engine.iteration_times(world // 2 + 1)[warmup:]
            cost_s += engine_s / seeds
        sides[name] = (np.array(times) * 1e3, cost_s)
    (sampled, sampled_s), (exact, exact_s) = sides["sampled"], sides["exact"]
    se = exact.std(ddof=1) / math.sqrt(len(exact))
    for what, a, b in (("mean", sampled.mean(), exact.mean()),
                       ("p95", np.percentile(sampled, 95), np.percentile(exact, 95))):
        print(f"{world:>7} {what:>5} sampled {a:9.3f} ms  exact {b:9.3f} ms  "
              f"diff {100 * (a - b) / b:+6.2f}%  (exact's s.e. of the mean {se:.3f} ms = "
              f"{100 * se / b:.2f}%; {len(exact)} iterations, engine {sampled_s * 1e3:.1f} vs "
              f"{exact_s * 1e3:.0f} ms/iter)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, nargs="*", default=[8192, 65536, 131072])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5,
                        help="Replays per row: the median is the figure, the range its noise.")
    parser.add_argument("--graph-dir", type=Path, help="Keep the profiled graphs here.")
    parser.add_argument("--accuracy-seeds", type=int, default=4)
    parser.add_argument("--accuracy-iterations", type=int, default=6)
    args = parser.parse_args()
    graph_dir = args.graph_dir or Path(tempfile.mkdtemp(prefix="prism-bench-engine-"))
    graph_dir.mkdir(parents=True, exist_ok=True)
    graphs = {world: example_graph(world, graph_dir) for world in args.world_size}
    print(f"{'world':>7} {'perturbed':>9} {'engine ms/iter':>15} {'emulated ms/iter':>17} "
          f"{'share':>7}")
    last, stochastic_line = "", ""
    def repeated(*how, **options):
        """The median replay of ``args.repeats``, and the range of their engine times."""
        runs = sorted((measure(*how, **options) for _ in range(args.repeats)),
                      key=lambda run: run[0])
        engine_s, emulated_s, engine = runs[len(runs) // 2]
        noise = f"  (runs {runs[0][0] * 1e3:.2f}-{runs[-1][0] * 1e3:.2f})"
        return engine_s, emulated_s, noise

    for world in args.world_size:
        for perturbed in (0.0, 0.01):
            engine_s, emulated_s, noise = repeated(graphs[world], perturbed, args.iterations)
            share = 100 * engine_s / emulated_s
            print(f"{world:>7} {perturbed:>9.0%} {engine_s * 1e3:>15.2f} {emulated_s * 1e3:>17.2f} "
                  f"{share:>6.1f}%{noise}")
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            last = f"engine: world={world} engine_share_pct={share:.1f} rss_mb={rss_mb:.0f}"
        for perturbed in (0.0, 0.01):
            compute = stochastic(graphs[world])
            engine_s, emulated_s, noise = repeated(graphs[world], perturbed, args.iterations,
                                                   compute)
            share = 100 * engine_s / emulated_s
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            # (the model's draws per iteration, in the last replay)
            model = f" (model {compute.draw_s * 1e3:.2f} ms)" if hasattr(compute, "draw_s") else ""
            print(f"{world:>7} {perturbed:>9.0%} {engine_s * 1e3:>15.2f} {emulated_s * 1e3:>17.2f} "
                  f"{share:>6.1f}%  every rank stochastic{model}, rss {rss_mb:.0f} MB{noise}")
            if not perturbed and (world == 65536 or not stochastic_line):
                stochastic_line = (f"engine stochastic: world={world} engine_share_pct={share:.1f}"
                                   f" rss_mb={rss_mb:.0f}")
    for world in args.world_size:
        if world in (8192, 65536) and args.accuracy_seeds:
            accuracy(graphs[world], args.accuracy_seeds, args.accuracy_iterations)
    print(stochastic_line)
    print(last)


if __name__ == "__main__":
    main()
