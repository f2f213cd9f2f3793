"""Two pipeline stages (strided by dp) whose first stage issues an async
all-reduce over the world — and asks for its future — before it sends the
activation the second stage needs to get there: when the all-reduce is
issued the replay engine cannot yet say when it completes.  Its future must
complete once the send is issued; a short --collective-timeout must not fire
on it.  (The all-reduce and the send travel on different communicators, as
NCCL needs: a receive posted on the pair's own stream before the send would
hold that send back for good.)"""

import os
import time

import torch
import torch.distributed as dist

import prism_debug

PP, HIDDEN, COMPUTE_S = 2, 256, 0.02
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dp = world // PP
dist.init_process_group("nccl")
pp_group = None
for d in range(dp):
    ranks = [d + dp * s for s in range(PP)]
    group = dist.new_group(ranks, group_desc="pp")
    if rank in ranks:
        pp_group = group
first = rank < dp
peer = rank + dp if first else rank - dp
activation, gradient = torch.ones(HIDDEN), torch.zeros(HIDDEN)
for _step in range(int(os.environ.get("STEPS", "4"))):
    if first:
        work = dist.all_reduce(gradient, async_op=True)
        # (PRISM_TEST_FUTURE=0: wait() on the Work instead, which older
        # versions could answer — the timing tests compare with them)
        future = work.get_future() if os.environ.get("PRISM_TEST_FUTURE", "1") == "1" else work
        time.sleep(COMPUTE_S)  # the forward pass
        dist.send(activation, dst=peer, group=pp_group)
        future.wait()
    else:
        dist.recv(activation, src=peer, group=pp_group)
        time.sleep(COMPUTE_S)  # forward and backward of the last stage
        dist.all_reduce(gradient)
    prism_debug.iteration()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
