"""A short data-parallel loop that prints, each step, the Python running it,
its working directory and $PRISM_TEST_MARK: what the interpreter rule and a
restore from another directory must keep."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group(backend="nccl")
model = torch.nn.Linear(8, 8)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    loss = model(torch.randn(4, 8)).square().mean()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step + 1} python {sys.executable} cwd {os.getcwd()} "
          f"mark {os.environ.get('PRISM_TEST_MARK')}", flush=True)
