"""Initialises, finishes one iteration, then fails with exit code 7."""

import sys

import torch
import torch.distributed as dist

import prism_debug

dist.init_process_group("gloo")
x = torch.ones(1)
dist.all_reduce(x)
prism_debug.iteration()
print("about to fail", flush=True)
sys.exit(7)
