"""A training rank that holds about --gib GiB (parameters, gradients and Adam
state: 16 bytes per parameter), for tools/bench_restore.py.

Like ``tools/snapshot_workload.py``, but each step starts with its
collective (a data-parallel job's loss all-reduce) and the rank prints when
it completed and when the step's optimizer update (which touches the whole
state) was done, on the wall clock: CRIU restores a process into a time
namespace whose CLOCK_MONOTONIC goes on from the dump, so only the realtime
clock is shared with the benchmark's process.
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--gib", type=float, required=True)
parser.add_argument("--iterations", type=int, default=4)
args = parser.parse_args()

torch.set_num_threads(1)
numel = int(args.gib * 2**30 / 16)  # parameter, gradient, two Adam moments: float32 each
weight = torch.nn.Parameter(torch.zeros(numel))
optimizer = torch.optim.Adam([weight], lr=1e-3)
weight.grad = torch.zeros_like(weight)
loss = torch.zeros(1024)
dist.init_process_group("nccl")
for step in range(args.iterations):
    dist.all_reduce(loss)
    print(f"collective {step} {time.time():.6f}", flush=True)
    weight.grad.fill_(1e-3 * (step + 1))
    optimizer.step()  # reads and writes every page of the state
    print(f"step {step} {time.time():.6f}", flush=True)
sys.exit(0)
