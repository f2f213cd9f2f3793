"""Per-collective cost of the prism group against torch's FakeProcessGroup.

Runs tools/overhead_workload.py (small all-reduce / all-gather /
reduce-scatter / broadcast on TP groups of 8 and the whole world) at world
65,536 (and 8,192 with ``--worlds``) under ``prism-debug run --hardware
zero`` (every collective free, so what remains is the harness) and under the
``fake`` backend (instant no-op collectives, the floor of any Python-visible
group): prism with peers in lockstep (``--lockstep`` where the CLI has it),
lockstep without value digests, and prism replaying peers from a graph
(profiled once from the same workload).  Runs are interleaved A B C D A B …
and medians compared, since a 2-core machine drifts by several percent
between runs; each run's figure is its median iteration (robust to the
scheduler taking the core away), and the spread of the runs is printed.

``--before TREE`` adds the same kinds run with another checkout's
prism_debug (``git worktree add --detach /tmp/before main``), interleaved in
the same rounds, for a side-by-side comparison.

Last lines: ``overhead: prism_us_65536=X fake_us_65536=Y overhead_us_65536=Z
ratio_65536=R`` (lockstep) and ``overhead_graph: prism_us_65536=X …`` (graph).
Goal (issue 13): ratio at most 2.5.

``--real-pair`` measures instead what several real ranks cost: the same loop
on a group of 2 (``--group-size 2 --no-world``) run by 2 processes, as a
plain gloo job under ``torchrun --nproc-per-node 2`` and as ``prism-debug run
--ranks 0-1 --hardware zero --lockstep`` in a world of 2 (every collective
real, among the two) and of 8,192 (the pair's data-parallel peers virtual),
interleaved.  Last line: ``overhead_real: gloo_us=X prism_us=Y overhead_us=Z
ratio=R`` (world 2) and the same for 8,192 before it.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tools" / "overhead_workload.py"
RANK = 4097


def _env(tree: Path) -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(tree))


def has_lockstep_flag(tree: Path) -> bool:
    """Whether this tree's ``run`` profiles by default and takes ``--lockstep``."""
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", "run", "--help"],
                         capture_output=True, text=True, env=_env(tree), check=True).stdout
    return "--lockstep" in out


def profile(tree: Path, world: int, out: Path) -> None:
    subprocess.run([sys.executable, "-m", "prism_debug.cli", "profile", "--world-size",
                    str(world), "--out", str(out), "--", sys.executable, str(WORKLOAD),
                    "--ops", "800"],
                   capture_output=True, text=True, env=_env(tree), check=True)


def measure(kind: str, tree: Path, world: int, ops: int, graph: Path | None,
            lockstep_flag: bool) -> tuple[float, float]:
    """(median-iteration µs per collective, CPU µs per collective)."""
    env = _env(tree)
    workload = [sys.executable, str(WORKLOAD), "--ops", str(ops)]
    if kind == "fake":
        env.update(RANK=str(RANK), WORLD_SIZE=str(world))
        command = workload + ["--backend", "fake"]
    else:
        command = [sys.executable, "-m", "prism_debug.cli", "run", "--hardware", "zero",
                   "--world-size", str(world), "--rank", str(RANK)]
        if kind == "graph":
            command += ["--graph", str(graph)]
        elif lockstep_flag:
            command.append("--lockstep")
        if kind == "no-digest":
            command.append("--no-digest")
        command += ["--", *workload]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    found = re.search(r"median_us=([\d.]+) cpu_us=([\d.]+)", out)
    return float(found.group(1)), float(found.group(2))


PAIR = ["--group-size", "2", "--no-world"]


def measure_pair(kind: str, world: int, ops: int) -> tuple[float, float]:
    """(median-iteration µs per collective, its main thread's CPU µs per
    collective) of rank 0 of the pair."""
    env = _env(ROOT)
    workload = [str(WORKLOAD), "--ops", str(ops), *PAIR]
    if kind == "gloo":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node", "2", *workload, "--backend", "gloo"]
    else:
        command = [sys.executable, "-m", "prism_debug.cli", "run", "--hardware", "zero",
                   "--lockstep", "--no-bus", "--world-size", str(world), "--ranks", "0-1",
                   "--", sys.executable, *workload]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    found = re.search(r"median_us=([\d.]+) cpu_us=([\d.]+)", out)
    return float(found.group(1)), float(found.group(2))


