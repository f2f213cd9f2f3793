"""torch.distributed.pipelining with shape inference: PipelineStage is given
no input_args/output_args, so the stages vote, then send each other their
shapes (send_object_list) forward and their gradients' shapes backward.

Stage s is Linear(WIDTHS[s] -> WIDTHS[s + 1]): every stage has other shapes,
so a stage that received its own shapes back (mirroring) would fail.  Data
parallel over dp = world / 4, gradients averaged across it.  Rank layout:
rank = dp_rank + dp * stage.  Prints what each stage inferred, and the last
stage's losses.
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

PP, MICRO, BATCH = 4, 4, 8
WIDTHS = (16, 32, 48, 24, 8)
world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dp = world // PP
dist.init_process_group(os.environ.get("PRISM_TEST_BACKEND", "nccl"))
pp_group = dp_group = None
for d in range(dp):
    ranks = [d + dp * s for s in range(PP)]
    group = dist.new_group(ranks, group_desc="pp")
    if rank in ranks:
        pp_group = group
for s in range(PP):
    ranks = list(range(dp * s, dp * (s + 1)))
    group = dist.new_group(ranks, group_desc="dp")
    if rank in ranks:
        dp_group = group
stage_index = rank // dp
torch.manual_seed(stage_index)
layers = [torch.nn.Linear(WIDTHS[stage_index], WIDTHS[stage_index + 1])]
if stage_index < PP - 1:
    layers.append(torch.nn.Tanh())
stage_module = torch.nn.Sequential(*layers)
stage = PipelineStage(stage_module, stage_index, PP, torch.device("cpu"), group=pp_group)
schedule = ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=torch.nn.functional.mse_loss)
optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.01)
data = torch.Generator().manual_seed(1234)
for step in range(3):
    inputs = torch.randn(BATCH, WIDTHS[0], generator=data)
    target = torch.randn(BATCH, WIDTHS[-1], generator=data)
    losses = []
    if stage.is_first:
        schedule.step(inputs)
    elif stage.is_last:
        schedule.step(target=target, losses=losses)
    else:
        schedule.step()
    if step == 0:
        meta = stage._stage_meta
        shapes = {
            "inputs": [list(m.shape) for m in meta.inputs],
            "outputs": [list(m.shape) for m in meta.outputs],
            "output_grads": [list(m.shape) for m in meta.output_grads or ()],
        }
        print(f"stage {stage_index} shapes {shapes}", flush=True)
    for p in stage_module.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)
    optimizer.step()
    optimizer.zero_grad()
    if stage.is_last:
        print(f"step {step} loss {sum(loss.item() for loss in losses) / MICRO:.9f}", flush=True)
dist.destroy_process_group()
