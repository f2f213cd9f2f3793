"""Iterations of a known length for the timing tests: each is 3 ms of
"device time" (a sleep, as a host waits for kernels) and a 4 MiB world
all-reduce, whose emulated cost dominates it."""

import argparse
import time

import torch
import torch.distributed as dist

import prism_debug

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=30)
args = parser.parse_args()

dist.init_process_group(backend="nccl")
payload = torch.ones(1 << 20)
for step in range(args.iterations):
    time.sleep(0.003)
    dist.all_reduce(payload)
    payload.fill_(1.0)
    prism_debug.iteration()
