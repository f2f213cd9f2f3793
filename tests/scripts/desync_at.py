"""A data-parallel loop with a desync bug: at iteration 5 the last rank
skips the all-reduce of the loss it logs (a rank-dependent branch, as a
"log less on the last rank" edit would leave it).  The reload test fixes it
by editing train_step alone and patches the fix into a restored rank."""

import argparse

import torch
import torch.distributed as dist

from desync_model import WIDTH, make_model


def train_step(model, optimizer, iteration):
    loss = model(torch.randn(8, WIDTH)).square().mean()
    loss.backward()
    for parameter in model.parameters():
        dist.all_reduce(parameter.grad)
    logged = loss.detach().clone()
    if dist.get_rank() == dist.get_world_size() - 1 and iteration == 5:
        pass  # BUG: the last rank skips the loss all-reduce at iteration 5
    else:
        dist.all_reduce(logged)
    optimizer.step()
    optimizer.zero_grad()
    return logged.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=6)
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for iteration in range(1, args.iterations + 1):
        logged = train_step(model, optimizer, iteration)
        print(f"iteration {iteration} loss {logged:.6f}", flush=True)


if __name__ == "__main__":
    main()
