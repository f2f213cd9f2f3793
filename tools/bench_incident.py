"""From a production incident's flight-recorder dumps to the reproduced hang: how long.

What an engineer does after a hang, timed phase by phase with prism-debug's
own commands, each in a subprocess as a user runs it:

1. import: ``prism-debug incident DUMP_DIR --out SCENARIO -- COMMAND`` reads
   the dumps, runs torch's fr_trace on them and writes the scenario;
2. profile: the graph of COMMAND, profiled inside that same call on its
   first run (a private, empty graph cache per case,
   ``$PRISM_DEBUG_GRAPH_CACHE``, so it is really measured: the time is the
   one the command reports, ``graph: profiled in X s``, and import is the
   call's wall time less that);
3. run: ``prism-debug scenario run SCENARIO`` until it prints its verdicts
   (the same cache: the graph just profiled is found there).

Incidents:

* real ones (``tools/incident_jobs.py``): a torchrun gloo job of
  ``examples/device_time.py`` of 16 processes in which rank 2 hangs, dies,
  or all-reduces the wrong size at iteration 3, every surviving rank writing
  torch's own dump.  The job is the production incident, not part of the
  time; its wall time is printed beside.  hang and die: pp 2 x tp 2 x dp 4;
  size: pp 2 x tp 1 x dp 8, as tests/incident lay it out (gloo aborts one
  of the culprit's dp peers, which leaves no dump: a wide dp group keeps
  enough of them for fr_trace to name the culprit);
* an 8,192-rank one of the bundled example (tp 8 x pp 4 x dp 256): a
  scenario in which dp peer 1029 of the real rank 5 fails at iteration 3
  (like examples/scenarios/dp_peer_fail_stop.yaml) leaves the flight record
  prism-debug's harness writes (the real rank's dump, the virtual peers' of
  the timed-out group in ``peers/``: a sample of ranks, not all 8,192);
  that folder is then imported with ``--world-size 8192 -- <the example's
  command>`` and reproduced.  Making the dumps is not part of the time.
  Should the import read fewer dumps than the folder and its subfolders
  hold, the same dumps copied into one folder are imported and reproduced
  too, as a diagnostic outside the headline.

Each reproduction's verdicts are printed as ``scenario run`` prints them
(PASS/FAIL per expectation; the flight_record one is fr_trace's verdict on
the reproduction's dumps against fr_trace's on the incident's).  Last line:
``incident: seconds_to_reproduce=X``, X the larger of the worst real
incident and the 8,192-rank one (goal: 300).  ``--quick``: one 8-process
hang only.  Every subprocess runs under a wall-clock limit, and whatever
carries this run's token in its environment is killed before the bench
ends, so no process outlives it.

    python tools/bench_incident.py [--quick] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# after the sys.path set-up above: tools/ (and prism_debug) import from this checkout
from prism_debug.example import SCRIPT as EXAMPLE_SCRIPT  # noqa: E402
from prism_debug.example import Example  # noqa: E402
from tools.incident_jobs import run_real_incident  # noqa: E402

GOAL_S = 300
TOKEN_VARIABLE = "PRISM_DEBUG_BENCH_INCIDENT"  # marks every process this bench starts
STEP_LIMIT_S = 420  # one prism-debug command
JOB_LIMIT_S = 300  # one real torchrun job
CULPRIT, ITERATION, JOB_TIMEOUT_S = 2, 3, 5
BIG_WORLD, BIG_RANK, BIG_PEER = 8192, 5, 1029  # 1029 = 5 + 8 * 128: rank 5's dp peer 128
BIG_ITERATIONS = 4
LOAD_AT_START = ""  # os.getloadavg() when the bench began, for the last lines
PROFILED = re.compile(r"graph: profiled in ([0-9.]+) s")


@dataclass(frozen=True)
class RealCase:
    kind: str
    nproc: int
    pp: int
    tp: int


@dataclass
class Timing:
    name: str
    job_s: float | None = None  # making the incident (not part of the time)
    import_s: float = 0.0
    profile_s: float = 0.0
    run_s: float = 0.0
    verdicts: list[str] = field(default_factory=list)
    passed: bool = False
    problem: str = ""
    dumps_read: int | None = None  # what prism-debug incident says it read
    diagnostic: Timing | None = None  # not part of the headline

    @property
    def total_s(self) -> float:
        return self.import_s + self.profile_s + self.run_s


@dataclass(frozen=True)
class Step:
    returncode: int
    output: str
    wall_s: float
    lines: tuple[tuple[float, str], ...] = ()  # (seconds since the start, line)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one 8-process hang only (a smoke run)")
    parser.add_argument("--keep", type=Path, help="keep every file here (dumps, scenarios, "
                                                  "runs, logs)")
    args = parser.parse_args(argv)
    token = uuid.uuid4().hex
    os.environ[TOKEN_VARIABLE] = token  # inherited by torchrun's workers and every rank
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = (args.keep.resolve() if args.keep
            else Path(tempfile.mkdtemp(prefix="prism-bench-incident-")))
    work.mkdir(parents=True, exist_ok=True)
    global LOAD_AT_START
    LOAD_AT_START = _load()
    print(f"bench_incident: {os.cpu_count()} cores, load average at start "
          f"{LOAD_AT_START}; files in {work}{'' if args.keep else ' (removed at the end)'}",
          flush=True)
    real_cases = ([RealCase("hang", 8, 2, 2)] if args.quick else
                  [RealCase("hang", 16, 2, 2), RealCase("die", 16, 2, 2),
                   RealCase("size", 16, 2, 1)])
    timings: list[Timing] = []
    try:
        for case in real_cases:
            timings.append(_real_case(case, work / f"{case.kind}{case.nproc}", token))
        big = None if args.quick else _big_case(work / f"example{BIG_WORLD}", token)
    finally:
        _end_processes(token)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return _report(timings, big)


def _real_case(case: RealCase, out: Path, token: str) -> Timing:
    name = f"{case.kind}, {case.nproc} processes (pp {case.pp} x tp {case.tp} x dp " \
           f"{case.nproc // (case.pp * case.tp)})"
    print(f"\n== real incident: {name}, rank {CULPRIT} at iteration {ITERATION}", flush=True)
    timing = Timing(name)
    try:
        job = run_real_incident(case.kind, out / "job", nproc=case.nproc, pp=case.pp,
                                tp=case.tp, culprit=CULPRIT, iteration=ITERATION,
                                timeout_s=JOB_TIMEOUT_S, wall_limit_s=JOB_LIMIT_S)
    except Exception as exc:  # noqa: BLE001 - the bench reports it and goes on
        timing.problem = f"the real job failed: {exc}"
        print(f"  {timing.problem}", flush=True)
        return timing
    finally:
        _end_processes(token)
    timing.job_s = job.wall_s
    print(f"  job: {job.wall_s:.1f} s wall (torchrun exit {job.returncode}); dumps from "
          f"{len(job.dumped_ranks)} ranks, none from {list(job.missing_ranks)}", flush=True)
    return _reproduce(timing, job.dump_dir, list(job.command), out, token,
                      extra=["--prefix", job.prefix])


def _big_case(out: Path, token: str) -> Timing:
    name = f"bundled example, {BIG_WORLD} ranks (tp 8 x pp 4 x dp 256), harness's flight record"
    print(f"\n== {name}: dp peer {BIG_PEER} of rank {BIG_RANK} fails at iteration {ITERATION}",
          flush=True)
    timing = Timing(name)
    out.mkdir(parents=True, exist_ok=True)
    made = out / "incident.yaml"
    made.write_text(_big_incident_scenario(), encoding="utf-8")
    # its own cache: the timed import below must profile afresh
    step = _prism(["scenario", "run", str(made), "--run-dir", str(out / "incident-run")],
                  out / "incident-cache", out / "incident.log", token)
    timing.job_s = step.wall_s
    flights = sorted((out / "incident-run").glob("*/flight"))
    print(f"  incident made in {step.wall_s:.1f} s (scenario run exit {step.returncode}):",
          flush=True)
    for line in _verdict_lines(step.output):
        print(f"    {line}", flush=True)
    if not flights:
        timing.problem = f"no flight record was written: see {out / 'incident.log'}"
        print(f"  {timing.problem}", flush=True)
        return timing
    flight = flights[0]
    top = sorted(p.name for p in flight.iterdir() if p.is_file())
    peers = sorted(p.name for p in (flight / "peers").iterdir()) \
        if (flight / "peers").is_dir() else []
    print(f"  dumps: {len(top)} in {flight} ({', '.join(top[:3])}), {len(peers)} in its "
          f"peers/ subfolder: {len(top) + len(peers)} of {BIG_WORLD} ranks", flush=True)
    command = [sys.executable, str(EXAMPLE_SCRIPT),
               *Example(iterations=BIG_ITERATIONS).argv()]
    extra = ["--world-size", str(BIG_WORLD)]
    timing = _reproduce(timing, flight, command, out, token, extra=extra,
                        expected_dumps=len(top) + len(peers))
    if timing.dumps_read is not None and timing.dumps_read < len(top) + len(peers):
        # what the import would make of every dump: the same files in one folder
        flat = out / "flattened" / "dumps"
        flat.mkdir(parents=True, exist_ok=True)
        for dump in [*(flight / name for name in top), *(flight / "peers" / n for n in peers)]:
            shutil.copyfile(dump, flat / dump.name)
        print(f"\n== diagnostic, not in the headline: the same {len(top) + len(peers)} dumps "
              f"copied into one folder, {flat}", flush=True)
        timing.diagnostic = _reproduce(Timing(f"{BIG_WORLD} ranks, peers/ dumps copied beside "
                                              "(diagnostic)"),
                                       flat, command, out / "flattened", token, extra=extra)
    return timing


def _big_incident_scenario() -> str:
    return f"""\
