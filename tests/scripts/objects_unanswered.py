"""Two pipeline stages that each wait for the other's objects before sending
their own: a receive no stage answers (it would hang on a real cluster too).
Rank layout: rank = dp_rank + dp * stage."""

import os

import torch.distributed as dist

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dp = world // 2
dist.init_process_group(os.environ.get("PRISM_TEST_BACKEND", "nccl"))
pp_group = None
for d in range(dp):
    group = dist.new_group([d, d + dp], group_desc="pp")
    if rank in (d, d + dp):
        pp_group = group
other = (rank + dp) % world
received = [None]
dist.recv_object_list(received, src=other, group=pp_group)
dist.send_object_list([f"from {rank}"], dst=other, group=pp_group)
dist.destroy_process_group()
