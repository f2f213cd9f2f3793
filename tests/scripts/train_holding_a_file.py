"""Trains until stopped, a fifth of a second per step, holding the file named
on the command line open for reading and writing: a rank CRIU cannot restore
while that file has another size than at the dump."""

import sys
import time

import torch
import torch.distributed as dist

with open(sys.argv[1], "r+") as held:  # open for as long as the rank trains
    dist.init_process_group(backend="nccl")
    model = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    while True:
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward()
        for parameter in model.parameters():
            dist.all_reduce(parameter.grad)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.2)
