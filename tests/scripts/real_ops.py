"""The ops a group of real ranks runs for real, each rank contributing
values made of its rank, the results printed as one JSON line (tests check
them against closed forms).  Every group here is all-real when the run's
real ranks are the whole world; ``--pair`` keeps to ranks 0 and 1 (a world
where only they are real): a group of the two, and point to point between
them and to a virtual rank."""

import json
import os
import sys

import torch
import torch.distributed as dist

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dist.init_process_group("nccl")
results = {}
if "--pair" in sys.argv:
    pair = dist.new_group([0, 1], group_desc="pair")
    if rank in (0, 1):
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x, group=pair)
        results["pair_sum"] = x.item()
        peer = 1 - rank
        got = torch.empty(2)
        ops = [dist.P2POp(dist.isend, torch.full((2,), rank + 5.0), peer),
               dist.P2POp(dist.irecv, got, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        results["from_peer"] = got.tolist()
        if rank == 1:  # a virtual peer's receive: the rank does not wait for anyone real
            dist.send(torch.ones(2), dst=2)
        # the world: two real members among virtual peers
        x = torch.tensor([rank + 1.0])
        dist.all_reduce(x)
        results["world_sum"] = x.item()
        outs = [torch.empty(1) for _ in range(world)]
        dist.all_gather(outs, torch.tensor([rank + 1.0]))
        results["world_gather"] = [o.item() for o in outs]
        x = torch.tensor([rank + 1.0])
        dist.broadcast(x, src=world - 1)
        results["world_broadcast"] = x.item()
    print("RESULTS " + json.dumps(results), flush=True)
    dist.destroy_process_group()
    sys.exit(0)

n = world
x = torch.tensor([rank + 1.0])
dist.all_reduce(x)
results["sum"] = x.item()
x = torch.tensor([3.0 * (rank + 1)])
dist.all_reduce(x, op=dist.ReduceOp.AVG)
results["avg"] = x.item()
x = torch.tensor([rank + 2.0])
dist.all_reduce(x, op=dist.ReduceOp.PRODUCT)
results["product"] = x.item()
x = torch.tensor([float(rank)])
dist.all_reduce(x, op=dist.ReduceOp.MAX)
results["max"] = x.item()
x = torch.arange(3.0) + 10 * rank
dist.broadcast(x, src=1)
results["broadcast"] = x.tolist()
outs = [torch.empty(2) for _ in range(n)]
dist.all_gather(outs, torch.full((2,), float(rank)))
results["all_gather"] = [o.tolist() for o in outs]
out = torch.empty(n)
dist.all_gather_into_tensor(out, torch.tensor([rank * 2.0]))
results["all_gather_into_tensor"] = out.tolist()
out = torch.empty(2)
dist.reduce_scatter_tensor(out, torch.arange(2.0 * n) + rank)
results["reduce_scatter_tensor"] = out.tolist()
out = torch.empty(1)
dist.reduce_scatter(out, [torch.tensor([10.0 * i + rank]) for i in range(n)])
results["reduce_scatter"] = out.tolist()
out = torch.empty(n)
dist.all_to_all_single(out, torch.arange(float(n)) + 10 * rank)
results["all_to_all_single"] = out.tolist()
outs = [torch.empty(1) for _ in range(n)]
dist.all_to_all(outs, [torch.tensor([100.0 * rank + i]) for i in range(n)])
results["all_to_all"] = [o.item() for o in outs]
gathered = [torch.empty(1) for _ in range(n)] if rank == 0 else None
dist.gather(torch.tensor([rank + 0.5]), gathered, dst=0)
results["gather"] = [g.item() for g in gathered] if rank == 0 else None
scattered = torch.empty(1)
dist.scatter(scattered, [torch.tensor([7.0 * i]) for i in range(n)] if rank == 0 else None, src=0)
results["scatter"] = scattered.item()
x = torch.tensor([rank + 1.0])
dist.reduce(x, dst=0)
results["reduce"] = x.item()
dist.barrier()
got = torch.empty(2)
ops = [dist.P2POp(dist.isend, torch.full((2,), float(rank)), (rank + 1) % n),
       dist.P2POp(dist.irecv, got, (rank - 1) % n)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
results["ring"] = got.tolist()
print("RESULTS " + json.dumps(results), flush=True)
dist.destroy_process_group()
