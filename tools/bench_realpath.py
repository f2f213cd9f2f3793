"""Per-op cost of the replay engine's real-rank interface.

Drives ``ReplayEngine.real_issue`` + ``real_completion`` (the path every
collective of ``prism-debug run`` takes under a graph) along the real rank's
own program on a graph file, and reports CPU µs per op (time.process_time,
median of rounds).  ``--before TREE`` runs the same with another checkout's
prism_debug, interleaved round by round in subprocesses, for an A/B figure
on a loaded machine.

    python tools/bench_realpath.py GRAPH [--rank R] [--iterations N]
        [--rounds K] [--before TREE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_round(graph_path: str, rank: int, iterations: int, hardware: str,
              late: float = 0.0) -> dict:
    """In this process: µs per real op over ``iterations`` iterations (after
    one warm-up); the real rank computes ``late`` seconds longer than the
    graph's gap before each op (its peers then wait for it)."""
    import dataclasses

    from prism_debug.cost import CostModel, load_profile
    from prism_debug.engine import ReplayEngine
    from prism_debug.graph import ExecutionGraph

    graph = ExecutionGraph.load(Path(graph_path))
    model = CostModel(dataclasses.replace(load_profile(hardware),
                                          gpus_per_node=graph.gpus_per_node))
    engine = ReplayEngine(graph, model.op_time_s, real_rank=rank)
    program = graph.programs[graph.class_of(rank)]
    clock, ops, spent, completions = 0.0, 0, 0.0, []
    for iteration in range(1, iterations + 2):
        handles = {}
        for event in program.events(iteration):
            clock += event.gap_s + (late if event.action == "issue" else 0.0)
            if event.action == "issue":
                start = time.process_time()
                handles[event.op] = engine.real_issue(program.ops[event.op], clock)
                spent_op = time.process_time() - start
            elif event.action == "wait":
                start = time.process_time()
                done = engine.real_completion(handles[event.op])
                spent_op = time.process_time() - start
                clock = max(clock, done)
                completions.append(done)
            else:
                continue
            if iteration > 1:
                spent += spent_op
                ops += event.action == "issue"
        engine.real_iteration_end()
    return {"us_per_op": spent / ops * 1e6, "ops": ops, "clock": clock,
            "checksum": sum(c for c in completions if c != float("inf"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("graph")
    parser.add_argument("--rank", type=int, default=4097)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--hardware", default="h100-ib400")
    parser.add_argument("--late", type=float, default=0.0,
                        help="seconds the real rank computes longer than the graph says, per op")
    parser.add_argument("--before", type=Path)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_round(args.graph, args.rank, args.iterations, args.hardware,
                                          args.late)))
        return
    trees = {"after": ROOT}
    if args.before:
        trees = {"before": args.before.resolve(), "after": ROOT}
    figures: dict[str, list[float]] = {name: [] for name in trees}
    results = {}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            out = subprocess.run(
                [sys.executable, __file__, args.graph, "--one", "--rank", str(args.rank),
                 "--iterations", str(args.iterations), "--hardware", args.hardware,
                 "--late", str(args.late)],
                capture_output=True, text=True, check=True,
                env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))).stdout
            result = json.loads(out.splitlines()[-1])
            figures[name].append(result["us_per_op"])
            results[name] = result
    for name, values in figures.items():
        print(f"{name}: median {statistics.median(values):.1f} µs/op "
              f"(min {min(values):.1f}, max {max(values):.1f}, {len(values)} rounds, "
              f"{results[name]['ops']} ops each; emulated clock {results[name]['clock']:.6f} s, "
              f"completions sum {results[name]['checksum']:.9f})")
    if "before" in figures:
        ratio = statistics.median(figures["before"]) / statistics.median(figures["after"])
        print(f"speedup: {ratio:.2f}x")


if __name__ == "__main__":
    main()
