"""Every collective and point-to-point op the prism group serves, with their
results printed as one JSON line for the tests to check exactly."""

import json
import os

import torch
import torch.distributed as dist

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dist.init_process_group("nccl")
tp = None
for start in range(0, world, 8):
    group = dist.new_group(list(range(start, start + 8)), group_desc="tp")
    if rank in range(start, start + 8):
        tp = group
me = dist.get_rank(tp)
results = {"backend": dist.get_backend(), "tp_backend": dist.get_backend(tp), "tp_rank": me}


def ones():
    return torch.ones(2)


x = ones()
dist.all_reduce(x)
results["all_reduce_world"] = x.tolist()
x = ones()
dist.all_reduce(x, group=tp)
results["all_reduce_tp"] = x.tolist()
x = ones() * 3
dist.all_reduce(x, op=dist.ReduceOp.AVG, group=tp)
results["avg"] = x.tolist()
x = ones() * 2
dist.all_reduce(x, op=dist.ReduceOp.PRODUCT, group=tp)
results["product"] = x.tolist()
x = torch.ones(2, dtype=torch.bfloat16)
dist.all_reduce(x, group=tp)
results["bf16"] = [x.dtype == torch.bfloat16, x.float().tolist()]
x = torch.arange(3.0)
dist.broadcast(x, src=rank - me if me else rank + 1, group=tp)
results["broadcast"] = x.tolist()
outs = [torch.empty(2) for _ in range(8)]
dist.all_gather(outs, torch.tensor([1.0, 2.0]), group=tp)
results["all_gather"] = [o.tolist() for o in outs]
out = torch.empty(16)
dist.all_gather_into_tensor(out, torch.tensor([5.0, 6.0]), group=tp)
results["all_gather_into_tensor"] = out.tolist()
out = torch.empty(2)
dist.reduce_scatter_tensor(out, torch.arange(16.0), group=tp)
results["reduce_scatter_tensor"] = out.tolist()
out = torch.empty(1)
dist.reduce_scatter(out, [torch.tensor([float(i)]) for i in range(8)], group=tp)
results["reduce_scatter"] = out.tolist()
out = torch.empty(8)
dist.all_to_all_single(out, torch.arange(8.0), group=tp)
results["all_to_all_single"] = out.tolist()
outs = [torch.empty(1) for _ in range(8)]
dist.all_to_all(outs, [torch.tensor([float(i)]) for i in range(8)], group=tp)
results["all_to_all"] = [o.item() for o in outs]
gathered = [torch.empty(1) for _ in range(8)]
dist.gather(torch.tensor([4.0]), gathered, dst=rank, group=tp)
results["gather"] = [g.item() for g in gathered]
scattered = torch.empty(3)
dist.scatter(scattered, None, src=rank - me if me else rank + 1, group=tp)
results["scatter_from_peer"] = scattered.tolist()
received = torch.empty(3)
dist.recv(received, src=(rank + 1) % world)
results["recv"] = received.tolist()
dist.send(torch.ones(3), dst=(rank + 1) % world)
ops = [dist.P2POp(dist.isend, torch.ones(2), (rank + 1) % world),
       dist.P2POp(dist.irecv, torch.empty(2), (rank - 1) % world)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
from_anyone = torch.empty(2)
results["recv_any_source"] = dist.recv(from_anyone)
coalesced_out = [[torch.empty(1), torch.empty(3)] for _ in range(8)]
dist.all_gather_coalesced(coalesced_out, [torch.tensor([7.0]), torch.tensor([1.0, 2.0, 3.0])],
                          group=tp)
results["all_gather_coalesced"] = [[t.tolist() for t in per_rank] for per_rank in coalesced_out]
dist.barrier()
work = dist.all_reduce(ones(), group=tp, async_op=True)
work.wait()
results["async_completed"] = work.is_completed()
results["future_value"] = work.get_future().value()[0].tolist()
with dist._coalescing_manager(group=tp):
    coalesced = [torch.ones(1), torch.ones(2)]
    for tensor in coalesced:
        dist.all_reduce(tensor, group=tp)
results["coalesced"] = [t.tolist() for t in coalesced]
objects = [{"config": "a"}]
dist.broadcast_object_list(objects, src=rank - me if me else rank + 1, group=tp)
results["broadcast_object_list"] = objects
gathered_objects = [None] * 8
dist.all_gather_object(gathered_objects, {"rank": rank}, group=tp)
results["all_gather_object"] = gathered_objects
dist.send_object_list([("meta", 3)], dst=(rank + 1) % world)
echoed = [None]
dist.recv_object_list(echoed, src=(rank - 1) % world)
results["recv_object_list"] = list(echoed[0])
halves = dist.split_group(split_ranks=[list(range(world // 2)), list(range(world // 2, world))],
                          group_desc="half")
results["split_group"] = [dist.get_world_size(halves), dist.get_rank(halves)]
print("RESULT " + json.dumps(results), flush=True)
dist.destroy_process_group()
