"""Self-consistency of the emulated clock on short iterations.

The real rank's steady iteration under ``prism-debug run --graph`` must
agree with ``prism-debug replay`` of its own class (the same graph, the same
cost profile), since the replay takes the rank's compute from the profile of
the same script: whatever the harness spends per collective and leaves on the
emulated clock shows up as the difference, and it grows as iterations get
short.  The workload is tools/selfconsistency_workload.py, a small DDP model
with an iteration of a few milliseconds and several gradient buckets.

Each repeat profiles the script, replays the graph and runs the rank, in
that order (interleaved, so a machine that drifts moves all three); the
error is the real rank's median steady iteration against the replay's, and
the spread is the real rank's iteration-to-iteration spread (interquartile
range over the median) — the noise the error is to be read against.

The iteration alone is one-sided (a real rank faster than its profile waits
for its peers and ends with them), so the real rank's compute — its iteration
less its waits — is printed beside it against the graph's compute gaps.

Last line: ``selfconsistency: error_pct=X spread_pct=Y`` (medians over the
repeats).  Goal (issue 13): |X| at most 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from prism_debug.graph import ExecutionGraph  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "tools" / "selfconsistency_workload.py"
WARM_UP = 3  # iterations left out: the first carries start-up, the next settle


def _cli(*args: str, capture: bool = True) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args],
                          capture_output=capture, text=True, env=env, check=True).stdout


def one_repeat(scratch: Path, world: int, rank: int, hardware: str,
               iterations: int) -> tuple[float, float, float, float, float]:
    """(real rank's median steady iteration, the replay's, real spread %, the
    real rank's median compute (iteration less its waits), the graph's)."""
    graph = scratch / "ddp.graph"
    _cli("profile", "--world-size", str(world), "--out", str(graph), "--",
         sys.executable, str(WORKLOAD), "--iterations", "6")
    replayed = json.loads(_cli("replay", str(graph), "--hardware", hardware, "--ranks",
                               str(rank), "--iterations", "8", "--json"))
    predicted = statistics.median(replayed["times_s"][str(rank)][WARM_UP:])
    report = scratch / "report.json"
    _cli("run", "--world-size", str(world), "--rank", str(rank), "--hardware", hardware,
         "--graph", str(graph), "--report", str(report), "--",
         sys.executable, str(WORKLOAD), "--iterations", str(iterations))
    records = json.loads(report.read_text())["iterations"][WARM_UP:]
    times = [it["time_s"] for it in records]
    quartiles = statistics.quantiles(times, n=4)
    real = statistics.median(times)
    # The iteration alone is one-sided: a real rank faster than its profile
    # waits for its peers and ends with them.  Its compute is two-sided.
    loaded = ExecutionGraph.load(graph)
    program = loaded.programs[loaded.class_of(rank)]
    profiled = sum(event.gap_s for event in program.steady)
    compute = statistics.median(it["compute_s"] for it in records)
    return real, predicted, 100 * (quartiles[2] - quartiles[0]) / real, compute, profiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--world-size", type=int, default=1024)
    parser.add_argument("--rank", type=int, default=5)
    parser.add_argument("--hardware", default="h100-ib400")
    args = parser.parse_args()
    errors, spreads, compute_errors = [], [], []
    print(f"{'repeat':>6} {'real ms':>8} {'replay ms':>9} {'error %':>8} {'spread %':>8} "
          f"{'compute ms':>10} {'profiled':>8} {'error %':>8}")
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(args.repeats):
            real, predicted, spread, compute, profiled = one_repeat(
                Path(scratch), args.world_size, args.rank, args.hardware, args.iterations)
            errors.append(100 * (real - predicted) / predicted)
            spreads.append(spread)
            compute_errors.append(100 * (compute - profiled) / profiled)
            print(f"{repeat:>6} {real * 1e3:>8.3f} {predicted * 1e3:>9.3f} "
                  f"{errors[-1]:>+8.2f} {spread:>8.2f} {compute * 1e3:>10.3f} "
                  f"{profiled * 1e3:>8.3f} {compute_errors[-1]:>+8.2f}", flush=True)
    print(f"errors over repeats: {' '.join(f'{e:+.2f}' for e in errors)}; the real rank's "
          f"compute against the profile's: {' '.join(f'{e:+.2f}' for e in compute_errors)}")
    print(f"selfconsistency: error_pct={statistics.median(errors):.2f} "
          f"spread_pct={statistics.median(spreads):.2f}")


if __name__ == "__main__":
    main()
