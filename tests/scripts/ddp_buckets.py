"""DistributedDataParallel with several gradient buckets: four 128x128 layers
and ``bucket_cap_mb`` small enough that each layer's gradients fill a bucket,
so backward issues one async all-reduce per bucket, back to back.

No torch.manual_seed here: prism-debug seeds the rank (--seed)."""

import torch
import torch.distributed as dist

HIDDEN, LAYERS = 128, 4
dist.init_process_group(backend="nccl", init_method="env://")
layers = []
for _ in range(LAYERS):
    layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU()]
# a layer's weight and bias are 66,048 bytes: a 64 KiB cap puts each in a bucket of its own
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers),
                                                  bucket_cap_mb=64 / 1024)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(5):
    inputs, targets = torch.randn(8, HIDDEN), torch.randn(8, HIDDEN)
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.6f}", flush=True)
dist.destroy_process_group()
