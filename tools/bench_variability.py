"""Stochastic prediction against real jobs: p50 and p95 of the iteration time.

The real job is the fidelity benchmark's device-time workload
(``examples/device_time.py``, pp=4 x dp=4: 16 processes under ``torchrun``,
whose compute is sleeps) with *jittered* device time: every stretch of
compute between two communication ops — a micro-batch's forward or backward
on a stage, the optimizer step — is multiplied by a fresh draw of a factor
of mean 1 and coefficient of variation C from a stated family, each rank
drawing from its own generator seeded with (seed, rank).  The prediction is
``prism_debug.predict.predict`` on the graph of the *unjittered* job with the
same variability stated (``--variability "cv=C dist=F"``).  The bench

1. fits a hardware profile to this host (``prism-debug calibrate --local
   --processes 4``, as ``tools/bench_fidelity.py`` does, or ``--hardware``),
2. profiles the unjittered job once (``prism-debug profile``, world 16): its
   graph's gaps are then the configured durations, which the stated
   variability multiplies,
3. each round, runs the real job unjittered and once per stated variability
   (each round with other seeds: round k's ranks draw from (seed + k, rank)),
   every rank writing its iteration times to its own file,
4. predicts each variability on the graph (``--samples`` Monte Carlo samples,
   each as many steady iterations as a real run keeps: ``--iterations``
   less ``--warmup``), and compares p50 and p95 of the iteration time of
   each reported rank: the real side pools the steady iterations of every
   round, the prediction the same rank's steady iterations of every sample.

Which ranks: rank 0 (the first stage: the job's iteration as the first rank
counts it) and rank 15 (the last stage, which computes x1.5 and where an
iteration's end sees the least pipeline slack, so its iteration times spread
the most).  Every rank of a stage has the same distribution; the stages'
means agree (they move at one pace) but not their spreads.

Noise floor of a figure: |a - b| / b between two consecutive rounds' real
figures (each round's own p50 or p95), median over the pairs — how much two
real measurements of it disagree.  The pooled figure (all rounds) is
steadier than one round's, so this is an upper bound of its noise.

Beside the stochastic figures the deterministic ones: the unjittered real
job against the deterministic replay of the graph (the emulation's own
error, which the fidelity benchmark measures: -1 to -3 % here, gloo among 16
processes on two cores costing more than a calibration among 4 measures).
The unjittered job's own p95 shows the machine's spread, which the real
side has and predict does not model.  The *added* columns (ms) take the
offset out: p50 and p95 less the deterministic figure on each side (the
unjittered job's p50, the deterministic replay's), what variability adds to
the iteration.

Optional (``--fitted``): profile the jittered job with more iterations
(graph v3 fits each gap's distribution) and predict with ``--variability
fitted``; informative, no goal.

Last line: ``variability: p50_error_pct=X p95_error_pct=Y
noise_floor_pct=N`` — X, Y the mean absolute errors over the stated
variabilities and ranks, N the mean noise floor of those figures.  Goal
(issue 17): X <= 3 and Y <= 3.  Run it alone: other processes on two cores
distort the real side.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import numpy as np

from prism_debug.errors import VariabilityError

ROOT = Path(__file__).resolve().parent.parent
DEVICE = ROOT / "examples" / "device_time.py"
WORLD = 16
LAYOUT = ["--pp", "4", "--tp", "1"]  # bench_fidelity's first layout: pp=4 x dp=4 (--pp)
QUANTILES = (50, 95)


@dataclasses.dataclass(frozen=True)
class Stated:
    """One stated variability: the real job's jitter and predict's --variability."""

    family: str
    cv: float
    rank_cv: float = 0.0

    @classmethod
    def parse(cls, text: str) -> Stated:
        # "normal:0.1" or "lognormal:0.1:0.02" (family:cv[:rank_cv])
        family, cv, *rest = text.split(":")
        return cls(family, float(cv), float(rest[0]) if rest else 0.0)

    @property
    def name(self) -> str:
        return f"{self.family} cv={self.cv:g}" + (f" rank-cv={self.rank_cv:g}"
                                                   if self.rank_cv else "")

    def script_args(self, seed: int) -> list[str]:
        return ["--jitter-cv", str(self.cv), "--jitter-dist", self.family,
                "--rank-cv", str(self.rank_cv), "--jitter-seed", str(seed)]

    def variability_terms(self) -> list[str]:
        terms = [f"cv={self.cv:g} dist={self.family}"]
        if self.rank_cv:
            terms.append(f"rank-cv={self.rank_cv:g} dist={self.family}")
        return terms


def _env() -> dict[str, str]:
    # one thread per process: torch would otherwise start a thread per core
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("DEVICE_TIME_SLOW_RANK", None)
    return env


def _run(command: list[str]) -> str:
    proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=_env(), stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        sys.exit(f"bench_variability: {' '.join(command[:8])} … failed ({proc.returncode}):\n"
                 f"{proc.stdout[-3000:]}")
    return proc.stdout


def _prism(*args: str) -> list[str]:
    return [sys.executable, "-m", "prism_debug.cli", *args]


def _pct(a: float, b: float) -> float:
    return 100 * (a - b) / b


def percentiles(values) -> tuple[float, float]:
    """p50 and p95 (numpy's default, linear interpolation between order statistics)."""
    p50, p95 = np.percentile(np.asarray(values, dtype=float), QUANTILES)
    return float(p50), float(p95)


def noise_floor(figures: list[float]) -> float:
    """Median |a - b| / b over consecutive rounds' figures, in percent."""
    if len(figures) < 2:
        return float("nan")
    return statistics.median(abs(_pct(a, b)) for b, a in pairwise(figures))


# --- the real job ------------------------------------------------------------------


def real_job(script_args: list[str], out: Path, ranks) -> dict[int, list[float]]:
    """rank -> iteration times of one torchrun of the workload (16 processes);
    each rank writes its own file (--redirects 3: its output too)."""
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone",
          "--nproc-per-node", str(WORLD), "--log-dir", str(out / "logs"), "--redirects", "3",
          str(DEVICE), *script_args, "--timing-dir", str(out / "timing")])
    found = {}
    for rank in ranks:
        path = out / "timing" / f"rank{rank}.json"
        if not path.exists():
            sys.exit(f"bench_variability: rank {rank} wrote no {path}")
        found[rank] = json.loads(path.read_text())["iteration_s"]
    return found


