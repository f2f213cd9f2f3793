"""A rank that says it uses CUDA, for the mocked cuda-checkpoint test.

No machine the tests run on has a GPU driver, so torch.cuda's state queries
are stubbed here: the agent sees an initialised CUDA context and the
controller drives (a mock of) cuda-checkpoint around the dump."""

import torch

torch.cuda.is_initialized = lambda: True
torch.cuda.synchronize = lambda *args, **kwargs: None

import torch.distributed as dist  # noqa: E402

dist.init_process_group(backend="nccl")
model = torch.nn.Linear(16, 16)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _step in range(4):
    loss = model(torch.randn(8, 16)).square().mean()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    optimizer.step()
    optimizer.zero_grad()
dist.destroy_process_group()
