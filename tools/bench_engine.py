"""Replay-engine cost at scale: engine time per iteration as a share of the
emulated iteration time, and the engine's resident memory.

The graph is the bundled example's (tp=8 × pp=4 × dp), profiled at each world
size with ``prism-debug profile`` (graphs are kept in ``--graph-dir`` and
reused).  Each world size replays unperturbed and with 1 % of the ranks
slowed ×1.2; the engine runs alone, as in ``prism-debug replay``.

Last line: ``engine: world=N engine_share_pct=X rss_mb=Y`` for the largest N
with 1 % perturbed.  Goal (issue 3) at 65,536: share ≤ 5 %, RSS ≤ 500 MB.
"""

from __future__ import annotations

import argparse
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


def example_graph(world: int, graph_dir: Path) -> ExecutionGraph:
    path = graph_dir / f"example-{world}.prism"
    if not path.exists():
        print(f"profiling the bundled example at {world} ranks …", flush=True)
        subprocess.run([sys.executable, "-m", "prism_debug.cli", "profile", "--world-size",
                        str(world), "--out", str(path)], check=True, stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL)
    return ExecutionGraph.load(path)


def measure(graph: ExecutionGraph, perturbed: float,
            iterations: int) -> tuple[float, float]:
    world = graph.world_size
    model = CostModel(load_profile("h100-ib400"))
    engine = ReplayEngine(graph, model.op_time_s)
    if perturbed:
        rng = np.random.default_rng(0)
        engine.slow(rng.choice(world, int(world * perturbed), replace=False), 1.2)
    warmup = max(1, max(len(p.warmup) for p in graph.programs))
    engine.run(warmup)  # and the placements and costs are cached
    start = time.perf_counter()
    engine.run(warmup + iterations)
    engine_s = (time.perf_counter() - start) / iterations
    emulated_s = float(np.mean(engine.iteration_times(world // 2 + 1)[warmup:]))
    return engine_s, emulated_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, nargs="*", default=[8192, 65536, 131072])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--graph-dir", type=Path, help="Keep the profiled graphs here.")
    args = parser.parse_args()
    graph_dir = args.graph_dir or Path(tempfile.mkdtemp(prefix="prism-bench-engine-"))
    graph_dir.mkdir(parents=True, exist_ok=True)
    graphs = {world: example_graph(world, graph_dir) for world in args.world_size}
    print(f"{'world':>7} {'perturbed':>9} {'engine ms/iter':>15} {'emulated ms/iter':>17} "
          f"{'share':>7}")
    last = ""
    for world in args.world_size:
        for perturbed in (0.0, 0.01):
            engine_s, emulated_s = measure(graphs[world], perturbed, args.iterations)
            share = 100 * engine_s / emulated_s
            print(f"{world:>7} {perturbed:>9.0%} {engine_s * 1e3:>15.2f} {emulated_s * 1e3:>17.2f} "
                  f"{share:>6.1f}%")
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            last = f"engine: world={world} engine_share_pct={share:.1f} rss_mb={rss_mb:.0f}"
    print(last)


if __name__ == "__main__":
    main()
