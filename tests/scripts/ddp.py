"""DistributedDataParallel over the whole world; prints the loss each step.

No torch.manual_seed here: prism-debug seeds the rank (--seed)."""

import torch
import torch.distributed as dist

dist.init_process_group(backend="nccl", init_method="env://")
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)),
)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(4):
    inputs, targets = torch.randn(16, 32), torch.randn(16, 1)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
