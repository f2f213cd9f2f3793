"""Emulation against a real job on this machine: iteration time and peak RSS.

For each layout of the bundled example (pp=2, and dp=2; two ranks, gloo,
one thread per process), the bench

1. fits a hardware profile to this host (``prism-debug calibrate --local``),
2. each round, profiles the layout (``prism-debug profile``, twice side by
   side so that every slice computes next to a neighbour, as each real rank
   does here) into an execution graph,
3. runs the job for real (``torchrun --nproc-per-node 2``; every rank prints
   its iteration times and peak RSS, ``--timing``), then emulates each rank
   (``prism-debug run --graph --hardware local.toml``; the ranks side by side,
   as the real ones ran), so that drifts of the machine hit both sides alike.

Per rank it compares the mean steady iteration time (after ``--warmup``
iterations) of each round's emulation with that round's real run, and the
peak RSS; the median over the rounds.  The noise floor is how much the real
runs disagree among themselves (max - min over the rounds).

Last line: ``fidelity: iteration_time_error_pct=X peak_rss_error_pct=Y`` —
the mean absolute error over ranks and layouts.  Goal (issue 3): X ≤ 1, Y ≤ 1.
Run it alone: a concurrent process on a 2-core machine distorts both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "train_gpt.py"
LAYOUTS = {"pp=2": ["--tp", "1", "--pp", "2"], "dp=2": ["--tp", "1", "--pp", "1"]}
# small enough that an iteration takes a fraction of a second on two cores
MODEL = ["--layers", "4", "--hidden", "128", "--heads", "4", "--micro-batches", "4"]
WORLD = 2
_TIMING = re.compile(r"^timing rank=(\d+) iteration_s=(\[.*\]) peak_rss_bytes=(\d+)$", re.M)


def _env() -> dict[str, str]:
    # one thread per process, as the real job below; torch would otherwise
    # start a thread per core and the two ranks would fight over both cores
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(command, capture_output=True, text=True, env=_env(),
                          stdin=subprocess.DEVNULL, **kwargs)
    if proc.returncode != 0:
        sys.exit(f"bench_fidelity: {' '.join(command[:6])} … failed ({proc.returncode}):\n"
                 f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return proc


def _prism(*args: str) -> list[str]:
    return [sys.executable, "-m", "prism_debug.cli", *args]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def real_run(script_args: list[str]) -> dict[int, tuple[list[float], int]]:
    """rank -> (iteration times, peak RSS bytes) of one real torchrun."""
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
                 "--master-addr", "127.0.0.1", "--master-port", str(_free_port()),
                 str(EXAMPLE), *script_args, "--timing"])
    found = {int(rank): (json.loads(times), int(rss))
             for rank, times, rss in _TIMING.findall(proc.stdout)}
    if sorted(found) != list(range(WORLD)):
        sys.exit(f"bench_fidelity: the real run printed timings of ranks {sorted(found)}")
    return found


def emulated_runs(script_args: list[str], graph: Path, hardware: Path,
                  workdir: Path) -> dict[int, tuple[list[float], int]]:
    """rank -> (iteration times, peak RSS bytes), every rank emulated at once.

    Side by side, as the real job's ranks ran: on a machine this small a
    rank computes measurably slower next to another one (a shared memory
    bus), and the real run includes that.
    """
    procs = {}
    for rank in range(WORLD):
        command = _prism("run", "--world-size", str(WORLD), "--rank", str(rank),
                         "--gpus-per-node", str(WORLD), "--hardware", str(hardware),
                         "--graph", str(graph), "--report", str(workdir / f"report-{rank}.json"),
                         "--run-dir", str(workdir / f"run-{rank}"),
                         "--", sys.executable, str(EXAMPLE), *script_args)
        procs[rank] = (command, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
            stdin=subprocess.DEVNULL))
    results = {}
    for rank, (command, proc) in procs.items():
        output, _ = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"bench_fidelity: {' '.join(command[:8])} … failed ({proc.returncode}):\n"
                     f"{output[-3000:]}")
        data = json.loads((workdir / f"report-{rank}.json").read_text())
        results[rank] = ([it["time_s"] for it in data["iterations"]],
                         int(data["peak_rss_bytes"]))
    return results


def steady_mean(times: list[float], warmup: int) -> float:
    return statistics.fmean(times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10, help="Iterations per run.")
    parser.add_argument("--warmup", type=int, default=2, help="Iterations left out of the mean.")
    parser.add_argument("--rounds", type=int, default=5, help="Real/emulated rounds.")
    parser.add_argument("--layouts", default=",".join(LAYOUTS),
                        help=f"Comma-separated, of {', '.join(LAYOUTS)}.")
    parser.add_argument("--workdir", type=Path, help="Keep profiles, graphs and reports here.")
    args = parser.parse_args()
    if args.iterations <= args.warmup:
        sys.exit("bench_fidelity: --iterations must exceed --warmup")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prism-fidelity-"))
    workdir.mkdir(parents=True, exist_ok=True)

    hardware = workdir / "local.toml"
    print("calibrating gloo on this host …", flush=True)
    _run(_prism("calibrate", "--local", "--out", str(hardware)))

    rows = []
    for name in args.layouts.split(","):
        script_args = [*MODEL, *LAYOUTS[name], "--backend", "gloo",
                       "--iterations", str(args.iterations)]
        # rank -> per round (real time, emulated time, real RSS, emulated RSS)
        pairs: dict[int, list[tuple[float, float, int, int]]] = {r: [] for r in range(WORLD)}
        for round_ in range(1, args.rounds + 1):
            print(f"{name}: round {round_}/{args.rounds}: profile, real run, emulation …",
                  flush=True)
            round_dir = workdir / name.replace("=", "") / f"round{round_}"
            round_dir.mkdir(parents=True, exist_ok=True)
            # Profiled afresh each round, next to the runs it is compared with:
            # this machine's speed drifts by tens of percent over minutes.  As
            # many iterations as the runs: the first few are slower (allocator,
            # caches); the graph's compute is the median over the steady ones.
            # Two profiles side by side (one graph kept), so that slices compute
            # with a neighbour, as every rank of the real job does here.
            profiles = [subprocess.Popen(
                _prism("profile", "--world-size", str(WORLD), "--gpus-per-node", str(WORLD),
                       "--iterations", str(args.iterations),
                       "--out", str(round_dir / f"graph{i}.prism"),
                       "--run-dir", str(round_dir / f"profile{i}"),
                       "--", sys.executable, str(EXAMPLE), *script_args),
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                stdin=subprocess.DEVNULL) for i in range(WORLD)]
            for proc in profiles:
                output, _ = proc.communicate()
                if proc.returncode != 0:
                    sys.exit(f"bench_fidelity: profiling failed ({proc.returncode}):\n"
                             f"{output[-3000:]}")
            graph = round_dir / "graph0.prism"
            real = real_run(script_args)
            emulated = emulated_runs(script_args, graph, hardware, round_dir)
            for rank in range(WORLD):
                pairs[rank].append((steady_mean(real[rank][0], args.warmup),
                                    steady_mean(emulated[rank][0], args.warmup),
                                    real[rank][1], emulated[rank][1]))
            print(f"{name}: round {round_}: real / emulated ms: " + ", ".join(
                f"rank {rank} {pairs[rank][-1][0] * 1e3:.1f} / {pairs[rank][-1][1] * 1e3:.1f}"
                for rank in range(WORLD)), flush=True)
        for rank, rounds in pairs.items():
            real_t = statistics.median(r for r, _, _, _ in rounds)
            emu_t = statistics.median(e for _, e, _, _ in rounds)
            # paired: each round's emulation against that round's real run
            t_err = statistics.median(100 * (e - r) / r for r, e, _, _ in rounds)
            spread = 100 * (max(r for r, _, _, _ in rounds) - min(r for r, _, _, _ in rounds)) \
                / real_t
            real_rss = statistics.median(m for _, _, m, _ in rounds)
            emu_rss = statistics.median(m for _, _, _, m in rounds)
            rows.append((name, rank, real_t, emu_t, t_err, spread, real_rss, emu_rss,
                         100 * (emu_rss - real_rss) / real_rss))

    print(f"{'layout':>6} {'rank':>4} {'real ms':>9} {'emulated ms':>12} {'paired':>7} "
          f"{'real spread':>12} {'real MB':>8} {'emulated MB':>12} {'error':>7}")
    for name, rank, real_t, emu_t, t_err, spread, real_rss, emu_rss, rss_err in rows:
        print(f"{name:>6} {rank:>4} {real_t * 1e3:>9.2f} {emu_t * 1e3:>12.2f} {t_err:>+6.2f}% "
              f"{spread:>11.2f}% {real_rss / 2**20:>8.1f} {emu_rss / 2**20:>12.1f} "
              f"{rss_err:>+6.2f}%")
    print(f"noise floor (real runs, max-min over rounds / median, mean over ranks): "
          f"{statistics.fmean(r[5] for r in rows):.2f}%")
    print(f"fidelity: iteration_time_error_pct={statistics.fmean(abs(r[4]) for r in rows):.2f} "
          f"peak_rss_error_pct={statistics.fmean(abs(r[8]) for r in rows):.2f}")


if __name__ == "__main__":
    main()
