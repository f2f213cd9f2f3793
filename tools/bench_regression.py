"""A regression suite from snapshots against the same checks re-running the
script from the start (issue 16, "Fast restores for test suites").

Ten checks of the bundled example as rank 5 of 64 (tp=8 x pp=4 x dp=2): each
puts a fault (or none) in force from iteration N+1 and looks at iterations
N+1.. (their digests, or the exception a dead peer brings).  From snapshots,
each check restores the rank after iteration N (``prism_debug.testing``'s
``regression_run``, what the pytest fixture calls; the snapshot is recorded
once, on first use, into a fresh cache: printed as the cold cost); re-running,
each check runs the script from iteration 1 with the same graph and faults.
Both ways must give the same digests (checked: a fast wrong suite is no suite).

The suites run interleaved check by check, ``--rounds`` times; the figures
are medians, printed beside the rounds' spread (this machine's noise floor).
Last line: ``regression: snapshot_suite_s=X rerun_suite_s=Y speedup=Z``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prism_debug import api  # noqa: E402
from prism_debug.testing import SnapshotCache, job_for, parse_faults, regression_run  # noqa: E402
from prism_debug.workflows.graph_cache import cached_graph  # noqa: E402

WORLD, RANK, TIMEOUT_S = 64, 5, 2.0


def checks(n: int) -> list[tuple[str, int, list[str]]]:
    """(name, iterations after the snapshot, faults)."""
    at = n + 1
    return [
        ("clean, 2 iterations", 2, []),
        ("clean, 1 iteration", 1, []),
        ("late dp peer", 2, [f"delay 13 0.3 family dp from {at} for 1"]),
        ("slow dp peer", 2, [f"slow 13 2 from {at}"]),
        ("slow pp peer", 2, [f"slow 21 1.5 from {at}"]),
        ("late tp peer", 1, [f"delay 4 0.2 family tp from {at} for 1"]),
        ("nan from a tp peer", 1, [f"nan 4 family tp at {at}"]),
        ("inf from a tp peer", 1, [f"inf 4 family tp at {at}"]),
        ("corrupt tp peer", 1, [f"corrupt 4 1.5 family tp at {at}"]),
        ("dead dp peer", 1, [f"fail 13 at {at}"]),
    ]


def outcome(exit_code: int, digests: dict, exception) -> tuple:
    # whether it failed, not how: an isolated rank (a test snapshot's) is the
    # init of its pid namespace, where the watchdog's abort() ends as SIGSEGV
    return (exit_code != 0, tuple(sorted(digests.items())),
            exception[0].rsplit(":", 1)[-1] if exception else None)


def snapshot_check(job, cache: SnapshotCache, work: Path, k: int, faults: list[str]):
    r = regression_run(job, iterations=k, faults=faults, cache=cache,
                       run_dir=Path(tempfile.mkdtemp(dir=work)))
    return outcome(r.exit_code, r.digests, r.exception)


def rerun_check(job, graph: Path, work: Path, n: int, k: int, faults: list[str]):
    from prism_debug.workflows.scenario_run import observe
    result = api.run(api.RunOptions(
        command=list(job.command), rank=RANK, world_size=WORLD,
        profile=api.load_profile(job.hardware), iterations=n + k, graph_path=graph, bind=None,
        collective_timeout_s=TIMEOUT_S, faults=parse_faults(faults, WORLD),
        run_dir=Path(tempfile.mkdtemp(dir=work))))
    seen = observe(result)
    return outcome(result.exit_code, {i: d for i, d in seen.digests.items() if i > n},
                   seen.exception)


def suites(job, cache: SnapshotCache, graph: Path, work: Path, n: int) -> tuple[float, float]:
    """Both suites, interleaved check by check (A, B, A, B, ...), so a change
    in the machine's load lands on both; their wall times."""
    snapshot_s = rerun_s = 0.0
    for name, k, faults in checks(n):
        started = time.perf_counter()
        a = snapshot_check(job, cache, work, k, faults)
        middle = time.perf_counter()
        b = rerun_check(job, graph, work, n, k, faults)
        snapshot_s += middle - started
        rerun_s += time.perf_counter() - middle
        if a != b:
            sys.exit(f"{name}: the suites disagree: {a} from the snapshot, {b} re-running")
    return snapshot_s, rerun_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iteration", type=int, default=10,
                        help="the snapshot's iteration: the warm-up a re-run repeats")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n = args.iteration
    with tempfile.TemporaryDirectory(prefix="bench-regression-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("PRISM_DEBUG_GRAPH_CACHE", str(work / "graphs"))
        job = job_for(world_size=WORLD, rank=RANK, iteration=n, collective_timeout_s=TIMEOUT_S)
        graph = cached_graph(list(job.profile_command), WORLD,
                             api.load_profile(job.hardware).gpus_per_node, run_dir=work / "profile",
                             message=print)
        cache = SnapshotCache(work / "cache")
        started = time.perf_counter()
        cache.snapshot_for(job)
        record_s = time.perf_counter() - started
        print(f"snapshot recorded once (cold cache): {record_s:.2f} s")
        snap_times, rerun_times = [], []
        for round_ in range(args.rounds):
            s, r = suites(job, cache, graph, work, n)
            snap_times.append(s)
            rerun_times.append(r)
            print(f"round {round_ + 1}: from snapshots {s:.2f} s, re-running {r:.2f} s "
                  f"(x{r / s:.2f}); the 10 checks agree: same digests, same failures")
        s, r = statistics.median(snap_times), statistics.median(rerun_times)
        spread = max(max(snap_times) / min(snap_times), max(rerun_times) / min(rerun_times))
        print(f"10 checks after iteration {n}: from snapshots {s:.2f} s ({s / 10:.2f} s a "
              f"check), re-running from iteration 1 {r:.2f} s ({r / 10:.2f} s a check); "
              f"noise: rounds differ by up to x{spread:.2f}; a cold cache (the suite "
              f"plus the one recording) x{r / (s + record_s):.2f}")
        print(f"regression: snapshot_suite_s={s:.2f} rerun_suite_s={r:.2f} speedup={r / s:.2f}")


if __name__ == "__main__":
    main()
