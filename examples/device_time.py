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

A production incident, for real (what prism-debug's incident import is
checked against): ``--incident KIND:RANK:ITERATION`` makes rank RANK, and
only it, misbehave at that 1-based iteration just before its first
data-parallel all-reduce bucket (with dp = 1, before the iteration's first
tensor-parallel all-reduce; one of the two is needed): ``hang`` stops there
until a signal ends it, ``die`` kills itself with SIGKILL (a crash: it
leaves no flight record), ``size`` all-reduces a bucket of twice the
expected numel.  ``--timeout-s S`` sets the process groups' timeout
(torch's default otherwise).  ``--dump-dir DIR`` keeps the flight record
as a production job does: when a communication op raises (gloo's timeout,
a peer's reset), the rank writes torch's flight-recorder dump
(``_dump_fr_trace``) to ``DIR/nccl_trace_rank_<R>`` (torch's file name),
says so in one line and exits 1; on SIGTERM (torchrun tearing the job down
after a rank failed) it writes the dump too, unless written, and exits 143.
Without ``--dump-dir`` none of this happens (under prism-debug, its own
watchdog and flight recorder take that part).

    torchrun --nproc-per-node 8 examples/device_time.py --pp 2 --tp 2 \\
        --incident hang:2:3 --timeout-s 5 --dump-dir dumps/
"""

import argparse
import json
import os
import resource
import signal
import sys
import time
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

JITTER_FAMILIES = ("normal", "gamma", "lognormal")
INCIDENT_KINDS = ("hang", "size", "die")
DUMP_PREFIX = "nccl_trace_rank_"  # the stem of torch's TORCH_FR_DUMP_TEMP_FILE default


def parse_incident(text):
    """``KIND:RANK:ITERATION`` (e.g. ``hang:2:3``) as (kind, rank, iteration)."""
    try:
        kind, rank, iteration = text.split(":")
        rank, iteration = int(rank), int(iteration)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not KIND:RANK:ITERATION (e.g. hang:2:3)") from None
    if kind not in INCIDENT_KINDS:
        raise argparse.ArgumentTypeError(f"incident kind {kind!r} is not one of "
                                         f"{', '.join(INCIDENT_KINDS)}")
    if rank < 0 or iteration < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: RANK must be >= 0 and ITERATION >= 1 "
                                         "(iterations count from 1)")
    return kind, rank, iteration


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
    parser.add_argument("--incident", type=parse_incident, metavar="KIND:RANK:ITERATION",
                        help="rank RANK alone misbehaves at that iteration (from 1), just "
                             "before its first dp all-reduce bucket (first tp all-reduce "
                             "when dp = 1): hang (until signalled), die (SIGKILL), size "
                             "(a bucket of twice the numel)")
    parser.add_argument("--timeout-s", type=float,
                        help="the process groups' timeout (default: torch's)")
    parser.add_argument("--dump-dir", type=Path,
                        help=f"when a communication op raises, or on SIGTERM, write the "
                             f"rank's flight record to DIR/{DUMP_PREFIX}<R> and exit")
    args = parser.parse_args(argv)
    if args.jitter_cv < 0 or args.rank_cv < 0:
        parser.error("--jitter-cv and --rank-cv must be >= 0")
    if args.timeout_s is not None and args.timeout_s <= 0:
        parser.error("--timeout-s must be > 0")
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

    def build_groups(self, rank, timeout=None):
        """Every rank creates every group (new_group is collective) and keeps its own;
        ``timeout`` (a timedelta) is each group's (a new group does not inherit the
        default group's: it gets torch's default)."""
        tp, dp, pp, at = self.tp, self.dp, self.pp, self.at
        families = {
            "tp": [[at(t, d, p) for t in range(tp)] for p in range(pp) for d in range(dp)],
            "dp": [[at(t, d, p) for d in range(dp)] for p in range(pp) for t in range(tp)],
            "pp": [[at(t, d, p) for p in range(pp)] for d in range(dp) for t in range(tp)],
        }
        for name, groups in families.items():
            for ranks in groups:
                group = dist.new_group(ranks, timeout=timeout, group_desc=name)
                if rank in ranks:
                    setattr(self, f"{name}_group", group)
        self.prev = None if self.pp_rank == 0 else at(self.tp_rank, self.dp_rank, self.pp_rank - 1)
        self.next = (None if self.pp_rank == pp - 1
                     else at(self.tp_rank, self.dp_rank, self.pp_rank + 1))


class Incident:
    """``--incident`` on this rank: nothing unless the rank is the culprit; the
    culprit strikes once, at its first collective of the incident's family
    (the dp buckets; tp when dp = 1) in the chosen iteration."""

    def __init__(self, spec, rank, layout):
        kind, culprit, self.at = spec if spec is not None else (None, None, None)
        self.kind = kind if culprit == rank else None
        self.family = "dp" if layout.dp > 1 else "tp"
        self.iteration = 0  # the iteration in progress, from 1
        self.struck = False

    def begin_iteration(self):
        self.iteration += 1

    def before(self, family, tensor):
        """The tensor this rank all-reduces where it should all-reduce ``tensor``."""
        if (self.kind is None or self.struck or family != self.family
                or self.iteration != self.at):
            return tensor
        self.struck = True
        if self.kind == "hang":
            while True:  # until a signal ends the process (SIGTERM's default, or its handler)
                signal.pause()
        if self.kind == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.zeros(2 * tensor.numel(), dtype=tensor.dtype)


class FlightRecordKeeper:
    """``--dump-dir``: the rank's flight record written once, as a production
    job's failure handler would, when a communication op raises or on SIGTERM."""

    def __init__(self, directory, rank):
        self.rank, self.path = rank, directory / f"{DUMP_PREFIX}{rank}"
        self.state = None  # "writing", then "written"
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def write(self, why):
        if self.state is not None:
            return
        self.state = "writing"
        data = torch._C._distributed_c10d._dump_fr_trace(True, True, False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_bytes(data)
        partial.replace(self.path)  # a reader never sees half a dump
        self.state = "written"
        print(f"rank {self.rank}: {why}; flight record written to {self.path}", flush=True)

    def _on_sigterm(self, signum, frame):
        # Python runs the handler between two bytecodes of the main thread: a
        # rank blocked in a gloo op gets here when the op returns or times out
        if self.state == "writing":
            return  # the interrupted write finishes; its rank then exits 1
        self.write("SIGTERM")
        os._exit(128 + signal.SIGTERM)


class Stage:
    """One pipeline stage: layers that wait for device time and all-reduce over tp."""

    def __init__(self, args, layout, compute_factor, jitter, incident=None):
        self.args, self.layout, self.jitter = args, layout, jitter
        self.incident = incident
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
                buffer = (self.tp_buffer if self.incident is None
                          else self.incident.before("tp", self.tp_buffer))
                dist.all_reduce(buffer, group=self.layout.tp_group)
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
    if args.incident is not None:
        if layout.dp == 1 and layout.tp == 1:
            raise ValueError("--incident needs a collective to strike at: dp > 1 or tp > 1 "
                             "(gloo's flight recorder does not record point-to-point ops)")
        if args.incident[1] >= world_size:
            raise ValueError(f"--incident rank {args.incident[1]} is not in a world of "
                             f"{world_size}")
    torch.set_num_threads(1)
    keeper = FlightRecordKeeper(args.dump_dir, rank) if args.dump_dir is not None else None
    timeout = None if args.timeout_s is None else timedelta(seconds=args.timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    layout.build_groups(rank, timeout)
    slow = os.environ.get("DEVICE_TIME_SLOW_RANK")
    compute_factor = (float(os.environ.get("DEVICE_TIME_SLOW_FACTOR", "2"))
                      if slow and int(slow) == rank else 1.0)
    jitter = Jitter(args.jitter_dist, args.jitter_cv, args.rank_cv, args.jitter_seed, rank)
    incident = Incident(args.incident, rank, layout)
    stage = Stage(args, layout, compute_factor, jitter, incident)

    # the stage's weights: their gradient is what dp all-reduces, in buckets
    weight = torch.nn.Parameter(torch.zeros(args.grad_kib * 256))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    bucket = -(-weight.numel() // args.buckets)
    ends = [time.perf_counter()]
    try:
        for _ in range(args.iterations):
            incident.begin_iteration()
            optimizer.zero_grad()
            train_step(stage, layout, args.micro_batches)
            weight.grad = torch.ones_like(weight)
            if layout.dp > 1:
                for start in range(0, weight.numel(), bucket):
                    grad = incident.before("dp", weight.grad[start:start + bucket])
                    dist.all_reduce(grad, group=layout.dp_group)
                jitter.communicated()
            time.sleep(args.optimizer_ms / 1e3 * jitter.stretch_factor())
            jitter.communicated()  # (the next iteration's first sleep follows prism's boundary)
            optimizer.step()  # an iteration ends here, where prism-debug counts one
            ends.append(time.perf_counter())
    except RuntimeError as error:  # gloo's timeouts and resets (DistError is a RuntimeError)
        if keeper is None:
            raise
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        keeper.write(f"{type(error).__name__}: {first_line}")
        sys.stderr.flush()
        # at once, as a failure handler that aborts the job does: an orderly
        # exit would first tear down every gloo group (seconds on two cores)
        os._exit(1)

    if args.timing_dir is not None:
        times = [b - a for a, b in pairwise(ends)]
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
