"""Train a small GPT with hand-written 3D parallelism (tensor, pipeline, data).

This is an ordinary torch.distributed training script in the Megatron style:

* tensor parallelism: column-parallel qkv / fc1 and row-parallel attention
  projection / fc2, with attention heads split over the TP group;
* pipeline parallelism: layers split evenly over stages, 1F1B schedule with
  activations and their gradients exchanged by point-to-point ops;
* data parallelism: gradients averaged over the DP group with one all_reduce.

Ranks are laid out with TP fastest: rank = tp_rank + tp * (dp_rank + dp * pp_rank).
The data is a deterministic synthetic token stream, so runs are reproducible.

Run it for real (CPU, gloo):

    torchrun --nproc-per-node 2 examples/train_gpt.py --tp 1 --pp 2

Run one rank of a huge job under prism-debug, which emulates the other ranks:

    prism-debug run -- python examples/train_gpt.py
"""

import argparse
import math
import os
import resource
import time
from collections import deque
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--tp", type=int, default=8, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=4, help="pipeline-parallel size")
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timing", action="store_true",
                        help="Every rank prints its iteration times and peak RSS at the end.")
    parser.add_argument("--data-parallel-size", type=int, default=None,
                        help="Draw the batches of a job with this many data-parallel replicas "
                             "[default: this job's]; with --data-parallel-rank, a smaller job "
                             "is fed one replica's batches of a larger one.")
    parser.add_argument("--data-parallel-rank", type=int, default=None,
                        help="The replica whose batches to draw [default: this rank's].")
    parser.add_argument("--loss-hex", action="store_true",
                        help="Print each loss exactly (float.hex) beside its rounded value.")
    args = parser.parse_args()
    if args.data_parallel_rank is not None and not (
            args.data_parallel_size and 0 <= args.data_parallel_rank < args.data_parallel_size):
        parser.error("--data-parallel-rank needs --data-parallel-size, and must be below it")
    return args


@dataclass
class Layout:
    """Where this rank sits in the tp x dp x pp grid, and the groups it belongs to."""

    tp: int
    dp: int
    pp: int
    tp_rank: int
    dp_rank: int
    pp_rank: int
    tp_group: dist.ProcessGroup | None = None
    dp_group: dist.ProcessGroup | None = None
    pp_group: dist.ProcessGroup | None = None

    @property
    def is_first_stage(self):
        return self.pp_rank == 0

    @property
    def is_last_stage(self):
        return self.pp_rank == self.pp - 1

    def global_rank(self, tp_rank, dp_rank, pp_rank):
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)


