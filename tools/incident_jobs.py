"""Real production-like incidents: torch's own flight-recorder dumps from real jobs.

A ``torchrun`` gloo job of the device-time workload (``examples/device_time.py``:
pipeline, tensor- and data-parallel groups) in which one rank misbehaves at a
chosen iteration (``--incident``: ``hang``, ``size`` or ``die``), every rank
that sees a communication op fail, or that torchrun tears down, writing
torch's flight-recorder dump (``--dump-dir``) as a production job does.  What
prism-debug's incident import is validated against: these dumps come from
torch, not from prism-debug.

    from tools.incident_jobs import run_real_incident   # tests: the repository root is on sys.path
    incident = run_real_incident("hang", tmp_path, culprit=2)
    incident.dump_dir, incident.prefix, incident.dumped_ranks, incident.command

or, to look at one (``--nproc 16`` for pp 2 x tp 2 x dp 4)::

    python tools/incident_jobs.py hang out/ --nproc 16 --culprit 2

A job takes seconds: its device time is a few milliseconds a step, so what it
costs is start-up (every process imports torch) and, for a hang, the timeout.
A hard wall-clock limit ends it otherwise, and no process of it outlives the
call (torchrun starts each worker in a session of its own, so they are found
by a token in their environment, not by process group).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "examples" / "device_time.py"
KINDS = ("hang", "size", "die")
DUMP_PREFIX = "nccl_trace_rank_"  # what the workload's --dump-dir writes: torch's default stem
# a few milliseconds of device time a step and small tensors; two dp buckets,
# so that "the iteration's first bucket" is one of several
WORKLOAD_ARGS = ("--micro-batches", "2", "--layers", "1", "--forward-ms", "2",
                 "--backward-ms", "4", "--optimizer-ms", "1", "--activation-kib", "16",
                 "--tp-kib", "16", "--grad-kib", "64", "--buckets", "2")
_TOKEN_VARIABLE = "PRISM_DEBUG_INCIDENT_JOB"  # marks the job's processes, to end them all


class IncidentJobError(RuntimeError):
    """The job did not end as an incident does (ran past its wall-clock limit)."""


@dataclass(frozen=True)
class RealIncident:
    """One finished job: where its dumps are and what a user would reproduce it with."""

    kind: str
    culprit: int
    iteration: int  # the iteration (from 1) at which the culprit misbehaved
    nproc: int
    pp: int
    tp: int
    timeout_s: float
    dump_dir: Path
    prefix: str  # a rank's dump is dump_dir / f"{prefix}{rank}"
    # the job's code for prism-debug to run one rank of: the same workload,
    # without --incident and --dump-dir (prism-debug's faults and flight
    # recorder take their parts)
    command: tuple[str, ...]
    dumped_ranks: tuple[int, ...]
    returncode: int  # torchrun's
    log: Path  # torchrun's output and every rank's
    wall_s: float

    @property
    def dp(self) -> int:
        return self.nproc // (self.pp * self.tp)

    @property
    def missing_ranks(self) -> tuple[int, ...]:
        """The ranks that wrote no dump."""
        return tuple(sorted(set(range(self.nproc)) - set(self.dumped_ranks)))

    def dump(self, rank: int) -> Path:
        return self.dump_dir / f"{self.prefix}{rank}"


def workload_args(*, pp: int, tp: int, iterations: int, extra_args=()) -> tuple[str, ...]:
    return ("--pp", str(pp), "--tp", str(tp), "--iterations", str(iterations),
            *WORKLOAD_ARGS, *map(str, extra_args))


def run_real_incident(kind: str, out_dir: Path, *, nproc: int = 8, pp: int = 2, tp: int = 2,
                      culprit: int, iteration: int = 3, timeout_s: float = 5,
                      iterations: int = 5, extra_args=(),
                      wall_limit_s: float = 180) -> RealIncident:
    """Run the job under torchrun in ``out_dir`` (dumps in ``out_dir/dumps``,
    torchrun's output in ``out_dir/torchrun.log``) and describe what it left."""
    if kind not in KINDS:
        raise ValueError(f"incident kind {kind!r} is not one of {', '.join(KINDS)}")
    if nproc % (pp * tp) or not 0 <= culprit < nproc or not 1 <= iteration <= iterations:
        raise ValueError(f"no such incident: nproc {nproc}, pp {pp}, tp {tp}, culprit "
                         f"{culprit}, iteration {iteration} of {iterations}")
    out_dir = Path(out_dir).resolve()
    dump_dir, log = out_dir / "dumps", out_dir / "torchrun.log"
    dump_dir.mkdir(parents=True, exist_ok=True)
    workload = workload_args(pp=pp, tp=tp, iterations=iterations, extra_args=extra_args)
    timeout = ("--timeout-s", f"{timeout_s:g}")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", str(nproc), str(WORKLOAD), *workload, *timeout,
              "--incident", f"{kind}:{culprit}:{iteration}", "--dump-dir", str(dump_dir)]
    token = uuid.uuid4().hex
    env = dict(os.environ, OMP_NUM_THREADS="1", **{_TOKEN_VARIABLE: token})
    start = time.monotonic()
    with open(log, "w") as log_file:
        log_file.write(shlex.join(launch) + "\n")
        log_file.flush()
        torchrun = subprocess.Popen(launch, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, cwd=out_dir,
                                    start_new_session=True)
        try:
            returncode = torchrun.wait(timeout=wall_limit_s)
        except subprocess.TimeoutExpired:
            raise IncidentJobError(
                f"the {kind} job ran past {wall_limit_s:g} s; its output: {log}") from None
        finally:
            _end_job(torchrun, token)
    wall_s = time.monotonic() - start
    return RealIncident(
        kind=kind, culprit=culprit, iteration=iteration, nproc=nproc, pp=pp, tp=tp,
        timeout_s=timeout_s, dump_dir=dump_dir, prefix=DUMP_PREFIX,
        command=(sys.executable, str(WORKLOAD), *workload, *timeout),
        dumped_ranks=dumped_ranks(dump_dir), returncode=returncode, log=log, wall_s=wall_s)