# --- the prediction ----------------------------------------------------------------


def load_cost(graph_path: Path, hardware: Path):
    """The graph and the cost function that run/replay --hardware build."""
    from prism_debug.cost import CostModel, load_profile
    from prism_debug.graph import ExecutionGraph

    graph = ExecutionGraph.load(graph_path)
    model = CostModel(dataclasses.replace(load_profile(str(hardware)),
                                          gpus_per_node=graph.gpus_per_node))
    return graph, model.op_time_s


def deterministic(graph, cost, iterations: int, warmup: int, ranks) -> dict[int, float]:
    """rank -> the deterministic replay's median steady iteration time."""
    from prism_debug.engine import ReplayEngine

    engine = ReplayEngine(graph, cost)
    engine.run(iterations)
    return {r: statistics.median(engine.iteration_times(r)[warmup:iterations]) for r in ranks}


def predicted(graph, cost, terms: list[str], steady: int, ranks, samples: int,
              seed: int) -> dict[int, tuple[float, float]]:
    """rank -> (p50, p95) of predict's steady iteration times for ``terms``
    (``steady`` iterations after the graph's warm-up, pooled over samples)."""
    from prism_debug.predict import predict
    from prism_debug.variability import parse_variability

    variability = parse_variability(terms)
    variability.check(graph)
    found = {}
    for rank in ranks:
        prediction = predict(graph, cost, variability, samples=samples, iterations=steady,
                             rank=rank, seed=seed, attribution=False)
        found[rank] = (prediction.iteration.p50_s, prediction.iteration.p95_s)
    return found


# --- the bench ---------------------------------------------------------------------