def make_layout(args, rank, world_size):
    """Validate the parallel sizes before any communication, so a bad config fails fast."""
    tp, pp = args.tp, args.pp
    if world_size % (tp * pp):
        raise ValueError(
            f"WORLD_SIZE={world_size} is not divisible by tp*pp = {tp}*{pp} = {tp * pp}")
    if args.layers % pp:
        raise ValueError(f"--layers {args.layers} is not divisible by --pp {pp}")
    if args.heads % tp:
        raise ValueError(f"--heads {args.heads} is not divisible by --tp {tp}")
    if args.hidden % args.heads:
        raise ValueError(f"--hidden {args.hidden} is not divisible by --heads {args.heads}")
    dp = world_size // (tp * pp)
    return Layout(tp=tp, dp=dp, pp=pp, tp_rank=rank % tp, dp_rank=rank // tp % dp,
                  pp_rank=rank // (tp * dp))


def new_group_containing(rank, group_desc, all_groups):
    """Create every group (new_group is collective, so all ranks create all groups in the
    same order) and keep the one holding `rank`. Total work is O(world size)."""
    mine = None
    for ranks in all_groups:
        group = dist.new_group(ranks, group_desc=group_desc)
        if rank in ranks:
            mine = group
    return mine


def build_groups(layout, rank):
    tp, dp, pp, at = layout.tp, layout.dp, layout.pp, layout.global_rank
    layout.tp_group = new_group_containing(
        rank, "tp", ([at(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)))
    layout.dp_group = new_group_containing(
        rank, "dp", ([at(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)))
    layout.pp_group = new_group_containing(
        rank, "pp", ([at(t, d, p) for p in range(pp)] for d in range(dp) for t in range(tp)))


# --- Tensor parallelism ------------------------------------------------------


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward; backward sums the input gradient over the TP group,
    because each rank only computed the gradient from its own shard of the outputs."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: forward sums the partial outputs over the TP group; the gradient of a sum
    with respect to each addend is the gradient itself, so backward is the identity."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Linear layer whose output features are split over the TP group."""

    def __init__(self, weight_shard, layout):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)
        self.bias = nn.Parameter(torch.zeros(weight_shard.shape[0]))
        self.layout = layout

    def forward(self, x):
        if self.layout.tp > 1:
            x = CopyToTensorParallel.apply(x, self.layout.tp_group)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Linear layer whose input features are split over the TP group; the bias is replicated
    and added once, after the partial products are summed."""

    def __init__(self, weight_shard, layout):
        super().__init__()
        self.weight = nn.Parameter(weight_shard)
        self.bias = nn.Parameter(torch.zeros(weight_shard.shape[0]))
        self.layout = layout

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.layout.tp > 1:
            y = ReduceFromTensorParallel.apply(y, self.layout.tp_group)
        return y + self.bias


# --- Model -------------------------------------------------------------------


def seed_component(seed, component):
    """Seed each model component on its own, so its weights do not depend on which stage or
    TP rank builds it: every layout starts from the same full model."""
    torch.manual_seed(seed * 1_000_003 + component)


class Block(nn.Module):
    def __init__(self, args, layout, layer_index):
        super().__init__()
        hidden, heads = args.hidden, args.heads
        self.head_dim = hidden // heads
        self.local_heads = heads // layout.tp
        local_ffn = 4 * hidden // layout.tp
        heads_shard = slice(layout.tp_rank * self.local_heads,
                            (layout.tp_rank + 1) * self.local_heads)
        ffn_shard = slice(layout.tp_rank * local_ffn, (layout.tp_rank + 1) * local_ffn)
        # Residual projections are scaled down with depth, as in GPT-2.
        residual_std = 0.02 / math.sqrt(2 * args.layers)

        # Draw the full (unsharded) weights, then keep this rank's shard.
        seed_component(args.seed, layer_index)
        qkv = torch.randn(3, heads, self.head_dim, hidden) * 0.02
        proj = torch.randn(hidden, heads, self.head_dim) * residual_std
        fc1 = torch.randn(4 * hidden, hidden) * 0.02
        fc2 = torch.randn(hidden, 4 * hidden) * residual_std

        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = ColumnParallelLinear(qkv[:, heads_shard].reshape(-1, hidden), layout)
        self.proj = RowParallelLinear(proj[:, heads_shard].reshape(hidden, -1), layout)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = ColumnParallelLinear(fc1[ffn_shard].contiguous(), layout)
        self.fc2 = RowParallelLinear(fc2[:, ffn_shard].contiguous(), layout)

    def forward(self, x):
        batch, seq, _ = x.shape
        qkv = self.qkv(self.ln1(x)).view(batch, seq, 3, self.local_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (batch, local_heads, seq, head_dim)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, -1))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPTStage(nn.Module):
    """The layers of the GPT held by one pipeline stage. The first stage maps tokens to
    activations, the last maps activations to logits, the others map activations to activations."""

    def __init__(self, args, layout):
        super().__init__()
        self.is_first, self.is_last = layout.is_first_stage, layout.is_last_stage
        per_stage = args.layers // layout.pp
        first_layer = layout.pp_rank * per_stage
        if self.is_first:
            seed_component(args.seed, args.layers)
            self.token_emb = nn.Embedding(args.vocab, args.hidden)
            self.pos_emb = nn.Embedding(args.seq_len, args.hidden)
            nn.init.normal_(self.token_emb.weight, std=0.02)
            nn.init.normal_(self.pos_emb.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(args, layout, i)
                                    for i in range(first_layer, first_layer + per_stage))
        if self.is_last:
            seed_component(args.seed, args.layers + 1)
            self.ln_f = nn.LayerNorm(args.hidden)
            self.head = nn.Linear(args.hidden, args.vocab, bias=False)
            nn.init.normal_(self.head.weight, std=0.02)

    def forward(self, x):
        if self.is_first:
            x = self.token_emb(x) + self.pos_emb(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            x = block(x)
        if self.is_last:
            x = self.head(self.ln_f(x))
        return x


# --- Data --------------------------------------------------------------------


def synthetic_batch(args, layout, iteration, device):
    """Arithmetic sequences (start + k * stride) mod vocab, one per row: predictable from
    context, so the loss falls. Start and stride are drawn for the whole global batch (cheap:
    two ints per row) and each DP rank expands only its own rows, so the split over DP ranks
    is the same data as one rank running dp * micro_batches micro-batches."""
    rows = args.micro_batches * args.micro_batch_size
    replicas = layout.dp if args.data_parallel_size is None else args.data_parallel_size
    replica = layout.dp_rank if args.data_parallel_rank is None else args.data_parallel_rank
    generator = torch.Generator().manual_seed(args.seed * 1_000_003 + iteration)
    start = torch.randint(args.vocab, (replicas * rows, 1), generator=generator)
    stride = torch.randint(1, 8, (replicas * rows, 1), generator=generator)
    mine = slice(replica * rows, (replica + 1) * rows)
    stream = (start[mine] + stride[mine] * torch.arange(args.seq_len + 1)) % args.vocab
    stream = stream.view(args.micro_batches, args.micro_batch_size, args.seq_len + 1).to(device)
    return stream[..., :-1], stream[..., 1:]


# --- Pipeline ----------------------------------------------------------------


class PipelineComm:
    """Point-to-point exchange with the neighbouring stages. Sends and receives that happen at
    the same step go in one batch_isend_irecv, so two stages sending to each other cannot
    deadlock. Requests aimed past either end of the pipeline are dropped."""

    def __init__(self, layout, activation_shape, device):
        self.group = layout.pp_group
        at, t, d, p = layout.global_rank, layout.tp_rank, layout.dp_rank, layout.pp_rank
        self.prev = None if layout.is_first_stage else at(t, d, p - 1)
        self.next = None if layout.is_last_stage else at(t, d, p + 1)
        self.shape = activation_shape
        self.device = device

    def exchange(self, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        ops = []
        from_prev = from_next = None
        if self.next is not None and send_next is not None:
            ops.append(dist.P2POp(dist.isend, send_next, self.next, self.group))
        if self.prev is not None and send_prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev, self.prev, self.group))
        if self.prev is not None and recv_prev:
            from_prev = torch.empty(self.shape, device=self.device)
            ops.append(dist.P2POp(dist.irecv, from_prev, self.prev, self.group))
        if self.next is not None and recv_next:
            from_next = torch.empty(self.shape, device=self.device)
            ops.append(dist.P2POp(dist.irecv, from_next, self.next, self.group))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        return from_prev, from_next


def train_step(model, comm, layout, tokens, targets):
    """Run forward and backward over all micro-batches with a 1F1B schedule. Returns the mean
    loss on the last stage, None elsewhere."""
    num_micro = tokens.shape[0]
    warmup = min(layout.pp - layout.pp_rank - 1, num_micro)
    steady = num_micro - warmup
    in_flight = deque()  # (stage input, stage output) of micro-batches awaiting backward
    losses = []

    def forward(micro, stage_input):
        if stage_input is not None:
            stage_input.requires_grad_()
        output = model(tokens[micro] if stage_input is None else stage_input)
        if layout.is_last_stage:
            output = F.cross_entropy(output.flatten(0, 1), targets[micro].flatten())
            losses.append(output.detach())
        in_flight.append((stage_input, output))
        return output

    def backward(output_grad):
        stage_input, output = in_flight.popleft()
        if layout.is_last_stage:
            (output / num_micro).backward()
        else:
            output.backward(output_grad)
        return None if stage_input is None else stage_input.grad

    for micro in range(warmup):
        stage_input, _ = comm.exchange(recv_prev=True)
        comm.exchange(send_next=forward(micro, stage_input))

    if steady:
        stage_input, _ = comm.exchange(recv_prev=True)
    for i in range(steady):
        output = forward(warmup + i, stage_input)
        _, output_grad = comm.exchange(send_next=output, recv_next=True)
        input_grad = backward(output_grad)
        stage_input, _ = comm.exchange(send_prev=input_grad, recv_prev=i < steady - 1)

    for _ in range(warmup):
        _, output_grad = comm.exchange(recv_next=True)
        comm.exchange(send_prev=backward(output_grad))

    return torch.stack(losses).mean().item() if losses else None


def average_gradients(params, layout):
    """Average gradients over the DP group in one flat bucket (one all_reduce per step)."""
    if layout.dp == 1:
        return
    grads = [p.grad for p in params]
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=layout.dp_group)
    flat /= layout.dp
    for grad, averaged in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(averaged)


def main():
    args = parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    layout = make_layout(args, rank, world_size)

    if args.backend != "gloo" and torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    dist.init_process_group(backend=args.backend)
    build_groups(layout, rank)

    model = GPTStage(args, layout).to(device)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    comm = PipelineComm(layout, (args.micro_batch_size, args.seq_len, args.hidden), device)

    iteration_ends = [time.perf_counter()]
    for iteration in range(args.iterations):
        tokens, targets = synthetic_batch(args, layout, iteration, device)
        optimizer.zero_grad()
        loss = train_step(model, comm, layout, tokens, targets)
        average_gradients(params, layout)
        optimizer.step()
        iteration_ends.append(time.perf_counter())
        if layout.is_last_stage and layout.tp_rank == 0:
            exact = f" ({float(loss).hex()})" if args.loss_hex else ""
            print(f"iter {iteration} loss {loss:.6f}{exact}", flush=True)

    if args.timing:
        # an iteration ends at its optimizer step, as prism-debug counts them
        times = [round(b - a, 6) for a, b in pairwise(iteration_ends)]
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(f"timing rank={rank} iteration_s={times} peak_rss_bytes={peak_rss}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
