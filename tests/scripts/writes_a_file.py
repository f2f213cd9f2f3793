"""Writes the file named on its command line, as a training script writes a
checkpoint, around one all-reduce."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group(backend="nccl")
dist.all_reduce(torch.ones(4))
with open(sys.argv[1], "w") as f:
    f.write("checkpoint\n")
dist.destroy_process_group()