def profile(script_args: list[str], iterations: int, out: Path) -> Path:
    graph = out / "graph.prism"
    out.mkdir(parents=True, exist_ok=True)
    _run(_prism("profile", "--world-size", str(WORLD), "--gpus-per-node", str(WORLD),
                "--iterations", str(iterations), "--out", str(graph), "--run-dir",
                str(out / "profile"), "--", sys.executable, str(DEVICE), *script_args,
                "--iterations", str(iterations)))
    return graph


def run_rounds(args, stated: list[Stated], workdir: Path, ranks) -> dict[str, list[dict]]:
    """kind -> per round, rank -> steady iteration times; kinds interleaved."""
    script_args = [*LAYOUT, "--activation-kib", str(args.activation_kib),
                   "--iterations", str(args.iterations)]
    rounds: dict[str, list[dict]] = {"unjittered": [], **{s.name: [] for s in stated}}
    for k in range(1, args.rounds + 1):
        for kind in rounds:
            print(f"round {k}/{args.rounds}: real job, {kind} …", flush=True)
            jitter = [] if kind == "unjittered" else next(
                s for s in stated if s.name == kind).script_args(args.seed + k)
            out = workdir / f"round{k}" / kind.replace(" ", "_").replace("=", "")
            times = real_job([*script_args, *jitter], out, ranks)
            rounds[kind].append({r: t[args.warmup:] for r, t in times.items()})
        print(f"round {k}: " + "; ".join(
            f"{kind} rank {r} p50/p95 " + "/".join(
                f"{p * 1e3:.1f}" for p in percentiles(rounds[kind][-1][r])) + " ms"
            for kind in rounds for r in ranks[:1]), flush=True)
    return rounds


def compare(rounds, stated, graph, cost, args, ranks) -> tuple[list[dict], dict]:
    det = deterministic(graph, cost, args.iterations, args.warmup, ranks)
    unjittered = {r: percentiles([t for rnd in rounds["unjittered"] for t in rnd[r]])
                  for r in ranks}
    real_det = {r: unjittered[r][0] for r in ranks}
    baseline = {r: dict(real=real_det[r], real_p95=unjittered[r][1], replay=det[r],
                        error=_pct(det[r], real_det[r]),
                        noise=noise_floor([percentiles(rnd[r])[0]
                                           for rnd in rounds["unjittered"]]))
                for r in ranks}
    rows = []
    for s in stated:
        started = time.perf_counter()
        try:
            pred = predicted(graph, cost, s.variability_terms(), args.iterations - args.warmup,
                             ranks, args.samples, args.predict_seed)
        except ImportError as error:  # predict (part C) not on this branch yet
            print(f"bench_variability: no prediction for {s.name}: {error}", flush=True)
            pred = {r: (float("nan"), float("nan")) for r in ranks}
        seconds = time.perf_counter() - started
        for r in ranks:
            pooled = percentiles([t for rnd in rounds[s.name] for t in rnd[r]])
            per_round = [percentiles(rnd[r]) for rnd in rounds[s.name]]
            row = dict(stated=s.name, rank=r, predict_s=seconds / len(ranks))
            for i, q in enumerate(QUANTILES):
                row[f"real_p{q}"], row[f"pred_p{q}"] = pooled[i], pred[r][i]
                row[f"error_p{q}"] = _pct(pred[r][i], pooled[i])
                row[f"noise_p{q}"] = noise_floor([p[i] for p in per_round])
                # what variability adds over each side's deterministic figure
                real_add, pred_add = pooled[i] - real_det[r], pred[r][i] - det[r]
                row[f"spread_p{q}"] = (real_add * 1e3, pred_add * 1e3)
            rows.append(row)
    return rows, baseline


