"""Emulation against real jobs on this machine: iteration time, peak RSS, stragglers.

Primary: the *device-time workload* (``examples/device_time.py``): a
training step whose compute is device time — the host sleeps for configured
durations, as it waits for GPU kernels — with real gloo point-to-point
(1F1B over 4 pipeline stages, 4 micro-batches, a heavier last stage) and
all-reduces (bucketed over dp; inside every layer over tp).  Waiting costs
no CPU, so the real job is 16 processes under ``torchrun`` on two cores, in
two layouts: pp=4 x dp=4 and tp=2 x pp=4 x dp=2.  The bench

1. fits a hardware profile to this host (``prism-debug calibrate --local
   --processes 4``; a gloo op here costs more the more processes share the
   two cores, but calibrating among all 16 does not finish in 10 minutes on
   two cores: ``--calibrate-processes``, or ``--hardware`` for a profile made
   elsewhere),
2. profiles each layout once (``prism-debug profile``, world 16),
3. each round, runs the job for real (every rank writes its iteration times
   and peak RSS to its own file), then emulates ranks of the first, the
   middle and the last stages side by side (``prism-debug run --graph
   --hardware``; waiting costs no CPU), so that drifts of the machine hit
   both sides alike;
4. stragglers, for real: in the same rounds, the real job with one rank's
   compute x2 (``DEVICE_TIME_SLOW_RANK``) against the emulation of other
   ranks with ``--perturb "slow R 2"`` on the unperturbed graph: each side's
   slowdown over its own unperturbed run of the round.

Per emulated rank: the mean steady iteration time (after ``--warmup``),
each round's emulation against the same round's real run (paired error),
the median over rounds.  Noise floor of a figure: how much two real runs
of consecutive rounds disagree on it, |a - b| / b, median over the pairs —
what a paired error would be from noise alone if the emulation were exact.

Secondary: the bundled example (``examples/train_gpt.py``, CPU compute, two
ranks, pp=2 and dp=2) as before, each rank's figures read from torchrun's
per-rank log files.

Last line: ``fidelity: iteration_time_error_pct=X peak_rss_error_pct=Y
straggler_error_pct=Z noise_floor_pct=N`` — X, Y over the device-time
workload's emulated ranks and layouts (mean absolute paired error), Z the
mean absolute difference of the emulated and real slowdowns (percentage
points), N the mean noise floor of the iteration times.  Goals (issue 13):
X ≤ 1, Y ≤ 1, Z ≤ 2.  Run it alone: other processes on two cores distort
both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "examples" / "device_time.py"
EXAMPLE = ROOT / "examples" / "train_gpt.py"
WORLD = 16
# name -> workload arguments; ranks are laid out tp fastest, pp slowest, so a
# stage is a block of 4 ranks: 0 is in the first stage, 5 and 10 in the middle
# ones, 15 in the last (it computes x1.5)
DEVICE_LAYOUTS = {"pp4xdp4": ["--pp", "4", "--tp", "1"],
                  "tp2xpp4xdp2": ["--pp", "4", "--tp", "2"]}
EMULATED = (0, 5, 10, 15)
CPU_LAYOUTS = {"pp=2": ["--tp", "1", "--pp", "2"], "dp=2": ["--tp", "1", "--pp", "1"]}
# small enough that an iteration takes a fraction of a second on two cores
CPU_MODEL = ["--layers", "4", "--hidden", "128", "--heads", "4", "--micro-batches", "4"]
CPU_WORLD = 2
_TIMING = re.compile(r"^timing rank=(\d+) iteration_s=(\[.*\]) peak_rss_bytes=(\d+)$", re.M)

Figures = dict[int, tuple[list[float], int]]  # rank -> (iteration times, peak RSS bytes)


def _env(**extra: str) -> dict[str, str]:
    # one thread per process: torch would otherwise start a thread per core
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("DEVICE_TIME_SLOW_RANK", None)  # a straggler only where asked for
    return {**env, **extra}


def _fail(what: str, code: int, output: str) -> None:
    sys.exit(f"bench_fidelity: {what} failed ({code}):\n{output[-3000:]}")


def _run(command: list[str], **env: str) -> str:
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_env(**env), stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        _fail(" ".join(command[:6]) + " …", proc.returncode, proc.stdout)
    return proc.stdout


def _side_by_side(commands: list[list[str]]) -> None:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env(), stdin=subprocess.DEVNULL) for c in commands]
    failed = None
    for command, proc in zip(commands, procs, strict=True):
        output, _ = proc.communicate()
        if proc.returncode != 0 and failed is None:
            failed = (" ".join(command[:8]) + " …", proc.returncode, output)
    if failed:
        _fail(*failed)


def _prism(*args: str) -> list[str]:
    return [sys.executable, "-m", "prism_debug.cli", *args]


def _torchrun(nproc: int, log_dir: Path) -> list[str]:
    # --standalone: torchrun picks its own free port (no race for one here);
    # --redirects 3: each rank's output goes to its own file, never to a
    # stdout shared with other ranks
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(nproc), "--log-dir", str(log_dir), "--redirects", "3"]


def steady_mean(times: list[float], warmup: int) -> float:
    return statistics.fmean(times[warmup:])


def _pct(a: float, b: float) -> float:
    return 100 * (a - b) / b


def noise_floor(values: list[float]) -> float:
    """Median |a - b| / b over consecutive real runs, in percent."""
    if len(values) < 2:
        return float("nan")
    return statistics.median(abs(_pct(a, b)) for b, a in pairwise(values))


# --- device-time workload ------------------------------------------------------


def read_timing_dir(directory: Path, ranks) -> Figures:
    found = {}
    for rank in ranks:
        path = directory / f"rank{rank}.json"
        if not path.exists():
            sys.exit(f"bench_fidelity: rank {rank} wrote no {path}")
        data = json.loads(path.read_text())
        found[rank] = (data["iteration_s"], int(data["peak_rss_bytes"]))
    return found


def device_real(script_args: list[str], out: Path, slow_rank: int | None) -> Figures:
    env = {} if slow_rank is None else {"DEVICE_TIME_SLOW_RANK": str(slow_rank)}
    _run([*_torchrun(WORLD, out / "logs"), str(DEVICE), *script_args,
          "--timing-dir", str(out / "timing")], **env)
    return read_timing_dir(out / "timing", range(WORLD))


def device_emulated(script_args: list[str], graph: Path, hardware: Path, out: Path,
                    ranks, perturb: str | None) -> tuple[Figures, dict[int, float]]:
    """rank -> figures from prism's report, and the workload's own wall-clock
    steady-state times (a diagnosis: the report's clock excludes the harness's
    bookkeeping)."""
    out.mkdir(parents=True, exist_ok=True)
    commands = []
    for rank in ranks:
        commands.append(_prism(
            "run", "--world-size", str(WORLD), "--gpus-per-node", str(WORLD), "--rank", str(rank),
            "--graph", str(graph), "--hardware", str(hardware),
            "--report", str(out / f"report-{rank}.json"), "--run-dir", str(out / f"run-{rank}"),
            *(["--perturb", perturb] if perturb else []),
            "--", sys.executable, str(DEVICE), *script_args, "--timing-dir", str(out / "timing")))
    _side_by_side(commands)
    figures = {}
    for rank in ranks:
        data = json.loads((out / f"report-{rank}.json").read_text())
        figures[rank] = ([it["time_s"] for it in data["iterations"]], int(data["peak_rss_bytes"]))
    return figures, {r: t for r, (t, _) in read_timing_dir(out / "timing", ranks).items()}


def device_workload(args, workdir: Path, hardware: Path) -> tuple[list, list]:
    rows, straggler_rows = [], []
    ranks = [int(r) for r in args.ranks.split(",")]
    for name in args.layouts.split(","):
        script_args = [*DEVICE_LAYOUTS[name], "--activation-kib", str(args.activation_kib),
                       "--iterations", str(args.iterations)]
        layout_dir = workdir / name
        layout_dir.mkdir(parents=True, exist_ok=True)
        graph = layout_dir / "graph.prism"
        print(f"{name}: profiling the 16-rank job …", flush=True)
        # The compute it records is sleeps, which do not drift with the
        # machine's load as CPU compute does: one profile serves every round.
        _run(_prism("profile", "--world-size", str(WORLD), "--gpus-per-node", str(WORLD),
                    "--iterations", str(args.profile_iterations), "--out", str(graph),
                    "--run-dir", str(layout_dir / "profile"), "--", sys.executable, str(DEVICE),
                    *script_args[:-2], "--iterations", str(args.profile_iterations)))
        straggle = name in args.straggler_layouts.split(",")
        perturb = f"slow {args.slow_rank} 2"
        # per round: rank -> steady mean, and the RSS, of each kind of run
        rounds: list[dict[str, dict[int, tuple[float, int]]]] = []
        walls: list[dict[int, float]] = []
        for k in range(1, args.rounds + 1):
            out = layout_dir / f"round{k}"
            result: dict[str, dict[int, tuple[float, int]]] = {}
            kinds = [("real", None), ("emulated", None)]
            if straggle:
                kinds += [("real slow", args.slow_rank), ("emulated slow", perturb)]
            for kind, change in kinds:
                print(f"{name}: round {k}/{args.rounds}: {kind} …", flush=True)
                target = out / kind.replace(" ", "-")
                if kind.startswith("real"):
                    figures = device_real(script_args, target, change)
                else:
                    figures, wall = device_emulated(script_args, graph, hardware, target, ranks,
                                                    change)
                    if kind == "emulated":
                        walls.append({r: steady_mean(t, args.warmup) for r, t in wall.items()})
                result[kind] = {r: (steady_mean(figures[r][0], args.warmup), figures[r][1])
                                for r in ranks}
            rounds.append(result)
            print(f"{name}: round {k}: " + "; ".join(
                f"rank {r} real {result['real'][r][0] * 1e3:.1f} / emulated "
                f"{result['emulated'][r][0] * 1e3:.1f} ms" for r in ranks), flush=True)
        for r in ranks:
            real = [res["real"][r][0] for res in rounds]
            emulated = [res["emulated"][r][0] for res in rounds]
            real_rss = statistics.median(res["real"][r][1] for res in rounds)
            emulated_rss = statistics.median(res["emulated"][r][1] for res in rounds)
            rss_pairs = [_pct(res["emulated"][r][1], res["real"][r][1]) for res in rounds]
            rows.append(dict(
                layout=name, rank=r, stage=r // 4, real=statistics.median(real),
                emulated=statistics.median(emulated),
                wall=statistics.median(w[r] for w in walls),
                error=statistics.median(_pct(e, a) for e, a in zip(emulated, real, strict=True)),
                noise=noise_floor(real), real_rss=real_rss, emulated_rss=emulated_rss,
                rss_error=statistics.median(rss_pairs),
                rss_noise=noise_floor([res["real"][r][1] for res in rounds])))
            if straggle:
                real_sd = [res["real slow"][r][0] / res["real"][r][0] for res in rounds]
                emu_sd = [res["emulated slow"][r][0] / res["emulated"][r][0] for res in rounds]
                straggler_rows.append(dict(
                    layout=name, rank=r, stage=r // 4, slow_rank=args.slow_rank,
                    real_slow=statistics.median(res["real slow"][r][0] for res in rounds),
                    emulated_slow=statistics.median(res["emulated slow"][r][0] for res in rounds),
                    real_slowdown=statistics.median(real_sd),
                    emulated_slowdown=statistics.median(emu_sd),
                    error=statistics.median(100 * (e - a)
                                            for e, a in zip(emu_sd, real_sd, strict=True)),
                    noise=statistics.median(abs(100 * (a - b)) for b, a in pairwise(real_sd))
                    if len(real_sd) > 1 else float("nan")))
    return rows, straggler_rows


# --- CPU-compute example (secondary) ---------------------------------------------


def cpu_real(script_args: list[str], out: Path) -> Figures:
    """One real torchrun of the example; each rank's timing line from its own log."""
    _run([*_torchrun(CPU_WORLD, out), str(EXAMPLE), *script_args, "--timing"])
    found = {}
    for rank in range(CPU_WORLD):
        logs = sorted(out.glob(f"*/attempt_*/{rank}/stdout.log"))
        matches = _TIMING.findall(logs[-1].read_text()) if logs else []
        if len(matches) != 1:
            sys.exit(f"bench_fidelity: rank {rank}'s log under {out} holds {len(matches)} timing "
                     "lines")
        (_, times, rss), = matches
        found[rank] = (json.loads(times), int(rss))
    return found


