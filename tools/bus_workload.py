"""Blocks of small all-reduces for tools/bench_bus.py, each block one
iteration (``prism_debug.iteration()``), its wall time printed by the script
itself (the emulated clock leaves the harness's own costs out; this is what
the rank pays)."""

import argparse
import time

import torch
import torch.distributed as dist

import prism_debug

parser = argparse.ArgumentParser()
parser.add_argument("--blocks", type=int, default=8)
parser.add_argument("--ops", type=int, default=2000)
args = parser.parse_args()

torch.set_num_threads(1)
dist.init_process_group("nccl")
tensor = torch.ones(256)
for block in range(args.blocks):
    started = time.perf_counter()
    for _ in range(args.ops):
        dist.all_reduce(tensor)
    wall = time.perf_counter() - started
    print(f"block {block + 1} us_per_op {wall / args.ops * 1e6:.3f}", flush=True)
    prism_debug.iteration()
