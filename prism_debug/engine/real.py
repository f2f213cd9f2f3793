"""The real rank's side of the event loop, kept cheap: every collective the
real process issues under a graph takes this path, and what the harness
spends per op and does not take off the emulated clock is a timing error.

The real rank is an element of its class's arrays.  While the rest of its
group agrees (the class's times a scalar, or differing only between groups)
and its arrival is no later than theirs, each of its groups ends when its
peers' would alone: the op is the class's fast path, with the real rank's
arrival kept beside it as a scalar rather than written into an array the
size of the class; a late real rank sets only its groups apart (an array
shaped like a group max).  Ranks that differ inside a group, a perturbed
class or a recorded replay take the full per-rank path (the engine's
Hypothesis properties compare the two).

Several real ranks (:class:`RealRanks`, a job with several real processes,
each holding a replica of the engine): a class with one real rank keeps the
shortcut, a class with more takes the full path with every real arrival
written in, and a class issues only once all its real ranks' arrivals there
are known, so every replica takes the same path whatever order the
arrivals come in.

(``loop`` below is the :class:`~prism_debug.engine.loop.EventLoop`, which
imports this module: :class:`Loop` says what this module asks of it, to keep
the imports one way.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol, overload

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.layout import Layout
from prism_debug.engine.state import ClassState, OpInfo, Plan, RealRank, check_follows
from prism_debug.engine.times import Time, at
from prism_debug.errors import GraphError
from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, OpSpec

# a class program's events, each one's next issue (see next_issues), and the ops they issue
_Issues = tuple[tuple[Event, ...], tuple[int | None, ...], frozenset[int]]


class Loop(Protocol):
    """What the real rank's side asks of the event loop."""

    layout: Layout
    real: RealRank | None  # the local real rank
    multi: RealRanks | None  # several real ranks, or None

    def _now(self, state: ClassState) -> Time: ...

    def group_max(self, state: ClassState, times: NDArray[np.float64], info: OpInfo,
                  op_index: int) -> NDArray[np.float64]: ...

    def _op_cost(self, state: ClassState, op_index: int) -> tuple[Time, float]: ...

    def _queue(self, state: ClassState, family: str, last: Time, cost: Time) -> Time: ...

    def _complete(self, state: ClassState, op_index: int, done: Time,
                  iteration: int | None = None, cause: tuple[int, int] | None = None,
                  slack: float = 0.0, arrival: Time | None = None) -> None: ...


def issue_alone(loop: Loop, state: ClassState, op_index: int, info: OpInfo,
                real: RealRank) -> bool:
    """Complete ``real``'s collective inside its class from the class's
    times (while they agree within its groups) and its arrival, the class's
    only real rank; False (nothing done) when the full per-rank path must
    take it."""
    pending = real.pending
    assert pending is not None, "the loop takes this path for the real rank's issue"
    arrival = pending[1]
    if not info.shared:  # a group of the real rank alone ends at its arrival
        return False
    now = loop._now(state)
    last: Time
    plan: Plan | None
    if type(now) is float:
        peers = last = now
        plan = _plan(loop, real, info.axes, None)
    elif isinstance(now, np.ndarray):
        plan = _plan(loop, real, info.axes, now.shape)
        if plan is None:
            return False
        last = loop.group_max(state, now, info, op_index)
        peers = float(last[plan[0]])
    else:
        return False
    if arrival <= peers:
        pass  # every group's last member is a peer
    elif arrival != arrival:  # NaN
        return False
    elif plan[1] is None:
        last = arrival  # one group, the whole class, and the real rank is its last
    else:
        # The real rank is its groups' last: they end later than the rest
        # of the class's (the groups' last members, shaped like a group max).
        peers_last = last
        last = np.empty(plan[1])
        last[...] = peers_last
        last[plan[2]] = arrival
    real.pending = None
    real.arrivals[op_index] = arrival
    # every other member arrives ``now``: the class's arrivals, but for the
    # real rank's, which last_arrival writes in when asked
    state.arrivals[op_index] = now
    cost, lowest = loop._op_cost(state, op_index)
    loop._complete(state, op_index, loop._queue(state, info.spec.family, last, cost),
                   slack=lowest)
    return True