# made by tools/bench_incident.py: the incident whose flight record is imported
name: dp-peer-fail-stop-{BIG_WORLD}
description: rank {BIG_PEER}, a data-parallel peer of rank {BIG_RANK}, dies at iteration \
{ITERATION}
world: {{size: {BIG_WORLD}, rank: {BIG_RANK}}}  # tp 8 x pp 4 x dp 256
run:
  example: {{iterations: {BIG_ITERATIONS}}}
  graph: profile
  timeout_s: 2
faults:
  - action: fail
    select: {{ranks: "{BIG_PEER}"}}
    at: {{iteration: {ITERATION}}}
expect:
  - exit_code: 134
  - exception: {{type: DistBackendError, match: "Watchdog caught collective operation \
timeout"}}
  - flight_record: {{missing_ranks: [{BIG_PEER}]}}
"""


def _reproduce(timing: Timing, dump_dir: Path, command: list[str], out: Path, token: str, *,
               extra: list[str], expected_dumps: int | None = None) -> Timing:
    """import + profile (``prism-debug incident``), then run (``scenario run``)."""
    cache, scenario = out / "cache", out / "scenario.yaml"
    shutil.rmtree(cache, ignore_errors=True)  # a private, empty cache: the profile is timed
    imported = _prism(["incident", str(dump_dir), *extra, "--out", str(scenario),
                       "--run-dir", str(out / "profile"), "--", *command],
                      cache, out / "incident-import.log", token)
    # profile: from the line that starts it to the one that says it is done
    # (the command's own figure, "profiled in X s", is printed beside);
    # import: the rest of the call (reading, fr_trace, placing, writing)
    found = PROFILED.search(imported.output)
    began, ended = _seconds_at(imported, "graph: profiling"), \
        _seconds_at(imported, "graph: profiled")
    timing.profile_s = ended - began if began is not None and ended is not None else 0.0
    timing.import_s = imported.wall_s - timing.profile_s
    for line in imported.output.splitlines():
        if line.startswith(("incident:", "stopped:", "fr_trace:", "graph: profiled")):
            print(f"  {line}", flush=True)
    placed = [line for line in imported.output.splitlines() if line.startswith("placed:")]
    if placed:
        print(f"  {placed[0]}" + (f"  (and {len(placed) - 1} more faults placed)"
                                   if len(placed) > 1 else ""), flush=True)
    read = re.search(r"^incident: (\d+) dumps", imported.output, re.M)
    timing.dumps_read = int(read.group(1)) if read else None
    if expected_dumps is not None and read and int(read.group(1)) != expected_dumps:
        print(f"  NOTE: incident read {read.group(1)} of the {expected_dumps} dumps: the "
              f"peers/ subfolder's were not read (torch's fr_trace reads subfolders)",
              flush=True)
    print(f"  import {timing.import_s:.1f} s, profile {timing.profile_s:.1f} s"
          + (f" (the command says {found.group(1)} s)" if found else "")
          + f" (exit {imported.returncode})" + ("" if found else ": NO profile reported (was "
                                                           "the graph cached?)"), flush=True)
    if imported.returncode != 0 or not scenario.is_file():
        timing.problem = f"prism-debug incident exited {imported.returncode} without a " \
                         f"scenario: {_tail(imported.output)}"
        print(f"  {timing.problem}", flush=True)
        return timing
    faults = scenario.read_text(encoding="utf-8").count("- action:")
    print(f"  scenario: {scenario} ({faults} fault{'' if faults == 1 else 's'})", flush=True)
    ran = _prism(["scenario", "run", str(scenario), "--run-dir", str(out / "run")],
                 cache, out / "scenario-run.log", token)
    timing.run_s = ran.wall_s
    timing.verdicts = _verdict_lines(ran.output)
    timing.passed = ran.returncode == 0 and bool(timing.verdicts) and \
        all(v.startswith(("PASS", "PASSED")) for v in timing.verdicts)
    print(f"  run {timing.run_s:.1f} s (exit {ran.returncode}); verdicts:", flush=True)
    for line in timing.verdicts or [f"none: {_tail(ran.output)}"]:
        print(f"    {line}", flush=True)
    print(f"  => {timing.total_s:.1f} s from the dumps to the reproduced hang, "
          f"{'PASS' if timing.passed else 'FAIL'}", flush=True)
    return timing


def _prism(args: list[str], cache: Path, log: Path, token: str) -> Step:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PRISM_DEBUG_GRAPH_CACHE=str(cache))
    return _run([sys.executable, "-m", "prism_debug.cli", *args], env, log, token)


def _run(command: list[str], env: dict, log: Path, token: str,
         limit_s: float = STEP_LIMIT_S) -> Step:
    """``command`` to its end or ``limit_s``; its output, each line stamped
    with the seconds since the start, in ``log``; nothing it started left
    alive."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, cwd=ROOT, text=True,
                            errors="replace", start_new_session=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic() - start, line.rstrip("\n")) for line in proc.stdout), daemon=True)
    reader.start()
    try:
        returncode = proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        returncode = 124
    finally:
        _end_processes(token)
    reader.join(timeout=10)  # the pipe closes once every writer is gone
    wall_s = time.monotonic() - start
    if returncode == 124:
        lines.append((wall_s, f"[bench_incident: killed after {limit_s:g} s]"))
    log.write_text(" ".join(command) + "\n" + "".join(
        f"{t:8.2f}  {line}\n" for t, line in lines), encoding="utf-8")
    return Step(returncode, "\n".join(line for _, line in lines), wall_s, tuple(lines))


