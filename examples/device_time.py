"""A training step whose compute is device time: the host only waits.

An ordinary torch.distributed script (run it under torchrun or under
``prism-debug run``) with the communication of a Megatron-style job —
pipeline stages exchanging activations and gradients point to point in a
1F1B schedule over several micro-batches, tensor-parallel all-reduces
inside every layer, a bucketed data-parallel all-reduce of the gradients,
an optimizer step — but where a GPU job's host waits for its kernels, this
one sleeps for fixed, configured durations.  Waiting costs no CPU, so a
16-process job runs on two cores with the timing of a much larger machine,
which makes it the real job the fidelity benchmark compares emulation with.

Ranks are laid out with TP fastest, as in train_gpt.py:
rank = tp_rank + tp * (dp_rank + dp * pp_rank).

    torchrun --nproc-per-node 16 examples/device_time.py --pp 4 --timing-dir out/

Each rank writes its iteration times and peak RSS to ``TIMING_DIR/rank<R>.json``
(a file per rank: never interleaved with another rank's output).
``DEVICE_TIME_SLOW_RANK=R`` (and ``DEVICE_TIME_SLOW_FACTOR``, default 2)
makes rank R's compute that much slower: a real straggler.

Jittered device time (``--jitter-cv C``, default 0: every sleep exactly as
configured): each stretch of compute between two communication ops — a
micro-batch's forward or backward on a stage between its sends and
receives (each layer's, when tp > 1 puts an all-reduce after every layer;
all of a stage's micro-batches, when nothing is exchanged between them, as
with one stage), the optimizer step after the data-parallel all-reduces —
is multiplied by a fresh draw of a factor with mean 1 and coefficient of variation C from
``--jitter-dist`` (``normal``: loc 1, scale C, clipped at 0; ``gamma``:
shape 1/C², scale C²; ``lognormal``: sigma s = sqrt(ln(1 + C²)), median
exp(-s²/2)).  ``--rank-cv R`` also multiplies all of a rank's compute by a
factor of the same family and mean 1, drawn once (a slow-GPU lottery).  A
rank draws from its own generator, seeded with (``--jitter-seed``, rank):
the same seed gives the same draws.  One stretch of compute is one gap of
prism-debug's execution graph, so the job's variability is the one that
``prism-debug predict --variability "cv=C dist=F"`` states.
"""

import argparse
import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

JITTER_FAMILIES = ("normal", "gamma", "lognormal")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=4, help="pipeline-parallel size")
    parser.add_argument("--layers", type=int, default=2, help="layers per stage")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--forward-ms", type=float, default=4.0,
                        help="device time of one micro-batch's forward on a stage")
    parser.add_argument("--backward-ms", type=float, default=8.0)
    parser.add_argument("--last-stage-factor", type=float, default=1.5,
                        help="the last stage also computes the head and the loss")
    parser.add_argument("--activation-kib", type=int, default=256,
                        help="bytes sent between stages per micro-batch")
    parser.add_argument("--tp-kib", type=int, default=64,
                        help="bytes of each tensor-parallel all-reduce")
    parser.add_argument("--grad-kib", type=int, default=1024,
                        help="gradient bytes of one stage, all-reduced over dp")
    parser.add_argument("--buckets", type=int, default=2, help="dp all-reduce buckets")
    parser.add_argument("--optimizer-ms", type=float, default=2.0)
    parser.add_argument("--timing-dir", type=Path,
                        help="Write rank<R>.json (iteration times, peak RSS) here.")
    parser.add_argument("--jitter-cv", type=float, default=0.0,
                        help="coefficient of variation of a fresh factor (mean 1) on each "
                             "stretch of compute between communication ops (0: none)")
    parser.add_argument("--jitter-dist", choices=JITTER_FAMILIES, default="lognormal",
                        help="family of the factors (normal is clipped at 0)")
    parser.add_argument("--rank-cv", type=float, default=0.0,
                        help="coefficient of variation of a persistent per-rank factor "
                             "(mean 1, the same family), drawn once")
    parser.add_argument("--jitter-seed", type=int, default=0,
                        help="a rank's generator is seeded with (this, rank)")
    args = parser.parse_args(argv)
    if args.jitter_cv < 0 or args.rank_cv < 0:
        parser.error("--jitter-cv and --rank-cv must be >= 0")
    return args