@overload
def _plan(loop: Loop, real: RealRank, axes: tuple[int, ...], shape: None) -> Plan: ...


@overload
def _plan(loop: Loop, real: RealRank, axes: tuple[int, ...],
          shape: tuple[int, ...]) -> Plan | None: ...


def _plan(loop: Loop, real: RealRank, axes: tuple[int, ...],
          shape: tuple[int, ...] | None) -> Plan | None:
    """For an op on ``axes`` of a class whose times have ``shape`` (None: a
    scalar): where the real rank's group max is in the group maxima, the
    shape of group maxima and the real rank's group in it (None, None: one
    group); None when the real rank's element of the times may be its own
    alone in its group.  (Worked out once per layout.)"""
    key = (axes, shape)
    plans = real.plans
    if key in plans:
        return plans[key]
    index = real.index
    class_shape = loop.layout.class_shape
    plan: Plan | None = None
    if shape is None or (len(shape) == len(class_shape) and any(
            shape[a] == 1 < class_shape[a] for a in axes)):
        reduced = class_shape if shape is None else shape
        at_peers = tuple(0 if a in axes or n == 1 else i
                         for a, (i, n) in enumerate(zip(index, reduced, strict=True)))
        if all(class_shape[a] == 1 for a in range(len(class_shape)) if a not in axes):
            plan = (at_peers, None, None)
        else:
            plan = (at_peers, tuple(1 if a in axes else n for a, n in enumerate(class_shape)),
                    tuple(0 if a in axes else i for a, i in enumerate(index)))
    plans[key] = plan
    return plan


def with_real(arrival: Time, shape: tuple[int, ...], reals: tuple[RealRank, ...],
              op_index: int) -> NDArray[np.float64]:
    """The class's arrivals with its real ranks' written in (the full path)."""
    full = np.empty(shape)
    full[...] = arrival  # (cheaper than np.array(np.broadcast_to(...)))
    for real in reals:
        pending = real.pending
        assert pending is not None, "every real rank of the class issues here"
        full[real.index] = real.arrivals[op_index] = pending[1]
        real.pending = None
    return full


def arrivals_of(state: ClassState, real: RealRank, op_index: int, shape: tuple[int, ...]
                ) -> NDArray[np.float64]:
    """Every member's arrival at one of the real rank's ops, the real rank's included."""
    arrival = state.arrivals[op_index]
    own = real.arrivals.get(op_index)
    if own is None:
        return np.broadcast_to(arrival, shape)
    full = np.empty(shape)
    full[...] = arrival
    full[real.index] = own
    return full


def shared(graph: ExecutionGraph, op: OpSpec) -> bool:
    """Whether an op's groups have more than one member."""
    size = 1
    for axis in graph.family_axes(op.family):
        size *= graph.mesh.shape[axis]
    return size > 1


def next_issues(events: tuple[Event, ...]) -> tuple[int | None, ...]:
    """For each event index, the index of the first issue at or after it
    (None past the last): what the real rank's next op must be."""
    following: list[int | None] = [None] * (len(events) + 1)
    for i in range(len(events) - 1, -1, -1):
        following[i] = i if events[i].action == "issue" else following[i + 1]
    return tuple(following)


def real_peer(graph: ExecutionGraph, rank: int, op: OpSpec) -> int:
    """The real rank's peer in a p2p op (rings inside a class wrap around)."""
    mesh = graph.mesh
    axis = graph.family_axes(op.family)[0]
    coords = list(mesh.coordinates(rank))
    coords[axis] = (coords[axis] + op.peer) % mesh.shape[axis]
    return mesh.rank(coords)


# -- what the event loop does for every real rank -------------------------------------

# How many ended iterations a real class's completions are kept for (an async
# op may be waited for after the next optimizer step: DDP futures).
REAL_DONE_ITERATIONS = 2


def attach_reals(states: list[ClassState], real: RealRank | None,
                 multi: RealRanks | None) -> None:
    """Tell each class its real ranks (``multi`` holds several, else ``real``
    is the one, if any)."""
    if multi is not None:
        multi.states = states
        for class_id, reals in multi.by_class.items():
            states[class_id].reals = reals
    elif real is not None:
        states[real.class_id].reals = (real,)


