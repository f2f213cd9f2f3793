"""Per-collective cost of the prism group against torch's FakeProcessGroup.

Runs tools/overhead_workload.py (small all-reduce / all-gather /
reduce-scatter / broadcast on a TP group of 8 and the whole world) at world
8,192 and 65,536, under ``prism-debug run --hardware zero`` (every collective
free, so what remains is the harness) and under the ``fake`` backend
(instant no-op collectives, the floor of any Python-visible group), with and
without value digests.  Runs are interleaved A B A B and medians compared,
since a 2-core machine drifts by several percent between runs.

Last line: ``overhead: prism_us_65536=X fake_us_65536=Y overhead_us_65536=Z ratio_65536=R``.
Goal (issue 2): under 30 µs per collective at 65,536 ranks.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tools" / "overhead_workload.py"
RANK = 4097


def measure(kind: str, world: int, ops: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    workload = [sys.executable, str(WORKLOAD), "--ops", str(ops)]
    if kind == "fake":
        env.update(RANK=str(RANK), WORLD_SIZE=str(world))
        command = workload + ["--backend", "fake"]
    else:
        command = [sys.executable, "-m", "prism_debug.cli", "run", "--hardware", "zero",
                   "--world-size", str(world), "--rank", str(RANK)]
        if kind == "prism-no-digest":
            command.append("--no-digest")
        command += ["--", *workload]
    out = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    return float(re.search(r"per_collective_us=([\d.]+)", out).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--ops", type=int, default=8000)
    args = parser.parse_args()
    kinds = ("fake", "prism", "prism-no-digest")
    medians: dict[tuple[str, int], float] = {}
    print(f"{'world':>6} {'backend':>16} {'us/collective (runs)':>40} {'median':>8}")
    for world in (8192, 65536):
        samples: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(args.repeats):
            for kind in kinds:  # interleaved
                samples[kind].append(measure(kind, world, args.ops))
        for kind in kinds:
            medians[kind, world] = statistics.median(samples[kind])
            runs = " ".join(f"{v:.1f}" for v in samples[kind])
            print(f"{world:>6} {kind:>16} {runs:>40} {medians[kind, world]:>8.2f}")
        fake = medians["fake", world]
        for kind in kinds[1:]:
            print(f"{world:>6} {kind:>16} overhead over fake: {medians[kind, world] - fake:.2f} us,"
                  f" ratio {medians[kind, world] / fake:.2f}")
    prism, fake = medians["prism", 65536], medians["fake", 65536]
    print(f"overhead: prism_us_65536={prism:.2f} fake_us_65536={fake:.2f} "
          f"overhead_us_65536={prism - fake:.2f} ratio_65536={prism / fake:.2f}")


if __name__ == "__main__":
    main()