def draw_factors(rng, family, cv, size=None):
    """Factors of mean 1 and coefficient of variation ``cv``, parametrised as
    prism-debug's Distribution.with_cv (scipy's norm / gamma / lognorm)."""
    if cv == 0:
        return np.ones(size) if size is not None else 1.0
    if family == "normal":
        return np.maximum(rng.normal(1.0, cv, size), 0.0)
    if family == "gamma":
        return rng.gamma(1 / cv**2, cv**2, size)
    if family == "lognormal":
        s = np.sqrt(np.log1p(cv**2))
        return rng.lognormal(-s**2 / 2, s, size)  # scipy lognorm(s, scale=exp(-s²/2))
    raise ValueError(f"unknown jitter family {family!r}; one of {JITTER_FAMILIES}")


class Jitter:
    """A rank's compute factors: one persistent, one fresh per stretch of compute."""

    def __init__(self, family, cv, rank_cv, seed, rank):
        self.family, self.cv = family, cv
        self.rng = np.random.default_rng((seed, rank))
        # drawn first, once, so that the per-stretch draws follow it alike on every rank
        self.rank_factor = float(draw_factors(self.rng, family, rank_cv))

        self._stretch = None  # this stretch's factor, until the next communication op

    def factor(self):
        """A fresh factor."""
        return self.rank_factor * float(draw_factors(self.rng, self.family, self.cv))

    def stretch_factor(self):
        """The factor of the stretch of compute in progress: drawn at its
        first sleep, kept until a communication op ends the stretch."""
        if self._stretch is None:
            self._stretch = self.factor()
        return self._stretch

    def communicated(self):
        self._stretch = None