def fitted_rows(args, workdir: Path, hardware: Path, stated: list[Stated], rounds, ranks):
    """Profile each jittered job and predict with the graph's fitted distributions."""
    rows = []
    for s in stated:
        print(f"fitted: profiling the {s.name} job ({args.fitted_iterations} iterations) …",
              flush=True)
        out = workdir / "fitted" / s.name.replace(" ", "_").replace("=", "")
        graph_path = profile([*LAYOUT, "--activation-kib", str(args.activation_kib),
                              *s.script_args(args.seed)], args.fitted_iterations, out)
        graph, cost = load_cost(graph_path, hardware)
        try:
            pred = predicted(graph, cost, ["fitted"], args.iterations - args.warmup, ranks,
                             args.samples, args.predict_seed)
        except (ImportError, VariabilityError) as error:  # no predict, or a graph without fits
            print(f"bench_variability: no fitted prediction for {s.name}: {error}", flush=True)
            continue
        for r in ranks:
            pooled = percentiles([t for rnd in rounds[s.name] for t in rnd[r]])
            rows.append(dict(stated=s.name, rank=r, real=pooled, pred=pred[r],
                             errors=[_pct(p, a) for p, a in zip(pred[r], pooled, strict=True)]))
    return rows


def print_tables(rows, baseline, fitted) -> None:
    print("\ndeterministic: the unjittered real job (p50 of pooled steady iterations; its p95 "
          "is the machine's own spread) against the deterministic replay of its graph:")
    print(f"{'rank':>4} {'real p50':>8} {'real p95':>8} {'replay ms':>9} {'error':>7} "
          f"{'noise':>6}")
    for r, b in baseline.items():
        print(f"{r:>4} {b['real'] * 1e3:>8.2f} {b['real_p95'] * 1e3:>8.2f} "
              f"{b['replay'] * 1e3:>9.2f} {b['error']:>+6.2f}% {b['noise']:>5.2f}%")
    print("\nstochastic: the jittered real job (steady iterations of every round pooled) "
          "against predict with the same variability:")
    print(f"{'variability':>24} {'rank':>4} {'real p50':>8} {'pred p50':>8} {'error':>7} "
          f"{'noise':>6} {'real p95':>8} {'pred p95':>8} {'error':>7} {'noise':>6} "
          f"{'added p50 real/pred':>19} {'added p95 real/pred':>19}")
    for r in rows:
        print(f"{r['stated']:>24} {r['rank']:>4} {r['real_p50'] * 1e3:>8.2f} "
              f"{r['pred_p50'] * 1e3:>8.2f} {r['error_p50']:>+6.2f}% {r['noise_p50']:>5.2f}% "
              f"{r['real_p95'] * 1e3:>8.2f} {r['pred_p95'] * 1e3:>8.2f} "
              f"{r['error_p95']:>+6.2f}% {r['noise_p95']:>5.2f}%"
              + "".join(f" {r[k][0]:>9.2f} / {r[k][1]:>6.2f}" for k in ("spread_p50",
                                                                        "spread_p95")))
    if fitted:
        print("\nfitted (informative): predict --variability fitted on a profile of the "
              "jittered job:")
        for f in fitted:
            print(f"{f['stated']:>24} rank {f['rank']:>2}: real p50/p95 "
                  f"{f['real'][0] * 1e3:.2f}/{f['real'][1] * 1e3:.2f} ms, predicted "
                  f"{f['pred'][0] * 1e3:.2f}/{f['pred'][1] * 1e3:.2f} ms "
                  f"({f['errors'][0]:+.2f} % / {f['errors'][1]:+.2f} %)")


