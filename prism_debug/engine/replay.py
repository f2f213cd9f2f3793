"""The replay engine: every virtual peer of the world, replayed from the graph.

Pure core (numpy; no torch).  Ranks of one class run one program, so a class
advances event by event as a unit while its ranks' *times* may differ: a
class's time is a scalar while all its ranks agree (the fast path: an
unperturbed class costs the same at 65,536 ranks as at 8) and an array shaped
like the class's slice of the mesh once anything sets them apart.  A group op
then completes at the max of its members' arrivals over the family's mesh
axes, plus the cost model's time; point-to-point ops complete at
max(send, recv) + cost.  Ops whose groups span classes (pipeline p2p, a
world all-reduce) wait until every class involved has issued its matching op.

The real rank, when there is one, is an element of its class's arrays whose
arrivals come from the real process (:meth:`real_issue`): its class is held
at the real rank's position, so a late real rank delays its groups and
everything downstream, as in the full-size job.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from prism_debug.cost import Placement
from prism_debug.graph.execution import Event, ExecutionGraph, GraphError, OpSpec

Time = float | np.ndarray
CostFn = Callable[[OpSpec, Placement], float]

# How many ended iterations the real rank's completions are kept for.
_REAL_DONE_ITERATIONS = 2


@dataclasses.dataclass(eq=False)
class _Perturbation:
    kind: str  # "slow", "delay", "fail"
    mask: np.ndarray  # mesh-shaped bool: the ranks it applies to
    value: float  # factor (slow) or seconds (delay)
    first_iteration: int = 1
    last_iteration: float = math.inf
    family: str | None = None  # delay, fail: only ops on this family
    # Op-level bounds, as (iteration, op): the op counts the class's ops
    # issued in that iteration from 0.  A window covers the ops from
    # (first_iteration, first_op) to (last_iteration, last_op), both included.
    first_op: int = 0
    last_op: float = math.inf
    parts: dict = dataclasses.field(default_factory=dict)  # class id -> its mask, internal order

    def covers(self, iteration: int, op: int) -> bool:
        return ((iteration, op) >= (self.first_iteration, self.first_op)
                and (iteration, op) <= (self.last_iteration, self.last_op))


@dataclasses.dataclass(eq=False)
class _LinkPerturbation:
    nodes: frozenset[int]
    bandwidth_factor: float  # cost is divided by it
    added_latency_s: float
    first_iteration: int = 1
    last_iteration: float = math.inf
    # intermittent: degraded for ``duty`` of every ``period_s`` of emulated time
    period_s: float | None = None
    duty: float = 1.0

    def active(self, iteration: int, now: float) -> bool:
        if not self.first_iteration <= iteration <= self.last_iteration:
            return False
        return self.period_s is None or (now % self.period_s) < self.duty * self.period_s


@dataclasses.dataclass
class OpRecord:
    """One op of one class in one iteration, for traces and tests."""

    class_id: int
    iteration: int
    op: int
    arrival: Time
    done: Time
    # the op whose arrival set ``done``, as (class id, op index): the class's
    # own op for a group inside the class, else the latest class or p2p side
    cause: tuple[int, int] | None = None


@dataclasses.dataclass(frozen=True)
class _OpInfo:
    """What the event loop needs of one op, worked out once."""

    spec: OpSpec
    axes: tuple[int, ...]  # the family's axes in a class array
    spans_classes: bool
    local: bool  # a collective inside the class: the fast path applies


class _ClassState:
    def __init__(self, program, index: tuple) -> None:
        self.program = program
        self.ops: tuple[_OpInfo, ...] = ()
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
        self.gap_applied = False
        self.arrivals: dict[int, Time] = {}
        self.done: dict[int, Time] = {}
        self.sequence: dict[tuple, int] = {}  # rendezvous counters, per iteration
        self.iteration_starts: list[Time] = [0.0]
        self.factor: Time | None = None  # compute factor this iteration (None: not computed)
        self.factor_max: dict[str, Time] = {}  # its max over each family's axes
        self.factor_top: float | None = None  # its max over the class
        # per completed op, a time it surely ends after each member's arrival
        self.slack: dict[int, float] = {}

    def next_sequence(self, key: tuple) -> int:
        n = self.sequence.get(key, 0)
        self.sequence[key] = n + 1
        return n


class ReplayEngine:
    def __init__(self, graph: ExecutionGraph, cost: CostFn, *, real_rank: int | None = None,
                 record: bool = False, compress: bool = True) -> None:
        self.graph = graph
        self.mesh = graph.mesh
        self._cost = cost
        self.record = record
        self.records: list[OpRecord] = []
        self._class_axis = self.mesh.axis(graph.class_axis) if graph.class_axis else None
        # class-array axes (mesh axes off the class axis), smallest first
        self._order = sorted((a for a in range(len(self.mesh.shape)) if a != self._class_axis),
                             key=lambda a: (self.mesh.shape[a], a))
        # Column compression.  A *column* fixes a coordinate on the largest
        # class-array axis (dp, usually).  Every family either varies that whole
        # axis or stays inside a column, so columns no perturbation touches
        # (nor the real rank) have identical times throughout: class arrays
        # keep one column for all of them.  Off when
        # point-to-point ops travel along the axis (they would tell columns apart).
        self._columns_axis = self._order[-1] if self._order and compress else None
        if self._columns_axis is not None and any(
                op.is_p2p and self._columns_axis in graph.family_axes(op.family)
                for program in graph.programs for op in program.ops):
            self._columns_axis = None
        self._explicit: list[int] = []  # coordinates kept apart, in array order
        self._picked = np.arange(0)  # array column -> a coordinate it stands for
        self._position = np.arange(0)  # coordinate -> array column
        self._states = [_ClassState(p, self._class_index(p.class_id)) for p in graph.programs]
        for state in self._states:
            state.ops = tuple(self._op_info(op) for op in state.program.ops)
        self._perturbations: list[_Perturbation] = []
        self._kinds: set[str] = set()  # kinds present, so the common case skips the scan
        self._arrivals_perturbed = False  # a delay or fail exists: form per-rank arrivals
        self._links: list[_LinkPerturbation] = []
        # a link whose state changes with time or iteration: op costs are not kept
        self._volatile_links = False
        self._rendezvous: dict[tuple, dict[int, tuple[int, Time]]] = {}
        self._placements: dict[tuple, Placement] = {}
        self._costs: dict[tuple[int, int], tuple[Time, float]] = {}  # (class, op) -> cost, min
        self.real_rank = real_rank
        self._real_class: int | None = None
        self._real_index: tuple | None = None
        self._real_allowed = -1  # the real class may run up to this event index
        self._real_pending: tuple[int, float] | None = None
        # Completions of the real rank's ops, kept past their iteration's end: an
        # async op may be waited for after the next optimizer step (DDP futures).
        self._real_done: dict[tuple[int, int], Time] = {}
        # Who arrived last at the real rank's ops whose groups span classes
        # (the arrivals of every class, kept until asked) or pair with a peer.
        self._real_last: dict[int, tuple] = {}
        if real_rank is not None:
            if not 0 <= real_rank < self.mesh.world_size:
                raise GraphError(f"rank {real_rank} is outside the graph's world of "
                                 f"{self.mesh.world_size}")
            self._real_class = graph.class_of(real_rank)
        self._set_columns(self._mask([] if real_rank is None else [real_rank]))

    # -- set-up ------------------------------------------------------------------

    def _class_index(self, class_id: int) -> tuple:
        """Selects a class's slice of a mesh-shaped array."""
        if self._class_axis is None:
            return ()
        return (slice(None),) * self._class_axis + (class_id,)

    def _class_local_axes(self) -> list[int]:
        return [a for a in range(len(self.mesh.shape)) if a != self._class_axis]

    @property
    def class_shape(self) -> tuple[int, ...]:
        """Shape of a class's time arrays, in the engine's internal axis order."""
        shape = [self.mesh.shape[a] for a in self._order]
        if self._columns_axis is not None:
            shape[-1] = len(self._picked)
        return tuple(shape)

    def _internal(self, sliced: np.ndarray) -> np.ndarray:
        """A class's slice of a mesh-shaped array, in the internal axis order
        and with its columns compressed.

        Class arrays keep their axes sorted by size, the largest last: numpy
        reduces over a short *leading* axis ~20x faster than over a short
        trailing one, and group ops reduce over short axes (tp) most often.
        """
        local = self._class_local_axes()
        if not sliced.ndim:
            return sliced
        internal = sliced.transpose([local.index(a) for a in self._order])
        if self._columns_axis is not None and internal.shape[-1] > 1:
            internal = internal[..., self._picked]
        # contiguous, or every array computed from it keeps the old memory order
        return np.ascontiguousarray(internal)

    def _external(self, times: Time) -> Time:
        """Internal-order times back in mesh order and every column (for records)."""
        if not isinstance(times, np.ndarray) or not times.ndim:
            return times
        if self._columns_axis is not None and times.shape[-1] > 1:
            times = times[..., self._position]
        local = self._class_local_axes()
        return times.transpose([self._order.index(a) for a in local])

    def _set_columns(self, mask: np.ndarray) -> None:
        """Keep the columns of the ranks in ``mask`` (mesh-shaped) apart from
        the untouched ones, re-laying out every time array the engine holds."""
        if self._columns_axis is None:
            if self.real_rank is not None:
                self._real_index = self._internal_coordinates(self.real_rank)
            return
        axis = self._columns_axis
        touched = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)))
        new = sorted(set(self._explicit) | set(touched.tolist()))
        if new == self._explicit and len(self._picked):
            return
        size = self.mesh.shape[axis]
        kept = set(new)
        # The untouched columns share the column of the first of them.  Array
        # columns stay in coordinate order, so argmax breaks ties (who arrived
        # last) as it would over every column.
        clean = next((c for c in range(size) if c not in kept), None)
        picked = np.array(sorted(new + ([clean] if clean is not None else [])), dtype=np.int64)
        position = np.searchsorted(picked, np.arange(size))
        if clean is not None:
            untouched = np.ones(size, dtype=bool)
            untouched[new] = False
            position[untouched] = int(np.searchsorted(picked, clean))
        old_width = len(self._picked)
        take = self._position[picked] if old_width else None
        self._explicit, self._picked, self._position = new, picked, position
        # (arrays one column wide broadcast: the value holds for every column)
        if take is not None and old_width > 1:
            self._relayout(lambda times: times[..., take]
                           if isinstance(times, np.ndarray) and times.ndim
                           and times.shape[-1] == old_width else times)
        if self.real_rank is not None:
            self._real_index = self._internal_coordinates(self.real_rank)

    def _relayout(self, column_map: Callable[[Time], Time]) -> None:
        """Apply ``column_map`` to every time array the engine holds."""
        for state in self._states:
            state.t = column_map(state.t)
            state.arrivals = {k: column_map(v) for k, v in state.arrivals.items()}
            state.done = {k: column_map(v) for k, v in state.done.items()}
            state.iteration_starts = [column_map(v) for v in state.iteration_starts]
            state.factor = None
            state.factor_max.clear()
            state.factor_top = None
        for waiting in self._rendezvous.values():
            for key, entry in waiting.items():
                waiting[key] = tuple(column_map(v) for v in entry)
        self._real_done = {k: column_map(v) for k, v in self._real_done.items()}
        self._real_last = {k: (column_map(v[0]), v[1]) if isinstance(v[0], np.ndarray) else v
                           for k, v in self._real_last.items()}
        for p in self._perturbations:
            p.parts.clear()
        self._costs.clear()

    def _local_axes(self, family: str) -> tuple[int, ...]:
        """The family's axes as axes of a class array (the class axis removed)."""
        return tuple(sorted(self._order.index(a) for a in self.graph.family_axes(family)
                            if a != self._class_axis))

    def _internal_coordinates(self, rank: int) -> tuple[int, ...]:
        coords = self.mesh.coordinates(rank)
        internal = [coords[a] for a in self._order]
        if self._columns_axis is not None:
            internal[-1] = int(self._position[internal[-1]])
        return tuple(internal)

    def _op_info(self, op: OpSpec) -> _OpInfo:
        spans = self._spans_classes(op.family)
        return _OpInfo(op, self._local_axes(op.family), spans, not op.is_p2p and not spans)

    def _spans_classes(self, family: str) -> bool:
        return self._class_axis is not None and self._class_axis in self.graph.family_axes(family)

    def _nodes(self) -> np.ndarray:
        """Each rank's node, mesh-shaped."""
        return np.arange(self.mesh.world_size).reshape(self.mesh.shape) // self.graph.gpus_per_node

    def _mask(self, ranks) -> np.ndarray:
        mask = np.zeros(self.mesh.world_size, dtype=bool)
        mask[np.asarray(list(ranks), dtype=np.int64)] = True
        return mask.reshape(self.mesh.shape)

    # -- the perturbation interface (driven by fault injection) -----------------------

    # Each call returns a handle that :meth:`remove` takes back.  Removing
    # stops a perturbation's effect from the next event on; what it already did
    # stays done (an op a failed peer missed stays missed).

    def slow(self, ranks, factor: float, *, first_iteration: int = 1,
             iterations: float = math.inf) -> object:
        """Multiply the compute of ``ranks`` by ``factor`` (stragglers, a hot node)."""
        if factor <= 0:
            raise ValueError(f"a compute factor must be positive, got {factor}")
        self._kinds.add("slow")
        mask = self._mask(ranks)
        self._set_columns(mask)
        self._settle_compute()
        perturbation = _Perturbation(
            "slow", mask, factor, first_iteration, first_iteration + iterations - 1)
        self._perturbations.append(perturbation)
        return perturbation

    def _settle_compute(self) -> None:
        """Compute done so far ran at the old factors: bring every class's
        times up to date before the factors change."""
        for state in self._states:
            if state.pending:
                # compute already done ran at the old factor: settle it first
                state.t = self._now(state)
                state.pending = 0.0
                state.epoch += 1
            state.factor = None  # recomputed with the new factors at the next event
            state.factor_max.clear()
            state.factor_top = None

    def delay(self, ranks, seconds: float, *, family: str | None = None,
              first_iteration: int = 1, iterations: float = math.inf,
              first_op: int = 0, ops: float = math.inf) -> object:
        """Delay the arrival of ``ranks`` at every op (of ``family``) by
        ``seconds``; ``first_op``/``ops`` bound it to ops of the first
        iteration (a stall at one collective: ``iterations=1, ops=1``)."""
        if seconds < 0:
            raise ValueError(f"a delay cannot be negative, got {seconds}")
        return self._arrival_perturbation("delay", ranks, seconds, family, first_iteration,
                                          iterations, first_op, ops)

    def fail(self, ranks, *, at_iteration: int = 1, at_op: int = 0,
             family: str | None = None) -> object:
        """From op ``at_op`` of ``at_iteration`` on (ops of ``family``, when
        given), ``ranks`` never arrive: a fail-stop, a hang, or a collective
        they issue differently (a desync), which no peer can complete."""
        return self._arrival_perturbation("fail", ranks, math.inf, family, at_iteration,
                                          math.inf, at_op, math.inf)

    def _arrival_perturbation(self, kind, ranks, value, family, first_iteration, iterations,
                              first_op, ops) -> _Perturbation:
        if first_iteration < 1 or first_op < 0:
            raise ValueError(f"iterations count from 1 and ops from 0, got iteration "
                             f"{first_iteration} op {first_op}")
        self._kinds.add(kind)
        self._arrivals_perturbed = True
        mask = self._mask(ranks)
        self._set_columns(mask)
        last_op = first_op + ops - 1 if iterations == 1 else math.inf
        perturbation = _Perturbation(kind, mask, value, first_iteration,
                                     first_iteration + iterations - 1, family, first_op, last_op)
        self._perturbations.append(perturbation)
        return perturbation

    def link(self, nodes, *, bandwidth_factor: float = 1.0, added_latency_s: float = 0.0,
             first_iteration: int = 1, iterations: float = math.inf,
             period_s: float | None = None, duty: float = 1.0) -> object:
        """Degrade collectives whose groups span any of ``nodes``: cost divided
        by ``bandwidth_factor`` plus ``added_latency_s``; with ``period_s``,
        only during the first ``duty`` of every period (a flapping link)."""
        if bandwidth_factor <= 0:
            raise ValueError(f"a bandwidth factor must be positive, got {bandwidth_factor}")
        if period_s is not None and not (period_s > 0 and 0 < duty <= 1):
            raise ValueError(f"an intermittent link needs period_s > 0 and 0 < duty <= 1, "
                             f"got {period_s} and {duty}")
        link = _LinkPerturbation(frozenset(nodes), bandwidth_factor, added_latency_s,
                                 first_iteration, first_iteration + iterations - 1, period_s, duty)
        self._links.append(link)
        self._links_changed()
        self._set_columns(np.isin(self._nodes(), list(nodes)))
        return link

    def _links_changed(self) -> None:
        self._volatile_links = any(link.period_s is not None or link.first_iteration > 1
                                   or link.last_iteration < math.inf for link in self._links)
        self._costs.clear()

    def remove(self, handle: object) -> None:
        """Take back a perturbation (a handle from slow, delay, fail or link)."""
        if isinstance(handle, _LinkPerturbation) and handle in self._links:
            self._links.remove(handle)
            self._links_changed()
        elif isinstance(handle, _Perturbation) and handle in self._perturbations:
            if handle.kind == "slow":
                self._settle_compute()
            self._perturbations.remove(handle)
            self._kinds = {p.kind for p in self._perturbations}
            self._arrivals_perturbed = bool(self._kinds & {"delay", "fail"})
        else:
            raise ValueError("no such perturbation (removed already?)")

    def clear(self) -> None:
        """Take back every perturbation."""
        for handle in [*self._perturbations, *self._links]:
            self.remove(handle)

    def _active(self, kind: str, state: _ClassState, family: str | None = None):
        if kind not in self._kinds:
            return
        for p in self._perturbations:
            if (p.kind == kind and p.covers(state.iteration, state.issued)
                    and (p.family is None or p.family == family)):
                part = p.parts.get(state.program.class_id)
                if part is None:
                    part = p.parts[state.program.class_id] = self._internal(
                        p.mask[state.index] if state.index else p.mask)
                if part.any():
                    yield p, part

    # -- the real rank ---------------------------------------------------------------

    def real_issue(self, spec: OpSpec, arrival: float) -> tuple[int, int]:
        """The real rank issues its next op at ``arrival``; returns a handle for
        :meth:`real_completion`.  The op must be the next one its class
        program issues, or :class:`GraphError` names the first mismatch."""
        state = self._states[self._real_class]
        events = state.program.events(state.iteration)
        index = next((i for i in range(max(state.pc, self._real_allowed + 1), len(events))
                      if events[i].action == "issue"), None)
        expected = state.program.ops[events[index].op] if index is not None else None
        if expected is None or (expected.kind, expected.family, expected.nbytes,
                                expected.peer) != (spec.kind, spec.family, spec.nbytes, spec.peer):
            want = "the end of the iteration" if expected is None else _describe(expected)
            raise GraphError(
                f"the script does not follow the graph: in iteration {state.iteration} rank "
                f"{self.real_rank} issued {_describe(spec)} where the graph has {want}")
        self._real_allowed = index
        self._real_pending = (index, arrival)
        self._advance()
        return state.iteration, events[index].op

    def real_completion(self, handle: tuple[int, int]) -> float:
        """When the real rank's op completes: inf while it cannot yet (its peers
        have not issued their side, or never will: a failed peer)."""
        iteration, op = handle
        state = self._states[self._real_class]
        self._advance()
        done = state.done.get(op) if state.iteration == iteration else \
            self._real_done.get(handle)
        if done is None:
            return math.inf
        return _at(done, self._real_index, self.class_shape)

    def last_arrival(self, handle: tuple[int, int]) -> tuple[int, float] | None:
        """Who arrived last at one of the real rank's ops, and when (None once
        its iteration is over).  For p2p it is the peer; for a group op the
        member of the real rank's group with the latest arrival."""
        iteration, op_index = handle
        state = self._states[self._real_class]
        info = state.ops[op_index]
        if state.iteration != iteration or op_index not in state.arrivals:
            return None
        if info.spec.is_p2p:
            return self._real_last.get(op_index)
        if info.spans_classes:
            found = self._real_last.get(op_index)
            if found is None:
                return None
            full, axes = found
            # the class axis leads ``full``; the group varies it and ``axes``
            index = [slice(None), *self._real_index]
            for axis in axes:
                index[1 + axis] = slice(None)
            group = np.broadcast_to(full, (len(self._states), *self.class_shape))[tuple(index)]
            offsets = np.unravel_index(int(np.argmax(group)), group.shape)
            coords = list(self._real_index)
            for axis, offset in zip(axes, offsets[1:]):
                coords[axis] = int(offset)
            return self._rank_of(self._states[int(offsets[0])], coords), float(group.max())
        arrival = np.broadcast_to(state.arrivals[op_index], self.class_shape)
        index = list(self._real_index)
        for axis in info.axes:
            index[axis] = slice(None)
        group = arrival[tuple(index)]
        offsets = np.unravel_index(int(np.argmax(group)), group.shape)
        coords = list(self._real_index)
        for axis, offset in zip(info.axes, offsets):
            coords[axis] = int(offset)
        return self._rank_of(state, coords), float(group.max())

    def _peer_rank(self, op: OpSpec) -> int:
        """The real rank's peer in a p2p op (rings inside a class wrap around)."""
        axis = self.graph.family_axes(op.family)[0]
        coords = list(self.mesh.coordinates(self.real_rank))
        coords[axis] = (coords[axis] + op.peer) % self.mesh.shape[axis]
        return self.mesh.rank(coords)

    def real_op(self, handle: tuple[int, int]) -> OpSpec:
        return self._states[self._real_class].program.ops[handle[1]]

    def _rank_of(self, state: _ClassState, internal_coords) -> int:
        coords = list(self.mesh.coordinates(self.real_rank if self.real_rank is not None else 0))
        for axis, value in zip(self._order, internal_coords):
            coords[axis] = value
        if self._columns_axis is not None:
            coords[self._columns_axis] = int(self._picked[coords[self._columns_axis]])
        if self._class_axis is not None:
            coords[self._class_axis] = state.program.class_id
        return self.mesh.rank(coords)

    def ops_of(self, rank: int, iteration: int) -> list[tuple[OpSpec, float, float]]:
        """(op, arrival, done) of ``rank`` in ``iteration``, from the records
        (``record=True``): what the trace shows of a virtual rank."""
        ops = self._states[self.graph.class_of(rank)].program.ops
        return [(ops[index], arrival, done)
                for index, (arrival, done, _) in self.op_times(rank, iteration).items()]

    def op_times(self, rank: int, iteration: int) -> dict[int, tuple[float, float, tuple]]:
        """Op index -> (arrival, done, cause) of ``rank`` in ``iteration``, from
        the records (``record=True``); ``cause`` is :attr:`OpRecord.cause`."""
        class_id = self.graph.class_of(rank)
        coords = list(self.mesh.coordinates(rank))
        if self._class_axis is not None:
            del coords[self._class_axis]
        local_shape = tuple(self.mesh.shape[a] for a in self._class_local_axes())
        return {record.op: (_at(record.arrival, tuple(coords), local_shape),
                            _at(record.done, tuple(coords), local_shape), record.cause)
                for record in self.records
                if record.class_id == class_id and record.iteration == iteration
                and record.arrival is not None}

    def forget_records(self, before_iteration: int) -> None:
        self.records = [r for r in self.records if r.iteration >= before_iteration]

    def real_iteration_end(self) -> None:
        """The real rank finished an iteration: its class may run to the end."""
        state = self._states[self._real_class]
        events = state.program.events(state.iteration)
        skipped = next((e for e in events[max(state.pc, self._real_allowed + 1):]
                        if e.action == "issue"), None)
        if skipped is not None:
            raise GraphError(
                f"the script does not follow the graph: rank {self.real_rank} ended iteration "
                f"{state.iteration} without issuing {_describe(state.program.ops[skipped.op])}, "
                "which the graph has next")
        self._real_allowed = len(events) - 1
        self._advance()
        self._real_allowed = -1

    # -- pure replay -------------------------------------------------------------------

    def run(self, iterations: int) -> None:
        """Replay until every class has finished ``iterations`` iterations."""
        if self.real_rank is not None:
            raise GraphError("run() replays the whole world; this engine follows a real rank")
        self._target = iterations
        self._advance()
        stuck = [s.program.class_id for s in self._states if s.iteration <= iterations]
        if stuck:
            raise GraphError(f"the replay cannot progress: classes {stuck} wait on ops no "
                             f"other class issues (the programs do not match)")

    def describe(self, rank: int) -> dict:
        """What the engine knows of one rank: its class, place in the mesh and
        on the nodes, its last finished iteration, and what perturbs it."""
        coords = self.mesh.coordinates(rank)
        node = rank // self.graph.gpus_per_node
        perturbations = []
        for p in self._perturbations:
            if p.mask[coords]:
                span = (f"from iteration {p.first_iteration}" if p.last_iteration == math.inf
                        else f"iterations {p.first_iteration}-{p.last_iteration:g}")
                if p.first_op:
                    span += f" (op {p.first_op + 1} on)"
                what = {"slow": f"slow x{p.value:g}", "delay": f"delay {p.value * 1e3:g} ms",
                        "fail": "never arrives"}[p.kind] + (f" on {p.family}" if p.family else "")
                perturbations.append(f"{what} {span}")
        for link in self._links:
            if node in link.nodes:
                flapping = (f" for {link.duty:g} of every {link.period_s:g} s"
                            if link.period_s is not None else "")
                perturbations.append(f"link x{link.bandwidth_factor:g} bandwidth "
                                     f"+{link.added_latency_s * 1e6:g} us{flapping}")
        times = self.iteration_times(rank)
        return {"rank": rank, "node": node, "class": self.graph.class_of(rank),
                "coords": dict(zip(self.mesh.names, coords)),
                "time_ms": times[-1] * 1e3 if times else None,
                "perturbations": perturbations}

    def iteration_starts(self, rank: int) -> list[float]:
        """When each iteration of ``rank`` began, and when its last finished one ended."""
        state = self._states[self.graph.class_of(rank)]
        coords = self._internal_coordinates(rank)
        return [_at(s, coords, self.class_shape) for s in state.iteration_starts]

    def iteration_times(self, rank: int) -> list[float]:
        """Durations of the finished iterations of ``rank``."""
        starts = self.iteration_starts(rank)
        return [b - a for a, b in zip(starts, starts[1:])]

    # -- the event loop --------------------------------------------------------------------

    _target = math.inf

    def _advance(self) -> None:
        progress = True
        while progress:
            progress = False
            for state in self._states:
                while self._step(state):
                    progress = True

    def _step(self, state: _ClassState) -> bool:
        if state.iteration > self._target:
            return False
        events = state.program.events(state.iteration)
        is_real = state.program.class_id == self._real_class
        if is_real and state.pc > self._real_allowed:
            return False
        if (self._real_class is not None and not is_real
                and state.iteration > self._states[self._real_class].iteration + 1):
            # a class that never blocks (an isend nobody waits for) would run on
            # forever: nothing the real rank does now needs it further ahead
            return False
        event = events[state.pc]
        if not state.gap_applied:
            state.pending += event.gap_s
            state.gap_clock += event.gap_s
            state.gap_applied = True
        if event.action == "wait":
            done = state.done.get(event.op)
            if done is None:
                return False
            epoch, clock = state.issued_at[event.op]
            if epoch == state.epoch and (state.gap_clock - clock) * self._factor_top(state) \
                    <= state.slack[event.op]:
                # Every rank is back from computing before the op ends: since the
                # issue the ranks computed (state.gap_clock - clock) × factor at
                # most, and the op ends at least its own time after each one's
                # arrival.  (``done`` keeps its narrow shape, and the next ops the
                # fast path.)
                state.t = done
            else:
                state.t = _maximum(self._now(state), done)
            state.pending = 0.0
            state.epoch += 1
        elif event.action == "issue":
            self._issue(state, event, is_real)
        state.gap_applied = False
        state.pc += 1
        if event.action == "end" or state.pc == len(events):
            self._end_iteration(state)
        return True

    def _factor(self, state: _ClassState) -> Time:
        if state.factor is None:  # once per class and iteration, not per event
            factor: Time = 1.0
            for p, part in self._active("slow", state):
                factor = factor * np.where(part, p.value, 1.0)
            state.factor = factor
        return state.factor

    def _factor_top(self, state: _ClassState) -> float:
        """The class's largest compute factor this iteration."""
        if state.factor_top is None:
            factor = self._factor(state)
            state.factor_top = float(factor.max()) if isinstance(factor, np.ndarray) else factor
        return state.factor_top

    def _now(self, state: _ClassState) -> Time:
        """The class's times now (full per-rank detail where ranks differ)."""
        if not state.pending:
            return state.t
        return state.t + state.pending * self._factor(state)

    def _end_iteration(self, state: _ClassState) -> None:
        state.t = _squeeze(self._now(state))  # back to the fast path once ranks agree
        state.pending = 0.0
        state.gap_clock = 0.0
        state.epoch += 1
        state.iteration += 1
        state.pc = 0
        state.issued = 0
        state.arrivals.clear()
        state.issued_at.clear()
        state.sequence.clear()
        state.factor = None
        state.factor_max.clear()
        state.factor_top = None
        state.slack.clear()
        state.iteration_starts.append(state.t)
        if state.program.class_id == self._real_class:
            self._real_allowed = -1
            self._real_last.clear()
            ended = state.iteration - 1
            self._real_done = {k: v for k, v in self._real_done.items()
                               if k[0] >= ended - _REAL_DONE_ITERATIONS}
            self._real_done.update(((ended, op), done) for op, done in state.done.items())
        state.done.clear()

    # -- ops ---------------------------------------------------------------------------------

    def _issue(self, state: _ClassState, event: Event, is_real: bool) -> None:
        info = state.ops[event.op]
        op = info.spec
        state.issued_at[event.op] = (state.epoch, state.gap_clock)
        if self._volatile_links:  # a link's state depends on when the op runs
            self._costs.pop((state.program.class_id, event.op), None)
        real_here = is_real and self._real_pending is not None \
            and self._real_pending[0] == state.pc
        if info.local and not (self.record or real_here or self._arrivals_perturbed):
            # The fast path: no one needs the per-rank arrivals, only the groups' last.
            cost, least = self._op_cost(state, event.op)
            self._complete(state, event.op, self._group_last(state, op.family, info.axes) + cost,
                           slack=least)
            state.issued += 1
            return
        arrival = self._now(state)
        for p, part in self._active("delay", state, op.family):
            arrival = arrival + np.where(part, p.value, 0.0)
        for p, part in self._active("fail", state, op.family):
            arrival = np.where(part, math.inf, arrival)
        if real_here:
            arrival = np.array(np.broadcast_to(arrival, self.class_shape), dtype=float)
            arrival[self._real_index] = self._real_pending[1]
            self._real_pending = None
        state.arrivals[event.op] = arrival
        state.issued += 1
        if op.is_p2p:
            self._issue_p2p(state, event.op, op)
        elif info.spans_classes:
            self._issue_across_classes(state, event.op, op)
        else:
            cost, least = self._op_cost(state, event.op)
            self._complete(state, event.op, _max_over(arrival, info.axes) + cost, slack=least)

    def _group_last(self, state: _ClassState, family: str, axes: tuple[int, ...]) -> Time:
        """When the last member of each group arrives, without forming per-rank
        arrivals when the class's times already agree within groups."""
        t = state.t
        if not state.pending:
            return _max_over(t, axes)
        factor = self._factor(state)
        if not isinstance(factor, np.ndarray):
            return _max_over(t + state.pending * factor, axes)
        if isinstance(t, np.ndarray) and any(t.shape[a] != 1 for a in axes):
            return _max_over(t + state.pending * factor, axes)
        # t is constant over the group: max(t + g·f) = t + g·max(f)
        factor_max = state.factor_max.get(family)
        if factor_max is None:
            factor_max = state.factor_max[family] = factor.max(axis=axes, keepdims=True)
        return t + state.pending * factor_max

    def _issue_across_classes(self, state: _ClassState, op_index: int, op: OpSpec) -> None:
        seq = state.next_sequence(("coll", op.family))
        key = ("coll", op.family, state.iteration, seq)
        waiting = self._rendezvous.setdefault(key, {})
        waiting[state.program.class_id] = (op_index, state.arrivals[op_index], state.iteration)
        if len(waiting) < len(self._states):
            return
        del self._rendezvous[key]
        specs = {class_id: self._states[class_id].program.ops[index]
                 for class_id, (index, _, _) in waiting.items()}
        if len({(s.kind, s.nbytes) for s in specs.values()}) > 1:
            raise GraphError(
                f"the classes disagree on collective {seq + 1} of iteration {state.iteration} "
                f"on {op.family}: " + "; ".join(f"class {c} issues {_describe(s)}"
                                                for c, s in sorted(specs.items())))
        full = np.empty((len(self._states), *self.class_shape))
        for class_id, (_, arrival, _) in waiting.items():
            full[class_id] = arrival
        local_axes = self._local_axes(op.family)
        done = full.max(axis=(0, *(1 + a for a in local_axes)), keepdims=True)[0]
        real = waiting.get(self._real_class)
        if real is not None and real[2] == self._states[self._real_class].iteration:
            self._real_last[real[0]] = (full, local_axes)
        cause = None
        if self.record:
            latest = int(np.argmax(full.reshape(len(self._states), -1).max(axis=1)))
            cause = (latest, waiting[latest][0])
        for class_id, (index, arrival, iteration) in waiting.items():
            other = self._states[class_id]
            cost, least = self._op_cost(other, index)
            self._complete(other, index, done + cost, iteration, cause, least, arrival)

    def _issue_p2p(self, state: _ClassState, op_index: int, op: OpSpec) -> None:
        # The n-th send from one class to another, in one direction, pairs with
        # the n-th matching recv there (NCCL matches p2p ops in order).
        step = op.peer if op.kind == "send" else -op.peer  # the sender's offset
        me = state.program.class_id
        if state.ops[op_index].spans_classes:
            peer = me + op.peer
            if not 0 <= peer < len(self._states):
                raise GraphError(f"class {me} has a {op.kind} to class {peer}, which does "
                                 "not exist")
        else:
            peer = me
        source, target = (me, peer) if op.kind == "send" else (peer, me)
        seq = state.next_sequence(("p2p", source, target, step, op.kind))
        key = ("p2p", source, target, step, state.iteration, seq)
        waiting = self._rendezvous.setdefault(key, {})
        # the arrival travels with the entry: a sender that never waits may end
        # its iteration before the receiver posts the matching receive
        waiting[op.kind] = (state.program.class_id, op_index, state.arrivals[op_index],
                            state.iteration)
        if len(waiting) < 2:
            return
        del self._rendezvous[key]
        send_class, send_op, sent, send_iteration = waiting["send"]
        recv_class, recv_op, received, recv_iteration = waiting["recv"]
        sender, receiver = self._states[send_class], self._states[recv_class]
        spec = sender.program.ops[send_op]
        if spec.nbytes != receiver.program.ops[recv_op].nbytes:
            raise GraphError(
                f"send {seq + 1} of iteration {state.iteration} from class {send_class} to "
                f"class {recv_class} on {spec.family} carries {spec.nbytes} bytes but the "
                f"matching recv expects {receiver.program.ops[recv_op].nbytes}")
        # Across classes the ranks pair element by element (same coordinates off
        # the class axis); inside a class, rank x sends to x + step on the axis.
        axis = None if sender is not receiver else self._local_axes(spec.family)[0]
        sent_there = _roll(sent, step, axis)  # each receiver's sender's arrival
        received_there = _roll(received, -step, axis)  # each sender's receiver's arrival
        cost, slack = self._op_cost(sender, send_op)  # per sender: a receiver's is its sender's
        done = _maximum(sent_there, received) + _roll(cost, step, axis)
        for kind, peers in (("recv", sent_there), ("send", received_there)):
            class_id, op_index, own, iteration = waiting[kind]
            if class_id == self._real_class and iteration == self._states[class_id].iteration:
                # the real rank's side: its peer, if the peer arrived later, was waited for
                peer_spec = self._states[class_id].program.ops[op_index]
                peer_rank = self._peer_rank(peer_spec)
                peer_time = _at(peers, self._real_index, self.class_shape)
                own_time = _at(own, self._real_index, self.class_shape)
                self._real_last[op_index] = ((peer_rank, peer_time) if peer_time >= own_time
                                             else (self.real_rank, own_time))
        cause = None
        if self.record:
            late = "send" if np.max(sent) >= np.max(received) else "recv"
            cause = waiting[late][:2]
        self._complete(receiver, recv_op, done, recv_iteration, cause, slack, received)
        self._complete(sender, send_op, _roll(done, -step, axis), send_iteration, cause, slack,
                       sent)

    def _complete(self, state: _ClassState, op_index: int, done: Time,
                  iteration: int | None = None, cause: tuple[int, int] | None = None,
                  slack: float = 0.0, arrival: Time | None = None) -> None:
        if iteration is None:
            iteration = state.iteration
        if self.record:
            if arrival is None:
                arrival = state.arrivals.get(op_index)
            self.records.append(OpRecord(state.program.class_id, iteration, op_index,
                                         self._external(arrival), self._external(done),
                                         cause or (state.program.class_id, op_index)))
        if iteration != state.iteration:
            # Its class has moved on: only the real rank may still wait for it.
            if state.program.class_id == self._real_class:
                self._real_done[(iteration, op_index)] = done
            return
        state.done[op_index] = done
        state.slack[op_index] = slack

    # -- costs ---------------------------------------------------------------------------------

    def _placement(self, op: OpSpec) -> Placement:
        key = (op.family, op.peer if op.is_p2p else 0)
        placement = self._placements.get(key)
        if placement is None:
            gpn = self.graph.gpus_per_node
            if op.is_p2p:
                axis = self.graph.family_axes(op.family)[0]
                other = self.mesh.strides[axis] * abs(op.peer)
                placement = Placement.pair(0, other, gpn)
            else:
                ranks = self.mesh.group_ranks(self.graph.family_axes(op.family), 0)
                placement = Placement.of(ranks, gpn)
            self._placements[key] = placement
        return placement

    def _op_cost(self, state: _ClassState, op_index: int) -> tuple[Time, float]:
        """An op's time, and its least over the class (what the wait shortcut needs)."""
        key = (state.program.class_id, op_index)
        found = self._costs.get(key)
        if found is None:
            cost = self._cost_with_links(state.program.ops[op_index], state)
            found = self._costs[key] = (cost, _least(cost))
        return found

    def _cost_with_links(self, op: OpSpec, state: _ClassState) -> Time:
        base = self._cost(op, self._placement(op))
        if not self._links:
            return base
        nodes = self._nodes()
        axes = self.graph.family_axes(op.family)
        cost: Time = base
        now = _least(self._now(state))  # when the op is issued
        for link in self._links:
            if not link.active(state.iteration, now):
                continue
            touched = np.isin(nodes, list(link.nodes))
            if op.is_p2p:
                # the pair of each rank: its peer ``op.peer`` steps along the axis
                other = np.roll(nodes, -op.peer, axis=axes[0])
                degraded = (nodes != other) & (touched | np.roll(touched, -op.peer, axis=axes[0]))
            else:
                # Traffic inside a node never touches its NICs: a group is degraded
                # when it spans several nodes and one of them is a degraded one.
                degraded = touched.any(axis=axes, keepdims=True) & (
                    nodes.min(axis=axes, keepdims=True) != nodes.max(axis=axes, keepdims=True))
            degraded = np.broadcast_to(degraded, self.mesh.shape)
            degraded = self._internal(degraded[state.index] if state.index else degraded)
            slower = base / link.bandwidth_factor + link.added_latency_s
            cost = np.where(degraded, slower, cost)
        return cost


def _describe(op: OpSpec) -> str:
    peer = f" with the rank {op.peer:+d} along {op.family}" if op.is_p2p else f" on {op.family}"
    return f"{op.kind} of {op.nbytes} bytes{peer}"


def _max_over(times: Time, axes: tuple[int, ...]) -> Time:
    """Each group's latest time: the max over the family's axes, kept as size-1 dims."""
    if not isinstance(times, np.ndarray):
        return times
    return times.max(axis=axes, keepdims=True)


def _maximum(a: Time, b: Time) -> Time:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a > b else b


def _least(times: Time) -> float:
    return float(times.min()) if isinstance(times, np.ndarray) else times


def _squeeze(times: Time) -> Time:
    """A per-rank array whose ranks all agree, as a scalar (the fast path)."""
    if isinstance(times, np.ndarray):
        first = times.flat[0]
        if (times == first).all():
            return float(first)
    return times


def _at(times: Time, index: tuple, shape: tuple) -> float:
    if isinstance(times, np.ndarray):
        return float(np.broadcast_to(times, shape)[index])
    return float(times)


def _roll(times: Time, step: int, axis: int | None) -> Time:
    if axis is None or not isinstance(times, np.ndarray):
        return times
    return np.roll(times, step, axis=axis)
