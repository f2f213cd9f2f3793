"""What the replay engine's event loop holds: per class (its times and place
in its program), per op (worked out once), for the real rank, and the
timings it records."""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.compute import Gaps
from prism_debug.engine.sampling import Draws
from prism_debug.engine.times import Time
from prism_debug.errors import GraphError
from prism_debug.graph.execution import ClassProgram, Event, OpSpec

#: a point-to-point stream: ("batch", family) for a group's batches, or
#: ("pair", family, peer offset) for a peer pair's lone ops
P2PStream = tuple[str, str] | tuple[str, str, int]
#: a stream an op may run on: a family's (its name, for collectives) or a p2p one
StreamKey = str | P2PStream
#: what a class counts its rendezvous by: ("coll", family), or ("p2p", source
#: class, target class, the sender's offset, kind)
SequenceKey = tuple[str, str] | tuple[str, int, int, int, str]
#: how the real rank's shortcut reads a class's times (see :mod:`.real`): where
#: its group max is in the group maxima, then the shape of those maxima and the
#: real rank's group in them (None, None: one group)
Plan = (tuple[tuple[int, ...], None, None]
        | tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]])
#: what a plan is for: an op's axes, and the shape of the class's times (None: a scalar)
PlanKey = tuple[tuple[int, ...], tuple[int, ...] | None]
#: every class's arrivals at an op whose groups span classes (the class axis
#: leading), the family's axes in a class array, and each class's unsampled
#: columns' maxima (None: every column simulated)
SpanningArrivals = tuple[Time, tuple[int, ...], NDArray[np.float64] | None]


@dataclasses.dataclass
class OpTiming:
    """When one op of one class arrived and completed in one iteration (the
    engine's records, for traces and tests)."""

    class_id: int
    iteration: int
    op: int
    arrival: Time | None  # None: not kept (the op was issued while not recording)
    done: Time
    # the op whose arrival set ``done``, as (class id, op index): the class's
    # own op for a group inside the class, else the latest class or p2p side
    cause: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """What the event loop needs of one op, worked out once."""

    spec: OpSpec
    axes: tuple[int, ...]  # the family's axes in a class array
    spans_classes: bool
    local: bool  # a collective inside the class: the fast path applies
    shared: bool = True  # its groups have more than one member
    streams: tuple[StreamKey, ...] = ()  # the streams it may run on (EventLoop._stream_keys)
    population: bool = False  # its groups span sampled columns (see :mod:`.sampling`)


class Unit:
    """What one class runs as one on a stream: a point-to-point op issued
    alone, or the ops of one batch_isend_irecv (one NCCL group: they run
    together, and each completes when the last of them does)."""

    __slots__ = ("class_id", "key", "ops", "arrival", "start", "end", "unresolved", "slack",
                 "matches", "causes", "launched")

    def __init__(self, class_id: int, key: P2PStream) -> None:
        self.class_id = class_id
        self.key = key  # its stream
        self.ops: list[tuple[int, int, Time]] = []  # (op index, iteration, arrival)
        self.arrival: Time = -math.inf  # its last op's issue: when NCCL launches the group
        self.start: Time | None = None  # once its stream is free
        self.end: Time | None = None  # the latest of its ops' ends so far
        self.unresolved = 0  # ops whose peer has not issued or started its side
        self.slack = math.inf
        self.matches: list[Match] = []  # the pairings of its ops, resolved once both sides start
        self.causes: dict[int, tuple[int, int]] = {}
        self.launched = False

    def relayout(self, column_map: Callable[[Time], Time]) -> None:
        self.arrival = column_map(self.arrival)
        if self.end is not None:
            self.end = column_map(self.end)
        if self.start is not None:
            self.start = column_map(self.start)
        self.ops = [(op, iteration, column_map(arrival)) for op, iteration, arrival in self.ops]


@dataclasses.dataclass(slots=True)
class Match:
    """A send paired with its recv: they run once both sides' units have
    started (shared by the two units)."""

    send_unit: Unit
    recv_unit: Unit
    step: int  # the sender's offset along the family's axis
    axis: int | None  # inside one class: the class arrays' axis the pair moves along
    send_class: int
    send_op: int
    resolved: bool = False