def measure(args, stated, workdir: Path, hardware: Path, ranks):
    """Calibrate (unless --hardware), profile the unjittered job, run the rounds."""
    if not args.hardware:
        print(f"calibrating gloo between {args.calibrate_processes} processes on this host …",
              flush=True)
        print(_run(_prism("calibrate", "--local", "--processes", str(args.calibrate_processes),
                          "--out", str(hardware))), end="", flush=True)
    print("profiling the unjittered 16-rank job …", flush=True)
    graph_path = profile([*LAYOUT, "--activation-kib", str(args.activation_kib)],
                         args.profile_iterations, workdir)
    return graph_path, run_rounds(args, stated, workdir, ranks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variability", default="normal:0.1,lognormal:0.1,gamma:0.2",
                        help="Stated variabilities, comma-separated FAMILY:CV[:RANK_CV] "
                             "(families: normal, gamma, lognormal).")
    parser.add_argument("--pp", type=int, default=4,
                        help="Pipeline stages (dp = 16 / pp): 1 leaves only the data-parallel "
                             "all-reduces, no point-to-point ops.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved real rounds.")
    parser.add_argument("--iterations", type=int, default=100, help="Iterations per run.")
    parser.add_argument("--warmup", type=int, default=5, help="Iterations left out.")
    parser.add_argument("--ranks", default="0,15", help="Ranks compared (first, last stage).")
    parser.add_argument("--samples", type=int, default=200,
                        help="predict's Monte Carlo samples (each --iterations long).")
    parser.add_argument("--seed", type=int, default=0,
                        help="Round k's real ranks draw from (seed + k, rank).")
    parser.add_argument("--predict-seed", type=int, default=0)
    parser.add_argument("--profile-iterations", type=int, default=8)
    parser.add_argument("--activation-kib", type=int, default=16,
                        help="Bytes between stages per micro-batch (bench_fidelity's).")
    parser.add_argument("--calibrate-processes", type=int, default=4,
                        help="Processes of calibrate --local (see bench_fidelity).")
    parser.add_argument("--hardware", type=Path,
                        help="Use this profile instead of calibrating afresh.")
    parser.add_argument("--fitted", action="store_true",
                        help="Also profile each jittered job and predict --variability fitted.")
    parser.add_argument("--fitted-iterations", type=int, default=40)
    parser.add_argument("--quick", action="store_true",
                        help="2 rounds of 40 iterations, normal cv 0.1 only (minutes).")
    parser.add_argument("--workdir", type=Path, help="Keep profiles, graphs and timings here.")
    parser.add_argument("--reuse", action="store_true",
                        help="Reuse --workdir's profile, calibration and real rounds (an "
                             "earlier run's, with the same options): predict only.")
    args = parser.parse_args()
    if args.reuse and not args.workdir:
        sys.exit("bench_variability: --reuse needs --workdir")
    if args.quick:
        args.rounds, args.iterations, args.variability = 2, 40, "normal:0.1"
    if args.iterations <= args.warmup:
        sys.exit("bench_variability: --iterations must exceed --warmup")
    if args.pp < 1 or 16 % args.pp:
        sys.exit("bench_variability: --pp must divide the 16 ranks")
    LAYOUT[1] = str(args.pp)
    stated = [Stated.parse(t) for t in args.variability.split(",") if t]
    ranks = [int(r) for r in args.ranks.split(",")]
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="prism-variability-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"bench_variability: working in {workdir}", flush=True)
    started = time.perf_counter()

    hardware = args.hardware or workdir / "local.toml"
    saved = workdir / "real_rounds.json"
    if args.reuse:
        # the profile, the calibration and the real rounds of an earlier run of
        # this bench in --workdir: predict again (a changed predict) without
        # running the real jobs
        graph_path, rounds = workdir / "graph.prism", json.loads(saved.read_text())
        rounds = {kind: [{int(r): t for r, t in rnd.items()} for rnd in per_round]
                  for kind, per_round in rounds.items()}
        missing = [s.name for s in stated if s.name not in rounds]
        if missing or not graph_path.exists() or not hardware.exists():
            sys.exit(f"bench_variability: --reuse: {workdir} lacks the graph, the hardware "
                     f"profile or real rounds of {missing}")
    else:
        graph_path, rounds = measure(args, stated, workdir, hardware, ranks)
        saved.write_text(json.dumps(rounds))
    graph, cost = load_cost(graph_path, hardware)
    rows, baseline = compare(rounds, stated, graph, cost, args, ranks)
    fitted = fitted_rows(args, workdir, hardware, stated, rounds, ranks) if args.fitted else []
    print_tables(rows, baseline, fitted)
    x = statistics.fmean(abs(r["error_p50"]) for r in rows)
    y = statistics.fmean(abs(r["error_p95"]) for r in rows)
    n = statistics.fmean(v for r in rows for v in (r["noise_p50"], r["noise_p95"]))
    print(f"bench_variability: {time.perf_counter() - started:.0f} s")
    print(f"variability: p50_error_pct={x:.2f} p95_error_pct={y:.2f} noise_floor_pct={n:.2f}")


if __name__ == "__main__":
    main()