def cpu_emulated(script_args: list[str], graph: Path, hardware: Path, out: Path) -> Figures:
    """Every rank emulated at once, as the real job's ranks ran: on a machine
    this small a rank computes measurably slower next to another one."""
    _side_by_side([_prism(
        "run", "--world-size", str(CPU_WORLD), "--rank", str(rank), "--gpus-per-node",
        str(CPU_WORLD), "--hardware", str(hardware), "--graph", str(graph),
        "--report", str(out / f"report-{rank}.json"), "--run-dir", str(out / f"run-{rank}"),
        "--", sys.executable, str(EXAMPLE), *script_args) for rank in range(CPU_WORLD)])
    results = {}
    for rank in range(CPU_WORLD):
        data = json.loads((out / f"report-{rank}.json").read_text())
        results[rank] = ([it["time_s"] for it in data["iterations"]], int(data["peak_rss_bytes"]))
    return results


def cpu_example(args, workdir: Path, hardware: Path) -> list:
    rows = []
    for name in args.cpu_layouts.split(","):
        script_args = [*CPU_MODEL, *CPU_LAYOUTS[name], "--backend", "gloo",
                       "--iterations", str(args.cpu_iterations)]
        pairs: dict[int, list[tuple[float, float, int, int]]] = {r: [] for r in range(CPU_WORLD)}
        for k in range(1, args.cpu_rounds + 1):
            print(f"cpu {name}: round {k}/{args.cpu_rounds}: profile, real run, emulation …",
                  flush=True)
            out = workdir / "cpu" / name.replace("=", "") / f"round{k}"
            out.mkdir(parents=True, exist_ok=True)
            # Profiled afresh each round next to the runs it is compared with
            # (CPU speed drifts here by tens of percent over minutes), two side
            # by side, so that slices compute next to a neighbour as real ranks do.
            _side_by_side([_prism(
                "profile", "--world-size", str(CPU_WORLD), "--gpus-per-node", str(CPU_WORLD),
                "--iterations", str(args.cpu_iterations), "--out", str(out / f"graph{i}.prism"),
                "--run-dir", str(out / f"profile{i}"), "--", sys.executable, str(EXAMPLE),
                *script_args) for i in range(CPU_WORLD)])
            real = cpu_real(script_args, out / "real")
            emulated = cpu_emulated(script_args, out / "graph0.prism", hardware, out)
            for rank in range(CPU_WORLD):
                pairs[rank].append((steady_mean(real[rank][0], args.warmup),
                                    steady_mean(emulated[rank][0], args.warmup),
                                    real[rank][1], emulated[rank][1]))
        for rank, rounds in pairs.items():
            real = [r for r, _, _, _ in rounds]
            rows.append(dict(
                layout=name, rank=rank, real=statistics.median(real),
                emulated=statistics.median(e for _, e, _, _ in rounds),
                error=statistics.median(_pct(e, r) for r, e, _, _ in rounds),
                noise=noise_floor(real),
                real_rss=statistics.median(m for _, _, m, _ in rounds),
                emulated_rss=statistics.median(m for _, _, _, m in rounds),
                rss_error=statistics.median(_pct(e, r) for _, _, r, e in rounds)))
    return rows


