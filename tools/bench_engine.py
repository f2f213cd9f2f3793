"""Replay-engine cost at scale: engine time per iteration as a share of the
emulated iteration time, and the engine's resident memory.

Until ``prism-debug profile`` exists (issue 3) the graph is built here in the
shape of the bundled example (tp=8 × pp=4 × dp, 8 micro-batches, two layers
per stage: per micro-batch two TP all-reduces forward and two backward, the
stage's p2p, one DP gradient all-reduce), with compute gaps of the order
measured for it on this machine.  Each world size runs unperturbed and with
1 % of the ranks slowed ×1.2.

Last line: ``engine: world=N engine_share_pct=X rss_mb=Y`` for the largest N
with 1 % perturbed.  Goal (issue 3) at 65,536: share ≤ 5 %, RSS ≤ 500 MB.
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np

from prism_debug.cost import CostModel, load_profile
from prism_debug.engine import ReplayEngine
from prism_debug.graph import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec

TP, PP, MICRO = 8, 4, 8
ACTIVATION = 2 * 128 * 256 * 4  # micro-batch x sequence x hidden, float32
GRADIENTS = 4_000_000


def example_shaped_graph(world: int) -> ExecutionGraph:
    dp = world // (TP * PP)
    programs = []
    for stage in range(PP):
        ops: list[OpSpec] = []
        events: list[Event] = []

        def sync(op: OpSpec, gap: float) -> None:
            ops.append(op)
            events.extend([Event("issue", gap, len(ops) - 1), Event("wait", 0.0, len(ops) - 1)])

        for _ in range(MICRO):
            if stage > 0:
                sync(OpSpec("recv", "pp", ACTIVATION, peer=-1), 0.0)
            for _ in range(4):
                sync(OpSpec("all_reduce", "tp", ACTIVATION), 0.0005)
            if stage < PP - 1:
                sync(OpSpec("send", "pp", ACTIVATION, peer=1), 0.0001)
        for _ in range(MICRO):
            if stage < PP - 1:
                sync(OpSpec("recv", "pp", ACTIVATION, peer=1), 0.0)
            for _ in range(4):
                sync(OpSpec("all_reduce", "tp", ACTIVATION), 0.001)
            if stage > 0:
                sync(OpSpec("send", "pp", ACTIVATION, peer=-1), 0.0001)
        sync(OpSpec("all_reduce", "dp", GRADIENTS), 0.001)
        events.append(Event("end", 0.002))
        programs.append(ClassProgram(stage, tuple(ops), (), tuple(events)))
    return ExecutionGraph(mesh=Mesh((PP, dp, TP), ("pp", "dp", "tp")),
                          families={"tp": ("tp",), "dp": ("dp",), "pp": ("pp",)},
                          class_axis="pp", programs=tuple(programs), gpus_per_node=8)


def measure(world: int, perturbed: float, iterations: int) -> tuple[float, float]:
    model = CostModel(load_profile("h100-ib400"))
    engine = ReplayEngine(example_shaped_graph(world),
                          lambda op, placement: model.time_s(op.kind, op.nbytes, placement))
    if perturbed:
        rng = np.random.default_rng(0)
        engine.slow(rng.choice(world, int(world * perturbed), replace=False), 1.2)
    engine.run(1)  # warm-up: placements, costs
    start = time.perf_counter()
    engine.run(1 + iterations)
    engine_s = (time.perf_counter() - start) / iterations
    emulated_s = float(np.mean(engine.iteration_times(world // 2 + 1)[1:]))
    return engine_s, emulated_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, nargs="*", default=[8192, 65536, 131072])
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    print(f"{'world':>7} {'perturbed':>9} {'engine ms/iter':>15} {'emulated ms/iter':>17} "
          f"{'share':>7}")
    last = ""
    for world in args.world_size:
        for perturbed in (0.0, 0.01):
            engine_s, emulated_s = measure(world, perturbed, args.iterations)
            share = 100 * engine_s / emulated_s
            print(f"{world:>7} {perturbed:>9.0%} {engine_s * 1e3:>15.2f} {emulated_s * 1e3:>17.2f} "
                  f"{share:>6.1f}%")
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            last = f"engine: world={world} engine_share_pct={share:.1f} rss_mb={rss_mb:.0f}"
    print(last)


if __name__ == "__main__":
    main()
