"""HSDP: fully_shard on a 2-D (replicate, shard) DeviceMesh — FSDP inside a
group of 8, gradients all-reduced across the replicas."""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

SHARD = 8
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("nccl")
mesh = init_device_mesh("cpu", (world // SHARD, SHARD), mesh_dim_names=("replicate", "shard"))
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    loss = model(torch.randn(4, 64)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
