"""Initialises, says who it is, then sleeps until killed."""

import os
import time

import torch.distributed as dist

dist.init_process_group("nccl")
print(f"ready pid={os.getpid()}", flush=True)
while True:
    time.sleep(1)
