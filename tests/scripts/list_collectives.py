"""The list forms of torch.distributed's collectives and their tensor forms,
three iterations (optimizer steps) of them in the default group (no
send/recv: gloo's recorder leaves them out): run by prism-debug (the
flight record the harness writes) and by real gloo processes (torch's own
flight recorder), so tests/backend/test_fr_nccl_names.py can compare the two.

With RECORD_DIR set (the real gloo run), each rank dumps torch's recorder
after every op and writes which entries each op added to RECORD_DIR/RANK.json.
"""

import json
import os
import pickle

import torch
import torch.distributed as dist

world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
dist.init_process_group(os.environ.get("BACKEND", "nccl"))
record_dir = os.environ.get("RECORD_DIR")
seen = 0
added: list = []


def op(label, run):
    """Run one op; with RECORD_DIR, note the entries torch recorded for it."""
    global seen
    run()
    if record_dir:
        entries = pickle.loads(torch._C._distributed_c10d._dump_fr_trace(True, False, False))[
            "entries"]
        new = [e for e in entries if e["record_id"] >= seen]
        seen += len(new)
        added.append([label, [{k: e[k] for k in ("profiling_name", "input_sizes",
                                                  "input_dtypes", "output_sizes",
                                                  "output_dtypes")} for e in new]])


# prism-debug counts iterations by optimizer steps
optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
for _iteration in range(3):
    op("all_gather list", lambda: dist.all_gather([torch.empty(1) for _ in range(world)],
                                                  torch.ones(1)))
    op("all_gather list 2x3", lambda: dist.all_gather(
        [torch.empty(2, 3) for _ in range(world)], torch.ones(2, 3)))
    op("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
        torch.empty(world * 2), torch.ones(2)))
    op("reduce_scatter list", lambda: dist.reduce_scatter(
        torch.empty(2), [torch.ones(2) for _ in range(world)]))
    op("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(
        torch.empty(2), torch.ones(world * 2)))
    op("all_to_all list", lambda: dist.all_to_all(
        [torch.empty(2) for _ in range(world)], [torch.ones(2) for _ in range(world)]))
    op("all_to_all_single", lambda: dist.all_to_all_single(
        torch.empty(world * 2), torch.ones(world * 2)))
    op("all_reduce", lambda: dist.all_reduce(torch.ones(3, 4)))
    op("broadcast", lambda: dist.broadcast(torch.ones(2, dtype=torch.bfloat16), 0))
    op("reduce", lambda: dist.reduce(torch.ones(4), 0))
    op("gather", lambda: dist.gather(
        torch.ones(3), [torch.empty(3) for _ in range(world)] if rank == 0 else None, dst=0))
    op("scatter", lambda: dist.scatter(
        torch.empty(3), [torch.ones(3) for _ in range(world)] if rank == 0 else None, src=0))
    op("all_reduce_coalesced", lambda: dist.all_reduce_coalesced(
        [torch.ones(2), torch.ones(3)]))
    op("barrier", dist.barrier)
    optimizer.step()

if record_dir:
    with open(os.path.join(record_dir, f"{rank}.json"), "w") as f:
        json.dump(added, f)
dist.destroy_process_group()
