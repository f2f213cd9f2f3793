"""A collective-heavy loop for tools/bench_overhead.py: small all-reduce,
all-gather, reduce-scatter and broadcast on a tensor-parallel group of 8 and
on the whole world (65,536 ranks: 8,192 groups of 8 made), in iterations of
200 collectives (marked with ``prism_debug.iteration()``, so the loop
profiles into a graph).  Prints the mean wall time per collective, the
median over iterations (robust to the scheduler taking the core away on a
busy machine) and the main thread's CPU time per collective (median over
iterations).

Under ``--backend fake`` it initialises torch's FakeProcessGroup itself;
otherwise it is an ordinary script meant to run under ``prism-debug run``.
"""

import argparse
import os
import statistics
import time
import warnings

import torch
import torch.distributed as dist

import prism_debug

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="nccl")
parser.add_argument("--ops", type=int, default=4000)
parser.add_argument("--group-size", type=int, default=8, help="ranks in each tensor-parallel group")
parser.add_argument("--no-world", action="store_true",
                    help="every collective on the tensor-parallel group, none on the world")
args = parser.parse_args()
warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's deprecation

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
if args.backend == "fake":
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
else:
    dist.init_process_group(args.backend)
size = args.group_size
start = rank - rank % size
# every tensor-parallel group, as an SPMD script creates them: a graph needs
# the whole family (a group made with use_local_synchronization is known only
# to its members, and does not profile)
tp, _ = dist.new_subgroups(size)

small = torch.ones(256)
gathered = torch.empty(256 * size)
shard = torch.empty(256 // size)
ROUNDS = 50  # per iteration: 200 collectives


def one_iteration() -> None:
    for i in range(ROUNDS):
        group = tp if i % 2 or args.no_world else None
        dist.all_reduce(small, group=group)
        dist.all_gather_into_tensor(gathered, small, group=tp)
        dist.reduce_scatter_tensor(shard, small, group=tp)
        dist.broadcast(small, src=start, group=tp)
        small.fill_(1.0)  # keep mirror sums from overflowing
    prism_debug.iteration()


for _ in range(2):  # warm-up
    one_iteration()
iterations = max(1, args.ops // (ROUNDS * 4))
times, cpu_times = [], []
for _ in range(iterations):
    started, cpu_started = time.perf_counter(), time.thread_time()
    one_iteration()
    times.append(time.perf_counter() - started)
    cpu_times.append(time.thread_time() - cpu_started)
per = 1e6 / (ROUNDS * 4)
# cpu_us: the main thread's CPU time, median over iterations — what a busy
# machine distorts least (the time the scheduler gives others is not in it)
print(f"per_collective_us={sum(times) * per / iterations:.3f} "
      f"median_us={statistics.median(times) * per:.3f} "
      f"cpu_us={statistics.median(cpu_times) * per:.3f}", flush=True)
dist.destroy_process_group()
