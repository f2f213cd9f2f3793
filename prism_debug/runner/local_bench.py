"""Real gloo collectives between processes on this host (``calibrate --local``).

``measure`` starts the processes (plain torch: no prism-debug agent in them),
each one thread, times an all-reduce and a send/recv ping-pong at each size,
and returns the medians as calibration measurements.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
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


def measure(processes: int = 2) -> tuple[Measurements, Measurements]:
    if processes < 2:
        raise LaunchError("local calibration needs at least 2 processes")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    children = []
    for rank in range(processes):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(processes), LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        env.pop("PRISM_DEBUG_CONFIG", None)
        children.append(subprocess.Popen(
            [sys.executable, "-m", "prism_debug.runner.local_bench"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL))
    outputs = [child.communicate(timeout=600) for child in children]
    if any(child.returncode for child in children):
        errors = "\n".join(err.strip().splitlines()[-1] for _, err in outputs if err.strip())
        raise LaunchError(f"local gloo measurement failed: {errors}")
    results = json.loads(outputs[0][0])
    source = f"gloo, {processes} processes on {socket.gethostname()}"
    return tuple(  # type: ignore[return-value]
        Measurements(op, processes if op == "all_reduce" else 2, 1,
                     tuple((int(b), float(t)) for b, t in results[op]), source)
        for op in ("all_reduce", "send"))


if __name__ == "__main__":
    _worker()
