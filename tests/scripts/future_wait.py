"""Two iterations with an async world all-reduce awaited through its future:
first the script sleeps past the op's completion, then it blocks on it."""

import time

import torch
import torch.distributed as dist

import prism_debug
from prism_debug.cost import CostModel, Placement, load_profile

dist.init_process_group("nccl")
payload = torch.ones(1 << 24)  # 64 MiB: 0.6 ms on 8,192 ranks, time to reach future.wait()
placement = Placement.of(range(dist.get_world_size()), 8)
cost = CostModel(load_profile("h100-ib400")).time_s("all_reduce", payload.nbytes, placement)
print(f"cost_s={cost}", flush=True)
for sleep_first in (True, False):
    future = dist.all_reduce(payload, async_op=True).get_future()
    if sleep_first:
        time.sleep(3 * cost)
    future.wait()
    prism_debug.iteration()
