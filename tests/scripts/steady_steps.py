"""A data-parallel loop whose compute is a fixed sleep, so its iteration
times are steady enough to compare a run with a replay: each step computes
--compute-ms, then all-reduces one 1 KiB gradient over the world."""

import argparse
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=6)
parser.add_argument("--compute-ms", type=float, default=40.0)
args = parser.parse_args()

dist.init_process_group(backend="nccl")
weight = torch.nn.Parameter(torch.zeros(256))
optimizer = torch.optim.SGD([weight], lr=0.1)
for _step in range(args.iterations):
    time.sleep(args.compute_ms / 1e3)
    weight.grad = torch.ones(256)
    dist.all_reduce(weight.grad)
    optimizer.step()
    optimizer.zero_grad()
