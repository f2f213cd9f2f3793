"""A rank that uses CUDA as a GPU job does: --call set_device pins the
device torchrun's LOCAL_RANK names (before init_process_group, as most
scripts do); --call tensor makes a tensor on "cuda"."""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--call", choices=["set_device", "tensor"], required=True)
args = parser.parse_args()

if args.call == "set_device":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group(backend="nccl")
x = torch.ones(4, device="cuda")
dist.all_reduce(x)
