"""A newcomer's own script: plain DDP on a small MLP, the documentation's walk-through.

Runs as written under torchrun (``torchrun --nproc-per-node 2 examples/my_ddp.py``,
gloo on CPU) and under ``prism-debug run -- python my_ddp.py``; nothing in it
knows about prism-debug.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group(backend="gloo")  # RANK, WORLD_SIZE, MASTER_ADDR… from torchrun
rank, world_size = dist.get_rank(), dist.get_world_size()

torch.manual_seed(1234)  # the same model on every rank; DDP broadcasts rank 0's anyway
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

data = torch.Generator().manual_seed(rank)  # each rank its own shard of synthetic data
for step in range(1, args.steps + 1):
    inputs = torch.randn(64, 32, generator=data)
    targets = inputs.sum(dim=1, keepdim=True)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    losses = [None] * world_size
    dist.all_gather_object(losses, round(loss.item(), 4))  # every rank's loss, for the log
    print(f"step {step}: loss {loss.item():.4f}, "
          f"mean over {world_size} ranks {sum(losses) / world_size:.4f}", flush=True)
    optimizer.step()
dist.destroy_process_group()