def relayout_reals(loop: Loop, column_map: Callable[[Time], Time] | None) -> None:
    """The layout changed: re-lay out what the real ranks hold (``column_map``
    None: held arrays stay valid) and find their elements again."""
    reals = ([] if loop.real is None else [loop.real]) if loop.multi is None \
        else list(loop.multi.by_rank.values())
    if column_map is not None:
        # a class's real ranks share one ``done``
        mapped: dict[int, dict[tuple[int, int], Time]] = {}
        for real in reals:
            done = mapped.get(id(real.done))
            if done is None:
                done = mapped[id(real.done)] = {k: column_map(v) for k, v in real.done.items()}
            real.done = done
            real.spanning = {k: (column_map(full), axes, unsampled)
                             for k, (full, axes, unsampled) in real.spanning.items()}
    for real in reals:
        real.index = loop.layout.internal_coordinates(real.rank)
        real.plans.clear()


def end_real_iteration(state: ClassState, reals: tuple[RealRank, ...],
                       multi: RealRanks | None) -> None:
    """A class with real ranks (``reals``, its own) ended an iteration
    (``state.iteration`` is the next one): keep its completions a while,
    forget the rest."""
    ended = state.iteration - 1
    done = {k: v for k, v in reals[0].done.items() if k[0] >= ended - REAL_DONE_ITERATIONS}
    done.update(((ended, op), d) for op, d in state.done.items())
    for real in reals:
        real.allowed = -1
        real.last.clear()
        real.spanning.clear()
        real.arrivals.clear()
        real.done = done
    if multi is not None:
        multi.forget(reals, ended)