def real_pair(repeats: int, ops: int) -> None:
    kinds = [("gloo", 2), ("prism", 2), ("prism", 8192)]
    samples: dict[tuple[str, int], list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind, world in kinds:  # interleaved
            samples[kind, world].append(measure_pair(kind, world, ops))
    print(f"{'kind':>14} {'median-iteration µs/collective (runs)':>44} {'median':>8} "
          f"{'spread':>7} {'cpu µs':>7}")
    medians, cpus = {}, {}
    for (kind, world), runs in samples.items():
        wall = [w for w, _ in runs]
        medians[kind, world] = statistics.median(wall)
        cpus[kind, world] = statistics.median(c for _, c in runs)
        print(f"{kind + ' ' + str(world):>14} {' '.join(f'{v:.1f}' for v in wall):>44} "
              f"{medians[kind, world]:>8.1f} {_spread(wall):>7} {cpus[kind, world]:>7.1f}")
    gloo, gloo_cpu = medians["gloo", 2], cpus["gloo", 2]
    for world in (8192, 2):
        prism, cpu = medians["prism", world], cpus["prism", world]
        suffix = "" if world == 2 else f"_{world}"
        print(f"overhead_real{suffix}: gloo_us={gloo:.1f} prism_us={prism:.1f} "
              f"overhead_us={prism - gloo:.1f} ratio={prism / gloo:.2f} "
              f"cpu_gloo_us={gloo_cpu:.1f} cpu_prism_us={cpu:.1f}")


def _spread(values: list[float]) -> str:
    middle = statistics.median(values)
    return f"±{50 * (max(values) - min(values)) / middle:.0f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", type=int, default=8000)
    parser.add_argument("--worlds", default="65536", help="comma-separated world sizes")
    parser.add_argument("--before", type=Path, help="another checkout to compare with")
    parser.add_argument("--real-pair", action="store_true",
                        help="2 real ranks against a plain gloo job of the same 2 processes")
    args = parser.parse_args()
    if args.real_pair:
        real_pair(args.repeats, min(args.ops, 2000))
        return
    trees = {"": ROOT} if args.before is None else {"": ROOT, "before ": args.before}
    flags = {label: has_lockstep_flag(tree) for label, tree in trees.items()}
    runs = [("fake", "fake", ROOT, False)]
    for label, tree in trees.items():
        runs += [(f"{label}{kind}", kind, tree, flags[label])
                 for kind in ("lockstep", "no-digest", "graph")]
    medians: dict[tuple[str, int], float] = {}
    cpus: dict[tuple[str, int], float] = {}
    print(f"{'world':>6} {'kind':>18} {'median-iteration µs/collective (runs)':>44} "
          f"{'median':>7} {'spread':>7} {'cpu µs':>7}")
    with tempfile.TemporaryDirectory() as scratch:
        for world in (int(w) for w in args.worlds.split(",")):
            graphs = {}
            for label, tree in trees.items():
                graphs[tree] = Path(scratch) / f"{label.strip() or 'this'}-{world}.graph"
                profile(tree, world, graphs[tree])
            samples: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in runs}
            for _ in range(args.repeats):
                for name, kind, tree, flag in runs:  # interleaved
                    samples[name].append(measure(kind, tree, world, args.ops, graphs[tree], flag))
            for name, *_ in runs:
                wall = [w for w, _ in samples[name]]
                cpu = cpus[name, world] = statistics.median(c for _, c in samples[name])
                medians[name, world] = statistics.median(wall)
                print(f"{world:>6} {name:>18} {' '.join(f'{v:.1f}' for v in wall):>44} "
                      f"{medians[name, world]:>7.2f} {_spread(wall):>7} {cpu:>7.2f}")
            fake = medians["fake", world]
            for name, *_ in runs[1:]:
                print(f"{world:>6} {name:>18} overhead over fake: "
                      f"{medians[name, world] - fake:.2f} µs,"
                      f" ratio {medians[name, world] / fake:.2f}"
                      f" (CPU: ratio {cpus[name, world] / cpus['fake', world]:.2f})")
    world = max(w for _, w in medians)
    fake = medians["fake", world]
    for line, name in (("overhead", "lockstep"), ("overhead_graph", "graph")):
        prism = medians[name, world]
        print(f"{line}: prism_us_{world}={prism:.2f} fake_us_{world}={fake:.2f} "
              f"overhead_us_{world}={prism - fake:.2f} ratio_{world}={prism / fake:.2f}")


if __name__ == "__main__":
    main()