def _seconds_at(step: Step, prefix: str) -> float | None:
    """When ``step`` printed its first line starting with ``prefix``."""
    return next((t for t, line in step.lines if line.startswith(prefix)), None)


def _end_processes(token: str, patience_s: float = 30) -> None:
    """SIGKILL every process carrying this bench's token but this one, until
    none is left (a rank may live in a session of its own)."""
    needle = f"{TOKEN_VARIABLE}={token}".encode() + b"\0"
    deadline = time.monotonic() + patience_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
        if not found:
            return
        if time.monotonic() > deadline:
            print(f"bench_incident: processes {found} outlived SIGKILL", flush=True)
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _verdict_lines(output: str) -> list[str]:
    return [line for line in output.splitlines()
            if line.startswith(("PASS ", "FAIL ", "PASSED:", "FAILED:"))]


def _tail(output: str, lines: int = 3) -> str:
    return " | ".join(output.strip().splitlines()[-lines:])


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _report(timings: list[Timing], big: Timing | None) -> int:
    print(f"\n{'incident':<78} {'job s':>6} {'import':>7} {'profile':>8} {'run':>6} "
          f"{'total':>6}  verdicts")
    rows = [*timings, *([big] if big else []),
            *([big.diagnostic] if big and big.diagnostic else [])]
    for t in rows:
        job = f"{t.job_s:6.1f}" if t.job_s is not None else f"{'-':>6}"
        state = "PASS" if t.passed else ("FAIL" + (f" ({t.problem[:60]})" if t.problem else ""))
        print(f"{t.name:<78} {job} {t.import_s:7.1f} {t.profile_s:8.1f} {t.run_s:6.1f} "
              f"{t.total_s:6.1f}  {state}")
    worst_real = max((t.total_s for t in timings), default=0.0)
    worst = max(worst_real, big.total_s if big else 0.0)
    all_passed = all(t.passed for t in timings) and (big is None or big.passed)
    print(f"worst real incident {worst_real:.1f} s" +
          (f"; {BIG_WORLD}-rank incident {big.total_s:.1f} s" if big else "") +
          f"; goal <= {GOAL_S} s: {'met' if worst <= GOAL_S else 'MISSED'}; verdicts "
          f"{'all PASS' if all_passed else 'NOT all PASS'}")
    print(f"load average at start {LOAD_AT_START}, at end {_load()} (1, 5, 15 min)")
    print(f"incident: seconds_to_reproduce={worst:.1f}")
    return 0 if all_passed and worst <= GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
