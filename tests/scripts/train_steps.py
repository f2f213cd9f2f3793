"""A short data-parallel training loop (two all-reduces per step) for the
debugger tests: --iterations steps of a small linear model."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=8)
args = parser.parse_args()

dist.init_process_group(backend="nccl")
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.iterations):
    loss = model(torch.randn(8, 16)).square().mean()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step + 1} loss {loss.item():.6f}", flush=True)
