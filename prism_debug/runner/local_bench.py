"""Real gloo collectives between processes on this host (``calibrate --local``).

``measure`` starts the processes (plain torch: no prism-debug agent in them),
each one thread, times an all-reduce and a send/recv ping-pong at each size,
and returns the medians as calibration measurements.  One process failing
ends them all: its peers would wait for it in gloo's rendezvous for good.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from prism_debug.cost.calibrate import Measurements
from prism_debug.errors import LaunchError

SIZES = tuple(2**k for k in range(3, 25, 3))  # 8 B … 16 MiB


def _repeats(nbytes: int) -> int:
    return max(5, min(60, int(2e7 / max(nbytes, 1))))


def _worker() -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    results: dict[str, list] = {"all_reduce": [], "send": []}
    for nbytes in SIZES:
        tensor = torch.ones(max(1, nbytes // 4))
        for op in ("all_reduce", "send"):
            times = []
            for i in range(3 + _repeats(nbytes)):
                dist.barrier()
                start = time.perf_counter()
                if op == "all_reduce":
                    dist.all_reduce(tensor)
                    elapsed = time.perf_counter() - start
                elif rank == 0:  # ping-pong: half the round trip is one transfer
                    dist.send(tensor, 1)
                    dist.recv(tensor, 1)
                    elapsed = (time.perf_counter() - start) / 2
                elif rank == 1:
                    dist.recv(tensor, 0)
                    dist.send(tensor, 0)
                    elapsed = 0.0
                else:
                    elapsed = 0.0
                if i >= 3:
                    times.append(elapsed)
            results[op].append([tensor.nbytes, statistics.median(times)])
    if rank == 0:
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


WORKER = (sys.executable, "-m", "prism_debug.runner.local_bench")


def measure(processes: int = 2, *, worker_command=WORKER,
            timeout_s: float = 600.0) -> tuple[Measurements, Measurements]:
    if processes < 2:
        raise LaunchError("local calibration needs at least 2 processes")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Output goes to files, not pipes: a child never blocks on a full pipe
    # while its siblings are polled.
    with tempfile.TemporaryDirectory(prefix="prism-debug-bench-") as tmp:
        children = []
        try:
            for rank in range(processes):
                env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(processes),
                           LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                           OMP_NUM_THREADS="1")
                env.pop("PRISM_DEBUG_CONFIG", None)
                with open(f"{tmp}/{rank}.out", "w") as out, open(f"{tmp}/{rank}.err", "w") as err:
                    children.append(subprocess.Popen(list(worker_command), env=env, stdout=out,
                                                     stderr=err, stdin=subprocess.DEVNULL))
            _wait_all(children, timeout_s, tmp)
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.wait()
        with open(f"{tmp}/0.out") as out:
            output = out.read()
    results = json.loads(output)
    source = f"gloo, {processes} processes on {socket.gethostname()}"
    return tuple(  # type: ignore[return-value]
        Measurements(op, processes if op == "all_reduce" else 2, 1,
                     tuple((int(b), float(t)) for b, t in results[op]), source)
        for op in ("all_reduce", "send"))


def _wait_all(children, timeout_s: float, tmp: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [child.poll() for child in children]
        failed = next((rank for rank, code in enumerate(codes) if code), None)
        if failed is not None:
            with open(f"{tmp}/{failed}.err") as err:
                lines = err.read().strip().splitlines()
            raise LaunchError(f"local gloo measurement failed: process {failed} exited with "
                              f"code {codes[failed]}" + (f": {lines[-1]}" if lines else ""))
        if all(code == 0 for code in codes):
            return
        if time.monotonic() > deadline:
            raise LaunchError(f"local gloo measurement did not finish in {timeout_s:.0f} s; "
                              "check that processes here can connect to each other on 127.0.0.1")
        time.sleep(0.05)


if __name__ == "__main__":
    _worker()