class ClassState:
    def __init__(self, program: ClassProgram, index: tuple[slice | int, ...],
                 ops: tuple[OpInfo, ...]) -> None:
        self.program = program
        self.ops = ops
        self.index = index  # selects the class's slice of a mesh-shaped array
        # A class's times are ``t + pending × factor``: compute since the last
        # time ``t`` was brought up to date stays a scalar, because the
        # factor is fixed within an iteration.  ``t`` keeps the class's mesh
        # dimensions, with size 1 along every axis its ranks agree on.
        self.t: Time = 0.0
        self.pending = 0.0
        self.gap_clock = 0.0  # all compute this iteration, to tell if any ran since an issue
        self.epoch = 0  # bumped whenever ``t`` changes
        self.issued_at: dict[int, tuple[int, float]] = {}
        self.pc = 0
        self.issued = 0  # ops issued this iteration: where op-level perturbations start
        self.iteration = 1
        # this iteration's events and the compute model's gap before each
        self.events: tuple[Event, ...] = program.events(1)
        self.gaps: Gaps = ()
        # each gap's largest value (per-rank models; empty for the others)
        self.gap_tops: Sequence[float] = ()
        self.uniforms: dict[int, Draws] = {}  # op -> its population maximum's draws
        # the compute model's persistent per-rank factors (internal order), if any
        self.rank_factors: Time | None = None
        self.gap_applied = False
        self.arrivals: dict[int, Time] = {}
        self.done: dict[int, Time] = {}
        self.sequence: dict[SequenceKey, int] = {}  # rendezvous counters, per iteration
        self.iteration_starts: list[Time] = [0.0]
        self.factor: Time | None = None  # compute factor this iteration (None: not computed)
        self.factor_max: dict[str, Time] = {}  # its max over each family's axes
        self.factor_top: float | None = None  # its max over the class
        # per completed op, a time it surely ends after each member's arrival
        self.slack: dict[int, float] = {}
        # family -> when each group's stream is free (its last op's end),
        # shaped like a group max; kept across iterations
        self.streams: dict[StreamKey, Time] = {}
        # point-to-point: per stream (a peer pair's, or a group's batches), when
        # it is free and the units queued on it; the batch being issued
        self.p2p_free: dict[StreamKey, Time] = {}
        self.queues: dict[P2PStream, collections.deque[Unit]] = {}
        self.open_unit: Unit | None = None
        # the class's real ranks, None when it has none (the event loop's
        # ``is_real``; see :mod:`.real`)
        self.reals: tuple[RealRank, ...] | None = None

    def next_sequence(self, key: SequenceKey) -> int:
        n = self.sequence.get(key, 0)
        self.sequence[key] = n + 1
        return n

    def relayout(self, column_map: Callable[[Time], Time]) -> None:
        """Apply ``column_map`` (see :meth:`.Layout.keep_apart`) to every time array held."""
        self.t = column_map(self.t)
        self.arrivals = {k: column_map(v) for k, v in self.arrivals.items()}
        self.done = {k: column_map(v) for k, v in self.done.items()}
        self.streams = {k: column_map(v) for k, v in self.streams.items()}
        self.p2p_free = {k: column_map(v) for k, v in self.p2p_free.items()}
        for queue in self.queues.values():
            for unit in queue:
                unit.relayout(column_map)
        if self.open_unit is not None:
            self.open_unit.relayout(column_map)
        self.iteration_starts = [column_map(v) for v in self.iteration_starts]
        self.forget_factors()

    def forget_factors(self) -> None:
        """The compute factors changed (or their layout did): work them out again."""
        self.factor = None
        self.factor_max.clear()
        self.factor_top = None


@dataclasses.dataclass
class RealRank:
    """The real rank: where it sits in the replay, and what the event loop
    keeps for the replay engine's real-rank interface."""

    rank: int
    class_id: int
    index: tuple[int, ...] = ()  # its element of its class's arrays
    allowed: int = -1  # its class may run up to this event index
    pending: tuple[int, float] | None = None  # (event index, arrival) of the op it issues
    # op index -> its arrival at the ops it issued this iteration (the class's
    # arrays may not hold it: see :mod:`.real`)
    arrivals: dict[int, float] = dataclasses.field(default_factory=dict)
    # (axes, shape of the class's times) -> how its shortcut reads them (see
    # :mod:`.real`), until the layout changes
    plans: dict[PlanKey, Plan | None] = dataclasses.field(default_factory=dict)
    # Completions of its ops, kept past their iteration's end: an async op may
    # be waited for after the next optimizer step (DDP futures).
    done: dict[tuple[int, int], Time] = dataclasses.field(default_factory=dict)
    # Who arrived last at its ops that pair with a peer: (rank, arrival).
    last: dict[int, tuple[int, float]] = dataclasses.field(default_factory=dict)
    # The arrivals of every class at its ops whose groups span classes, kept
    # until asked who arrived last.
    spanning: dict[int, SpanningArrivals] = dataclasses.field(default_factory=dict)


def describe_op(op: OpSpec) -> str:
    """An op as error messages name it."""
    peer = f" with the rank {op.peer:+d} along {op.family}" if op.is_p2p else f" on {op.family}"
    return f"{op.kind} of {op.nbytes} bytes{peer}"


def check_follows(expected: OpSpec | None, issued: OpSpec | None, iteration: int,
                  rank: int) -> None:
    """:class:`GraphError` unless the real ``rank`` did what its class
    program has next (``expected``; None: the iteration's end): issued
    ``issued``, or ended the iteration (``issued`` None)."""
    if issued is None:
        if expected is not None:
            raise GraphError(
                f"the script does not follow the graph: rank {rank} ended iteration "
                f"{iteration} without issuing {describe_op(expected)}, which the graph has next")
        return
    if expected is None or (expected.kind, expected.family, expected.nbytes,
                            expected.peer) != (issued.kind, issued.family, issued.nbytes,
                                               issued.peer):
        want = "the end of the iteration" if expected is None else describe_op(expected)
        raise GraphError(
            f"the script does not follow the graph: in iteration {iteration} rank "
            f"{rank} issued {describe_op(issued)} where the graph has {want}")