# --- report --------------------------------------------------------------------------


def print_tables(rows, straggler_rows, cpu_rows) -> None:
    print("\ndevice-time workload (16 real processes; emulated ranks side by side), "
          "medians over rounds:")
    print(f"{'layout':>12} {'rank':>4} {'stage':>5} {'real ms':>8} {'emulated':>8} "
          f"{'paired':>7} {'noise':>6} {'wall ms':>8} {'real MiB':>8} {'emu MiB':>8} "
          f"{'RSS err':>7} {'noise':>6}")
    for r in rows:
        print(f"{r['layout']:>12} {r['rank']:>4} {r['stage']:>5} {r['real'] * 1e3:>8.2f} "
              f"{r['emulated'] * 1e3:>8.2f} {r['error']:>+6.2f}% {r['noise']:>5.2f}% "
              f"{r['wall'] * 1e3:>8.2f} {r['real_rss'] / 2**20:>8.1f} "
              f"{r['emulated_rss'] / 2**20:>8.1f} {r['rss_error']:>+6.2f}% "
              f"{r['rss_noise']:>5.2f}%")
    if straggler_rows:
        print("\nstragglers: the real job with rank R's compute x2 against the emulation with "
              "--perturb 'slow R 2' (slowdown = slowed / unperturbed, same round):")
        print(f"{'layout':>12} {'R':>3} {'rank':>4} {'real ms':>8} {'emulated':>8} "
              f"{'real x':>7} {'emul x':>7} {'error pts':>9} {'noise':>6}")
        for r in straggler_rows:
            print(f"{r['layout']:>12} {r['slow_rank']:>3} {r['rank']:>4} "
                  f"{r['real_slow'] * 1e3:>8.2f} {r['emulated_slow'] * 1e3:>8.2f} "
                  f"{r['real_slowdown']:>7.4f} {r['emulated_slowdown']:>7.4f} "
                  f"{r['error']:>+8.2f} {r['noise']:>6.2f}")
    if cpu_rows:
        print("\nsecondary: CPU-compute example (train_gpt.py, 2 ranks), medians over rounds:")
        for r in cpu_rows:
            print(f"  {r['layout']:>5} rank {r['rank']}: real {r['real'] * 1e3:.2f} ms, "
                  f"emulated {r['emulated'] * 1e3:.2f} ms, paired {r['error']:+.2f}% "
                  f"(noise {r['noise']:.2f}%); RSS {r['real_rss'] / 2**20:.1f} / "
                  f"{r['emulated_rss'] / 2**20:.1f} MiB ({r['rss_error']:+.2f}%)")
        print(f"secondary: cpu iteration_time_error_pct="
              f"{statistics.fmean(abs(r['error']) for r in cpu_rows):.2f} peak_rss_error_pct="
              f"{statistics.fmean(abs(r['rss_error']) for r in cpu_rows):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved real/emulated rounds.")
    parser.add_argument("--iterations", type=int, default=20, help="Iterations per run.")
    parser.add_argument("--warmup", type=int, default=3, help="Iterations left out of the mean.")
    parser.add_argument("--profile-iterations", type=int, default=8)
    parser.add_argument("--layouts", default=",".join(DEVICE_LAYOUTS),
                        help=f"Device-time layouts, of {', '.join(DEVICE_LAYOUTS)}.")
    parser.add_argument("--ranks", default=",".join(map(str, EMULATED)),
                        help="Ranks to emulate (first, middle and last stages).")
    parser.add_argument("--slow-rank", type=int, default=6,
                        help="The straggler (compute x2), a rank not emulated.")
    parser.add_argument("--straggler-layouts", default="pp4xdp4",
                        help="Layouts with the straggler comparison ('' for none).")
    parser.add_argument("--activation-kib", type=int, default=16,
                        help="Bytes sent between stages per micro-batch (see docs/benchmarks: at "
                             "256 KiB gloo's transfers among 16 processes cost more than "
                             "the calibrated profile says).")
    parser.add_argument("--calibrate-processes", type=int, default=4,
                        help="Processes of calibrate --local.  As many as the real job (16) "
                             "would price gloo ops that share two cores with all of them (a "
                             "send's latency here: ~0.2 ms between 4 processes, ~0.9 ms among "
                             "16), but the least-squares calibration of 5 ops at 8 sizes in "
                             "11 passes among 16 processes does not finish in 10 minutes on "
                             "two cores; 4 does in about a minute.")
    parser.add_argument("--hardware", type=Path,
                        help="Use this profile instead of calibrating afresh.")
    parser.add_argument("--cpu-rounds", type=int, default=2,
                        help="Rounds of the CPU-compute example (0: leave it out).")
    parser.add_argument("--cpu-iterations", type=int, default=10)
    parser.add_argument("--cpu-layouts", default=",".join(CPU_LAYOUTS))
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds, 12 iterations, one layout, no CPU example (minutes).")
    parser.add_argument("--workdir", type=Path, help="Keep profiles, graphs and reports here.")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.iterations, args.cpu_rounds = 2, 12, 0
        args.layouts = args.layouts.split(",")[0]
    if args.iterations <= args.warmup or args.cpu_iterations <= args.warmup:
        sys.exit("bench_fidelity: iterations must exceed --warmup")
    if args.slow_rank in [int(r) for r in args.ranks.split(",")]:
        sys.exit("bench_fidelity: --slow-rank must not be an emulated rank (a real rank "
                 "cannot be perturbed as a virtual peer)")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prism-fidelity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"bench_fidelity: working in {workdir}", flush=True)

    hardware = args.hardware or workdir / "local.toml"
    if not args.hardware:
        print(f"calibrating gloo between {args.calibrate_processes} processes on this host …",
              flush=True)
        print(_run(_prism("calibrate", "--local", "--processes", str(args.calibrate_processes),
                          "--out", str(hardware))), end="", flush=True)

    rows, straggler_rows = device_workload(args, workdir, hardware)
    cpu_rows = []
    if args.cpu_rounds:
        # the example's two ranks: fitted to two processes, as it always was
        cpu_hardware = workdir / "local2.toml"
        _run(_prism("calibrate", "--local", "--processes", str(CPU_WORLD),
                    "--out", str(cpu_hardware)))
        cpu_rows = cpu_example(args, workdir, cpu_hardware)
    print_tables(rows, straggler_rows, cpu_rows)
    x = statistics.fmean(abs(r["error"]) for r in rows)
    y = statistics.fmean(abs(r["rss_error"]) for r in rows)
    z = statistics.fmean(abs(r["error"]) for r in straggler_rows) if straggler_rows \
        else float("nan")
    n = statistics.fmean(r["noise"] for r in rows)
    print(f"fidelity: iteration_time_error_pct={x:.2f} peak_rss_error_pct={y:.2f} "
          f"straggler_error_pct={z:.2f} noise_floor_pct={n:.2f}")


if __name__ == "__main__":
    main()
