"""Real gloo collectives between processes on this host (``calibrate --local``).

``measure`` starts the processes (plain torch: no prism-debug agent in them),
each one thread, times every collective the local profile fits (all-reduce,
a send/recv ping-pong, all-gather, reduce-scatter, broadcast) at each size,
and returns the medians as calibration measurements.  Sizes are interleaved
op by op, so a burst of load on the host lands on every op alike rather than
on one op's whole sweep.  One process failing ends them all: its peers would
wait for it in gloo's rendezvous for good.
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
from collections.abc import Callable, Sequence

from prism_debug.cost.calibrate import Measurements
from prism_debug.errors import LaunchError

SIZES = tuple(2**k for k in range(3, 25, 3))  # 8 B … 16 MiB, nccl-tests' "size"
OPS = ("all_reduce", "send", "all_gather", "reduce_scatter", "broadcast")
PASSES = 11


def _calls(nbytes: int) -> int:
    # back-to-back calls per timed batch, as nccl-tests times 20 iterations
    # after a barrier: the ranks' skew leaving the barrier is spread over the
    # batch instead of landing on one small message
    return max(1, min(40, int(2e6 / max(nbytes, 1))))


def _op(op: str, nbytes: int, rank: int, n: int) -> tuple[Callable[[], object], int]:
    """A callable running one ``op`` of ``nbytes`` (nccl-tests' convention:
    the all-gather output, the reduce-scatter input), and the bytes it moves."""
    import torch
    import torch.distributed as dist

    per_rank = max(1, nbytes // 4 // n)
    tensor = torch.ones(max(1, nbytes // 4))
    if op == "all_reduce":
        return lambda: dist.all_reduce(tensor), tensor.nbytes
    if op == "broadcast":
        return lambda: dist.broadcast(tensor, 0), tensor.nbytes
    if op == "all_gather":
        part, out = torch.ones(per_rank), [torch.empty(per_rank) for _ in range(n)]
        return lambda: dist.all_gather(out, part), part.nbytes * n
    if op == "reduce_scatter":
        part, inputs = torch.empty(per_rank), [torch.ones(per_rank) for _ in range(n)]
        return lambda: dist.reduce_scatter(part, inputs), part.nbytes * n

    def ping_pong() -> None:  # a round trip is two transfers
        if rank == 0:
            dist.send(tensor, 1)
            dist.recv(tensor, 1)
        elif rank == 1:
            dist.recv(tensor, 0)
            dist.send(tensor, 0)
    return ping_pong, tensor.nbytes


def _worker() -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    ops = {(op, nbytes): _op(op, nbytes, rank, n) for nbytes in SIZES for op in OPS}
    for call, _ in ops.values():  # warm-up: connections, allocator, caches
        call()
    # Passes over every size and op, so a burst of load on this shared host
    # lands on one pass of everything rather than on one op's whole sweep;
    # the median over passes then drops it.
    times: dict[tuple, list[float]] = {key: [] for key in ops}
    for _ in range(PASSES):
        for (op, nbytes), (call, _) in ops.items():
            calls = _calls(nbytes)
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                call()
            times[op, nbytes].append((time.perf_counter() - start) / calls
                                     / (2 if op == "send" else 1))
    gathered: list[dict] = [{}] * n  # (all_gather_object fills every place)
    dist.all_gather_object(gathered, times)
    if rank == 0:
        results = {op: [_summary(op, ops[op, b][1], [g[op, b] for g in gathered]) for b in SIZES]
                   for op in OPS}
        print(json.dumps(results), flush=True)
    dist.destroy_process_group()


def _summary(op: str, nbytes: int, per_rank: list[list[float]]) -> list:
    """``[bytes, seconds, spread]`` of one op and size over the passes: a
    collective ends for the group when its slowest rank is done, so each
    pass counts its slowest rank (the ping-pong: rank 0's round trips)."""
    passes = per_rank[0] if op == "send" else [max(ranks)
                                               for ranks in zip(*per_rank, strict=True)]
    q1, median, q3 = statistics.quantiles(passes, n=4)
    # the spread: half the interquartile range, or how far the medians of the
    # first and the second half of the passes drifted apart, if further
    half = len(passes) // 2
    drift = abs(statistics.median(passes[:half]) - statistics.median(passes[half:])) / 2
    return [nbytes, median, max(q3 - q1, 2 * drift) / 2 / median]


WORKER = (sys.executable, "-m", "prism_debug.workflows.local_bench")


def measure(processes: int = 2, *, worker_command: Sequence[str] = WORKER,
            timeout_s: float = 600.0) -> list[Measurements]:
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
    source = f"gloo, {processes} processes on {socket.gethostname()}"
    try:  # the worker's output, checked as any input: a damaged one is one line
        results = json.loads(output)
        measured = [Measurements(op, 2 if op == "send" else processes, 1,
                                 tuple((int(b), float(t)) for b, t, _ in results[op]), source,
                                 tuple(float(spread) for _, _, spread in results[op]))
                    for op in OPS]
    except (ValueError, TypeError, KeyError) as exc:
        raise LaunchError(f"local gloo measurement printed no results table ({exc!r:.120}): "
                          "run calibrate --local again") from None
    if any(not 0 < t < float("inf") for m in measured for _, t in m.samples):
        raise LaunchError("local gloo measurement timed a collective at zero, a negative or "
                          "no time: run calibrate --local again")
    return measured


def _wait_all(children: list[subprocess.Popen], timeout_s: float, tmp: str) -> None:
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