class RealRanks:
    """Several real ranks (``len(R) > 1``): every replica holds every real
    rank, its own (``local``, driven by real_issue) and its peers' (fed by
    peer_issue), and treats them alike, so that replicas fed the same
    arrivals in any order compute the same timeline to the last bit.

    A class with real ranks issues an op only once every one of them has
    arrived there, and ends an iteration only once every one of them has
    ended it; other events (waits, compute) it runs as soon as it can.  Each
    rank's arrivals wait here, keyed ``(iteration, op index)``, until its
    class takes them.  ``seed`` keys the engine's draws by (class,
    iteration, stream) so that they do not depend on when a replica makes
    them (:mod:`.gaps`).

    What else keeps replicas bit-identical: the class's shortcut
    (:func:`issue_alone`) only for a class with one real rank, the same on
    every replica; a ``slow`` window added for an iteration no class reached
    settles no pending compute (a factor is fixed per class and iteration);
    a ``delay``/``fail`` window sends a class down the per-rank path only in
    the iterations it covers, not from when it was added.  Windows must then
    be added before any class reaches their first iteration (the caller
    picks it ahead: §2.4 of the design)."""

    def __init__(self, graph: ExecutionGraph, ranks: Sequence[int], local: int,
                 seed: int) -> None:
        self.graph = graph
        self.seed = seed
        self.by_rank = {r: RealRank(r, graph.class_of(r)) for r in ranks}
        self.local = self.by_rank[local]
        by_class: dict[int, list[RealRank]] = {}
        for real in self.by_rank.values():
            by_class.setdefault(real.class_id, []).append(real)
        self.by_class = {c: tuple(reals) for c, reals in sorted(by_class.items())}
        for reals in self.by_class.values():
            done: dict[tuple[int, int], Time] = {}  # one class, one timeline of completions
            for real in reals:
                real.done = done
        self.states: list[ClassState] = []  # the event loop's, once it has them
        self._arrivals: dict[int, dict[tuple[int, int], float]] = {r: {} for r in ranks}
        self._ended: dict[int, set[int]] = {r: set() for r in ranks}
        # the local rank's place in its program: its iteration, and the event
        # index its next issue is looked for from
        self.iteration = 1
        self.pc = 0
        self._issues: dict[int, _Issues] = {}  # id(events) -> (events, next_issues, issued ops)

    # -- what the event loop asks ---------------------------------------------------------

    def ready(self, state: ClassState, reals: tuple[RealRank, ...]) -> bool:
        """Whether the class (its real ranks ``reals``) may take its next
        event: an issue once every real rank of the class arrived there (their
        ``pending`` then set), an iteration's end once every one ended it."""
        event = state.events[state.pc]
        if event.action == "issue":
            key = (state.iteration, event.op)
            arrivals = [self._arrivals[real.rank].get(key) for real in reals]
            known = [arrival for arrival in arrivals if arrival is not None]
            if len(known) < len(arrivals):
                return False
            for real, arrival in zip(reals, known, strict=True):
                real.pending = (state.pc, arrival)
        if event.action == "end" or state.pc == len(state.events) - 1:
            return all(state.iteration in self._ended[real.rank] for real in reals)
        return True

    def slowest(self) -> int:
        """The iteration of the real class furthest behind (virtual classes
        run at most one iteration ahead of it)."""
        return min(self.states[c].iteration for c in self.by_class)

    def forget(self, reals: tuple[RealRank, ...], ended: int) -> None:
        for real in reals:
            arrivals = self._arrivals[real.rank]
            for key in [k for k in arrivals if k[0] <= ended]:
                del arrivals[key]
            self._ended[real.rank].discard(ended)

    # -- what the replay engine feeds -----------------------------------------------------

    def local_issue(self, spec: OpSpec, arrival: float) -> tuple[int, int]:
        """The local rank issues its next op: its (iteration, op index)."""
        program = self.graph.programs[self.local.class_id]
        events, following, _ = self._program_at(program, self.iteration)
        index = following[self.pc]
        expected = program.ops[events[index].op] if index is not None else None
        check_follows(expected, spec, self.iteration, self.local.rank)
        assert index is not None, "check_follows refuses an issue the program does not have"
        self.pc = index + 1
        handle = (self.iteration, events[index].op)
        self._arrivals[self.local.rank][handle] = float(arrival)
        return handle

    def local_iteration_end(self) -> None:
        program = self.graph.programs[self.local.class_id]
        events, following, _ = self._program_at(program, self.iteration)
        skipped = following[self.pc]
        check_follows(None if skipped is None else program.ops[events[skipped].op], None,
                      self.iteration, self.local.rank)
        self._ended[self.local.rank].add(self.iteration)
        self.iteration += 1
        self.pc = 0

    def peer_issue(self, rank: int, iteration: int, op_index: int, arrival: float) -> None:
        real = self._peer(rank)
        program = self.graph.programs[real.class_id]
        if iteration < 1 or op_index not in self._program_at(program, iteration)[2]:
            raise GraphError(f"rank {rank} cannot issue op {op_index} in iteration {iteration}: "
                             f"its class program issues no such op")
        arrival = float(arrival)
        key = (iteration, op_index)
        if iteration < self.states[real.class_id].iteration:
            return  # its class took it already: a repeat
        known = self._arrivals[rank].setdefault(key, arrival)
        if known.hex() != arrival.hex():
            raise GraphError(f"rank {rank}'s arrival at op {op_index} of iteration {iteration} "
                             f"came twice: {known!r}, then {arrival!r}")

    def peer_iteration_end(self, rank: int, iteration: int) -> None:
        real = self._peer(rank)
        if iteration < 1:
            raise GraphError(f"iterations count from 1, got {iteration}")
        if iteration >= self.states[real.class_id].iteration:
            self._ended[rank].add(iteration)

    def _peer(self, rank: int) -> RealRank:
        real = self.by_rank.get(rank)
        if real is None or real is self.local:
            raise GraphError(f"rank {rank} is not a peer real rank of this engine (real ranks "
                             f"{sorted(self.by_rank)}, this one {self.local.rank})")
        return real

    def _program_at(self, program: ClassProgram, iteration: int) -> _Issues:
        events = program.events(iteration)
        found = self._issues.get(id(events))
        if found is None or found[0] is not events:
            found = self._issues[id(events)] = (
                events, next_issues(events),
                frozenset(e.op for e in events if e.action == "issue"))
        return found

    # -- what the replay engine answers ---------------------------------------------------

    def completion(self, rank: int, iteration: int, op_index: int,
                   shape: tuple[int, ...]) -> float:
        """When a real rank's op completes, inf while not known (yet)."""
        real = self.by_rank[rank]
        state = self.states[real.class_id]
        done = state.done.get(op_index) if state.iteration == iteration \
            else real.done.get((iteration, op_index))
        if done is None:
            return math.inf
        return done if type(done) is float else at(done, real.index, shape)
