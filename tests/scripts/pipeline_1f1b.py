"""torch.distributed.pipelining with Schedule1F1B: pp stages x data parallel.

Stage s of PP holds two Linear layers; the last stage computes an MSE loss.
Rank layout: rank = dp_rank + dp * stage (stages strided by dp).
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

PP, HIDDEN, MICRO, BATCH = 4, 64, 4, 8
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dp = world // PP
dist.init_process_group(os.environ.get("PRISM_TEST_BACKEND", "nccl"))
pp_group = None
for d in range(dp):
    ranks = [d + dp * s for s in range(PP)]
    group = dist.new_group(ranks, group_desc="pp")
    if rank in ranks:
        pp_group = group
stage_index = rank // dp
stage_module = torch.nn.Sequential(torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh(),
                                   torch.nn.Linear(HIDDEN, HIDDEN))
example = torch.zeros(BATCH // MICRO, HIDDEN)
stage = PipelineStage(stage_module, stage_index, PP, torch.device("cpu"), group=pp_group,
                      input_args=(example,), output_args=(example,),
                      input_grads=(example,), output_grads=(example,))
schedule = Schedule1F1B(stage, n_microbatches=MICRO, loss_fn=torch.nn.functional.mse_loss)
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.01)
for step in range(3):
    losses = []
    if stage.is_first:
        schedule.step(torch.randn(BATCH, HIDDEN))
    elif stage.is_last:
        schedule.step(target=torch.randn(BATCH, HIDDEN), losses=losses)
    else:
        schedule.step()
    optimizer.step()
    optimizer.zero_grad()
    weight_sum = sum(p.sum().item() for p in stage_module.parameters())
    print(f"step {step} stage {stage_index} weights {weight_sum:.6f}", flush=True)
dist.destroy_process_group()
