"""FSDP2 over "dp" and DTensor tensor parallelism over "tp" on a 2-D DeviceMesh."""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

TP = 8
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("cpu:gloo,cuda:nccl")
mesh = init_device_mesh("cpu", (world // TP, TP), mesh_dim_names=("dp", "tp"))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 1024)
        self.down = torch.nn.Linear(1024, 256)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


model = torch.nn.Sequential(MLP(), MLP())
for block in model:
    parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(4, 256)
for step in range(3):
    loss = model(data).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
print("backend", dist.get_backend(), flush=True)
dist.destroy_process_group()
