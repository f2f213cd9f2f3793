"""A training rank that holds about --gib GiB (parameters, gradients and Adam
state: 16 bytes per parameter), for tools/bench_snapshot.py.

Under prism-debug it is one rank of a data-parallel job.  Standalone
(``--standalone``) it trains on its own, then prints ``ready PID`` and waits,
so the criu command line can dump it; it also times ``torch.save`` of its
model and optimizer state, the usual alternative to a process snapshot.
"""

import argparse
import os
import sys
import tempfile
import time

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--gib", type=float, required=True)
parser.add_argument("--iterations", type=int, default=3)
parser.add_argument("--standalone", action="store_true")
# this share of --gib is frozen weights, written once and never again (as a
# fine-tuned model's base): what an incremental snapshot leaves out
parser.add_argument("--frozen", type=float, default=0.0)
args = parser.parse_args()

torch.set_num_threads(1)
frozen = torch.arange(int(args.frozen * args.gib * 2**30 / 4), dtype=torch.float32)
# parameter, gradient, two Adam moments: float32 each
numel = int((1 - args.frozen) * args.gib * 2**30 / 16)
weight = torch.nn.Parameter(torch.zeros(numel))
optimizer = torch.optim.Adam([weight], lr=1e-3)
if not args.standalone:
    import torch.distributed as dist

    dist.init_process_group("nccl")
for step in range(args.iterations):
    weight.grad = torch.full_like(weight, 1e-3 * (step + 1))
    if not args.standalone:
        dist.all_reduce(weight.grad[:1024])  # a collective per step, as DP would
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)

if args.standalone:
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        torch.save({"model": {"weight": weight}, "optimizer": optimizer.state_dict()},
                   os.path.join(scratch, "state.pt"))  # into the page cache, as CRIU's images
        print(f"torch_save_s {time.perf_counter() - started:.4f}", flush=True)
    print(f"ready {os.getpid()}", flush=True)
    while True:  # dumped from outside, then killed
        time.sleep(1)
sys.exit(0)
