"""A small DistributedDataParallel model with an iteration of a few
milliseconds, for tools/bench_selfconsistency.py: short iterations make any
per-op harness time that stays on the emulated clock show up as a timing
error.  Gradient buckets of 0.1 MB (``bucket_cap_mb``), so DDP issues several
all-reduces per backward; ``--iterations`` optimizer steps."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--iterations", type=int, default=30)
args = parser.parse_args()
torch.set_num_threads(1)

dist.init_process_group(backend="nccl")
layers = []
for _ in range(3):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(*layers, torch.nn.Linear(256, 1)), bucket_cap_mb=0.1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
inputs, targets = torch.randn(64, 256), torch.randn(64, 1)
for _ in range(args.iterations):
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