class Layout:
    def __init__(self, args, rank, world_size):
        tp, pp = args.tp, args.pp
        if world_size % (tp * pp):
            raise ValueError(f"WORLD_SIZE={world_size} is not divisible by "
                             f"tp*pp = {tp}*{pp} = {tp * pp}")
        self.tp, self.pp, self.dp = tp, pp, world_size // (tp * pp)
        self.tp_rank = rank % tp
        self.dp_rank = rank // tp % self.dp
        self.pp_rank = rank // (tp * self.dp)

    def at(self, tp_rank, dp_rank, pp_rank):
        return tp_rank + self.tp * (dp_rank + self.dp * pp_rank)

    def build_groups(self, rank):
        """Every rank creates every group (new_group is collective) and keeps its own."""
        tp, dp, pp, at = self.tp, self.dp, self.pp, self.at
        families = {
            "tp": [[at(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)],
            "dp": [[at(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[at(t, d, p) for p in range(pp)] for d in range(dp) for t in range(tp)],
        }
        for name, groups in families.items():
            for ranks in groups:
                group = dist.new_group(ranks, group_desc=name)
                if rank in ranks:
                    setattr(self, f"{name}_group", group)
        self.prev = None if self.pp_rank == 0 else at(self.tp_rank, self.dp_rank, self.pp_rank - 1)
        self.next = (None if self.pp_rank == pp - 1
                     else at(self.tp_rank, self.dp_rank, self.pp_rank + 1))


class Stage:
    """One pipeline stage: layers that wait for device time and all-reduce over tp."""

    def __init__(self, args, layout, compute_factor, jitter):
        self.args, self.layout, self.jitter = args, layout, jitter
        factor = compute_factor * (args.last_stage_factor if layout.pp_rank == layout.pp - 1
                                   else 1.0)
        self.forward_s = args.forward_ms * factor / 1e3 / args.layers
        self.backward_s = args.backward_ms * factor / 1e3 / args.layers
        self.tp_buffer = torch.zeros(args.tp_kib * 256)
        self.activation = torch.zeros(args.activation_kib * 256)

    def _layers(self, seconds):
        # one factor per stretch of compute between two communication ops (one
        # gap of an execution graph): per layer when tp all-reduces after
        # each, else one for the layers and micro-batches until an exchange
        for _ in range(self.args.layers):
            # the host waits for the layer's kernels
            time.sleep(seconds * self.jitter.stretch_factor())
            if self.layout.tp > 1:  # row-parallel output / column-parallel input grad
                dist.all_reduce(self.tp_buffer, group=self.layout.tp_group)
                self.jitter.communicated()

    def forward(self):
        self._layers(self.forward_s)
        return self.activation.clone()

    def backward(self):
        self._layers(self.backward_s)
        return self.activation.clone()

    def exchange(self, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        """Sends and receives of one step in one batch, so neighbours cannot deadlock."""
        layout, ops = self.layout, []
        if layout.next is not None and send_next is not None:
            ops.append(dist.P2POp(dist.isend, send_next, layout.next, layout.pp_group))
        if layout.prev is not None and send_prev is not None:
            ops.append(dist.P2POp(dist.isend, send_prev, layout.prev, layout.pp_group))
        if layout.prev is not None and recv_prev:
            ops.append(dist.P2POp(dist.irecv, torch.empty_like(self.activation), layout.prev,
                                  layout.pp_group))
        if layout.next is not None and recv_next:
            ops.append(dist.P2POp(dist.irecv, torch.empty_like(self.activation), layout.next,
                                  layout.pp_group))
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
            self.jitter.communicated()


def train_step(stage, layout, num_micro):
    """Forward and backward of every micro-batch in a 1F1B schedule."""
    warmup = min(layout.pp - layout.pp_rank - 1, num_micro)
    steady = num_micro - warmup
    for _ in range(warmup):
        stage.exchange(recv_prev=True)
        stage.exchange(send_next=stage.forward())
    if steady:
        stage.exchange(recv_prev=True)
    for i in range(steady):
        stage.exchange(send_next=stage.forward(), recv_next=True)
        stage.exchange(send_prev=stage.backward(), recv_prev=i < steady - 1)
    for _ in range(warmup):
        stage.exchange(recv_next=True)
        stage.exchange(send_prev=stage.backward())


def main(argv=None):
    args = parse_args(argv)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    layout = Layout(args, rank, world_size)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    layout.build_groups(rank)
    slow = os.environ.get("DEVICE_TIME_SLOW_RANK")
    compute_factor = (float(os.environ.get("DEVICE_TIME_SLOW_FACTOR", "2"))
                      if slow and int(slow) == rank else 1.0)
    jitter = Jitter(args.jitter_dist, args.jitter_cv, args.rank_cv, args.jitter_seed, rank)
    stage = Stage(args, layout, compute_factor, jitter)

    # the stage's weights: their gradient is what dp all-reduces, in buckets
    weight = torch.nn.Parameter(torch.zeros(args.grad_kib * 256))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    bucket = -(-weight.numel() // args.buckets)
    ends = [time.perf_counter()]
    for _ in range(args.iterations):
        optimizer.zero_grad()
        train_step(stage, layout, args.micro_batches)
        weight.grad = torch.ones_like(weight)
        if layout.dp > 1:
            for start in range(0, weight.numel(), bucket):
                dist.all_reduce(weight.grad[start:start + bucket], group=layout.dp_group)
            jitter.communicated()
        time.sleep(args.optimizer_ms / 1e3 * jitter.stretch_factor())
        jitter.communicated()  # (the next iteration's first sleep follows prism's boundary)
        optimizer.step()  # an iteration ends here, where prism-debug counts one
        ends.append(time.perf_counter())

    if args.timing_dir is not None:
        times = [b - a for a, b in zip(ends, ends[1:])]
        peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        path = args.timing_dir / f"rank{rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps({"rank": rank, "iteration_s": times,
                                       "peak_rss_bytes": peak_rss,
                                       "compute_factor": compute_factor,
                                       "rank_factor": jitter.rank_factor}))
        partial.replace(path)  # a reader never sees half a file
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