def dumped_ranks(dump_dir: Path, prefix: str = DUMP_PREFIX) -> tuple[int, ...]:
    """The ranks with a whole dump (a ``.partial`` file is a write cut short)."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)")
    return tuple(sorted(int(m.group(1)) for path in dump_dir.iterdir()
                        if (m := pattern.fullmatch(path.name))))


def _end_job(torchrun: subprocess.Popen, token: str, patience_s: float = 30) -> None:
    """SIGKILL whatever of the job is still alive, and wait until it is gone:
    torchrun, and every process whose environment carries the job's token
    (workers are in sessions of their own, and may have outlived a torchrun
    that was killed).  A killed process lives on while the kernel tears it
    down, so the scan repeats until it finds nothing."""
    if torchrun.poll() is None:
        os.killpg(torchrun.pid, signal.SIGKILL)
        torchrun.wait()
    deadline = time.monotonic() + patience_s
    while survivors := _processes_with(token):
        if time.monotonic() > deadline:
            raise IncidentJobError(f"processes {survivors} of the job outlived SIGKILL")
        for pid in survivors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _processes_with(token: str) -> list[int]:
    needle = f"{_TOKEN_VARIABLE}={token}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=KINDS)
    parser.add_argument("out", type=Path, help="the job's directory (dumps/, torchrun.log)")
    parser.add_argument("--nproc", type=int, default=8)
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--culprit", type=int, default=2)
    parser.add_argument("--iteration", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--timeout-s", type=float, default=5)
    args = parser.parse_args(argv)
    incident = run_real_incident(args.kind, args.out, nproc=args.nproc, pp=args.pp, tp=args.tp,
                                 culprit=args.culprit, iteration=args.iteration,
                                 timeout_s=args.timeout_s, iterations=args.iterations)
    print(f"{incident.kind} of rank {incident.culprit} at iteration {incident.iteration}: "
          f"{incident.nproc} processes (pp {incident.pp} x tp {incident.tp} x dp "
          f"{incident.dp}), timeout {incident.timeout_s:g} s, {incident.wall_s:.1f} s wall")
    print(f"dumps:    {incident.dump_dir}/{incident.prefix}<rank>")
    print(f"dumped:   {list(incident.dumped_ranks)}")
    print(f"no dump:  {list(incident.missing_ranks)}")
    print(f"torchrun: exit {incident.returncode}, output in {incident.log}")
    print(f"one rank: {shlex.join(incident.command)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
