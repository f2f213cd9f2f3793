"""A collective-heavy loop for tools/bench_overhead.py: small all-reduce,
all-gather, reduce-scatter and broadcast on a tensor-parallel group of 8 and
on the whole world.  Prints the mean wall time per collective.

Under ``--backend fake`` it initialises torch's FakeProcessGroup itself;
otherwise it is an ordinary script meant to run under ``prism-debug run``.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="nccl")
parser.add_argument("--ops", type=int, default=4000)
args = parser.parse_args()

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
if args.backend == "fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
else:
    dist.init_process_group(args.backend)
start = rank - rank % 8
tp = dist.new_group(list(range(start, start + 8)), use_local_synchronization=True)

small = torch.ones(256)
gathered = torch.empty(256 * 8)
shard = torch.empty(32)


def one_round(group):
    dist.all_reduce(small, group=group)
    dist.all_gather_into_tensor(gathered, small, group=tp)
    dist.reduce_scatter_tensor(shard, small, group=tp)
    dist.broadcast(small, src=start, group=tp)


for _ in range(50):  # warm-up
    one_round(None)
    small.fill_(1.0)
rounds = args.ops // 4
t0 = time.perf_counter()
for i in range(rounds):
    one_round(tp if i % 2 else None)
    small.fill_(1.0)  # keep mirror sums from overflowing
elapsed = time.perf_counter() - t0
print(f"per_collective_us={elapsed / (rounds * 4) * 1e6:.3f}", flush=True)
dist.destroy_process_group()
