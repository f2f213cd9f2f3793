"""The replay engine's event loop: each class advances event by event,
vectorised over its ranks, and an op completes once every member of its
groups has arrived (every class involved, or the peer for point-to-point).

A process group is a communicator with one stream (ProcessGroupNCCL): its
collectives run in issue order, so one starts at the later of its last
member's arrival and the end of the group's previous op.  Each class keeps,
per family, when its groups' streams are free, shaped like a group max."""

from __future__ import annotations

import collections
import math
from collections.abc import Callable
from typing import overload

import numpy as np
from numpy.typing import NDArray

from prism_debug.cost import Placement
from prism_debug.engine.compute import ComputeModel
from prism_debug.engine.gaps import GapSource, map_drawn
from prism_debug.engine.layout import Layout
from prism_debug.engine.real import (
    RealRanks,
    attach_reals,
    end_real_iteration,
    issue_alone,
    real_peer,
    relayout_reals,
    shared,
    with_real,
)
from prism_debug.engine.sampling import Draws, group_max
from prism_debug.engine.state import (
    ClassState,
    Match,
    OpInfo,
    OpTiming,
    RealRank,
    StreamKey,
    Unit,
    describe_op,
)
from prism_debug.engine.times import Time, at, least, max_over, maximum, roll, squeeze
from prism_debug.engine.windows import LinkPerturbation, Perturbation, Windows
from prism_debug.errors import GraphError
from prism_debug.graph.execution import Event, ExecutionGraph, OpSpec

CostFn = Callable[[OpSpec, Placement], float]

# A collective across classes waits until every class has issued it: keyed
# ("coll", family, iteration, its count on the family), each class's (op
# index, arrival, iteration, the op's draws).
_CollectiveKey = tuple[str, str, int, int]
_Issued = tuple[int, Time, int, Draws | None]
# A send and its recv wait for each other: keyed ("p2p", source class, target
# class, the sender's offset, iteration, their count), each side's (class id,
# op index, arrival, iteration, unit) by kind.
_PairKey = tuple[str, int, int, int, int, int]
_Side = tuple[int, int, Time, int, Unit]


class EventLoop:
    def __init__(self, graph: ExecutionGraph, cost: CostFn, layout: Layout, windows: Windows,
                 compute: ComputeModel, rng: np.random.Generator, *, real: RealRank | None,
                 record: bool, multi: RealRanks | None = None) -> None:
        self.graph = graph
        self.layout = layout
        self.windows = windows
        self._cost = cost
        self.record = record
        self.records: list[OpTiming] = []
        self.real = real  # the local real rank (its completions are asked)
        self._real_class = None if real is None else real.class_id
        self.multi = multi  # several real ranks (see :class:`.real.RealRanks`), or None
        self.target: float = math.inf  # the iteration every class stops after
        # True once advance() went as far as it can and nothing changed since
        # (the real rank's completion is then known without another advance)
        self.settled = False
        # the real rank's shortcuts (off: the full per-rank path, the tests' oracle)
        self.real_shortcuts = True
        # copies of the windows' flags, read on every issue
        self._arrivals_perturbed = False
        self._volatile_links = False
        self._collectives: dict[_CollectiveKey, dict[int, _Issued]] = {}
        self._pairs: dict[_PairKey, dict[str, _Side]] = {}
        self._costs: dict[tuple[int, int], tuple[Time, float]] = {}  # (class, op) -> cost, min
        self.states = [ClassState(p, layout.class_index(p.class_id),
                                  tuple(self._op_info(op) for op in p.ops))
                       for p in graph.programs]
        attach_reals(self.states, real, multi)
        self._gaps = GapSource(layout, compute, rng, self.states,
                               None if multi is None else multi.seed)
        # A per-rank model draws in the layout's sampled shape: its first draws
        # wait for the first advance (perturbations and the real rank set
        # columns apart before).  Others draw now (a bad model fails here).
        self._per_rank = self._gaps.per_rank
        self._undrawn = self._per_rank  # the first draws wait for the first advance
        for state in self.states:
            if not self._per_rank:
                self._gaps.take(state)

    def _op_info(self, op: OpSpec) -> OpInfo:
        spans = self.layout.spans_classes(op.family)
        axes = self.layout.local_axes(op.family)
        population = self.layout.sampled and not op.is_p2p \
            and len(self.layout.order) - 1 in axes
        return OpInfo(op, axes, spans, not op.is_p2p and not spans, shared(self.graph, op),
                      self._stream_keys(op), population)

    # -- what the replay engine changes between events -----------------------------------

    def keep_apart(self, mask: NDArray[np.bool_]) -> None:
        """Keep the columns of the ranks in ``mask`` apart (see :mod:`.layout`)."""
        self._relayout(self.layout.keep_apart(mask))

    def _relayout(self, column_map: Callable[[Time], Time] | None) -> None:
        """Apply ``column_map`` to every time array held."""
        self.settled = False
        if column_map is not None:
            for state in self.states:
                state.relayout(column_map)
                if self._per_rank:
                    map_drawn(state, column_map)
            self._gaps.relayout(column_map)
            for issued in self._collectives.values():
                for class_id, (op_index, arrival, iteration, draws) in issued.items():
                    issued[class_id] = (op_index, column_map(arrival), iteration, draws)
            for sides in self._pairs.values():
                for kind, (class_id, op_index, arrival, iteration, unit) in sides.items():
                    sides[kind] = (class_id, op_index, column_map(arrival), iteration, unit)
            self.windows.forget_parts()
            self._costs.clear()
        relayout_reals(self, column_map)

    def add_window(self, window: Perturbation | LinkPerturbation) -> None:
        """Put a perturbation in force from the next event on."""
        if isinstance(window, Perturbation) and window.kind == "slow" and (self.multi is None
                or window.first_iteration <= max(s.iteration for s in self.states)):
            self._settle_compute()  # (not for a window no class reached: see RealRanks)
        self.windows.add(window)
        self._windows_changed(window)

    def remove_window(self, window: object) -> None:
        """Take a perturbation back from the next event on (ValueError when it
        is not in force); what it already did stays done."""
        if (isinstance(window, Perturbation) and window.kind == "slow"
                and window in self.windows.perturbations):
            self._settle_compute()
        self.windows.remove(window)
        self._windows_changed(window)

    def _windows_changed(self, window: object) -> None:
        self.settled = False
        self._arrivals_perturbed = self.windows.arrivals_perturbed
        self._volatile_links = self.windows.volatile_links
        if isinstance(window, LinkPerturbation):
            self._costs.clear()

    def _settle_compute(self) -> None:
        """Compute done so far ran at the old factors: bring every class's
        times up to date before the factors change."""
        for state in self.states:
            if state.pending:
                state.t = self._now(state)
                state.pending = 0.0
                state.epoch += 1
            state.forget_factors()  # recomputed with the new factors at the next event

    # -- the loop --------------------------------------------------------------------------

    def advance(self) -> None:
        """Step every class as far as it can go."""
        if self._undrawn:  # a per-rank model's first draws
            self._gaps.draw_rank_factors()
            for state in self.states:
                self._gaps.take(state)
            self._undrawn = False
        progress = True
        while progress:
            progress = False
            for state in self.states:
                while self._step(state):
                    progress = True
        self.settled = True

    def _step(self, state: ClassState) -> bool:
        if state.iteration > self.target:
            return False
        reals = state.reals
        is_real = reals is not None
        # (with one real rank, reals is (self.real,))
        if reals is not None and (state.pc > reals[0].allowed if self.multi is None
                                  else not self.multi.ready(state, reals)):
            return False
        if self._real_class is not None and not is_real and state.iteration > 1 + (
                self.states[self._real_class].iteration if self.multi is None
                else self.multi.slowest()):
            # a class that never blocks (an isend nobody waits for) would run on
            # forever: nothing the real ranks do now need it further ahead
            return False
        events = state.events
        event = events[state.pc]
        if not state.gap_applied:
            gap = state.gaps[state.pc]
            if type(gap) is float:  # (cheaper than isinstance, once per event)
                state.pending += gap
                state.gap_clock += gap
            else:
                self._apply_gap(state, gap)
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
                state.t = maximum(self._now(state), done)
            state.pending = 0.0
            state.epoch += 1
            if is_real:
                if state.t.__class__ is not float and self.real_shortcuts:
                    # the real rank's ops leave arrays whose ranks mostly agree:
                    # back to the scalar its shortcuts take
                    state.t = squeeze(state.t)
            else:
                # The stream's last op ended before each rank's now: the next one
                # cannot queue behind it (spares a max per op).  The real rank's
                # arrivals come from its process, which the graph's waits do not bind.
                info = state.ops[event.op]
                streams = state.p2p_free if info.spec.is_p2p else state.streams
                for key in info.streams:
                    if streams.get(key) is done:
                        del streams[key]
        elif event.action == "issue":
            self._issue(state, event, reals)
        state.gap_applied = False
        state.pc += 1
        if event.action == "end" or state.pc == len(events):
            self._end_iteration(state)
        return True

    def _factor(self, state: ClassState) -> Time:
        if state.factor is None:  # once per class and iteration, not per event
            state.factor = self.windows.compute_factor(state)
        return state.factor

    def _factor_top(self, state: ClassState) -> float:
        """The class's largest compute factor this iteration."""
        if state.factor_top is None:
            factor = self._factor(state)
            state.factor_top = float(factor.max()) if isinstance(factor, np.ndarray) else factor
        return state.factor_top

    def _now(self, state: ClassState) -> Time:
        """The class's times now (full per-rank detail where ranks differ)."""
        if not state.pending:
            return state.t
        return state.t + state.pending * self._factor(state)

    def _end_iteration(self, state: ClassState) -> None:
        state.t = squeeze(self._now(state))  # back to the fast path once ranks agree
        state.pending = 0.0
        state.gap_clock = 0.0
        state.epoch += 1
        state.iteration += 1
        state.events = state.program.events(state.iteration)
        self._gaps.take(state)
        state.pc = 0
        state.issued = 0
        state.arrivals.clear()
        state.issued_at.clear()
        state.sequence.clear()
        state.forget_factors()
        state.slack.clear()
        for family, free in state.streams.items():
            state.streams[family] = squeeze(free)
        for key, free in state.p2p_free.items():
            state.p2p_free[key] = squeeze(free)
        state.iteration_starts.append(state.t)
        if state.reals is not None:
            end_real_iteration(state, state.reals, self.multi)
        state.done.clear()

    # -- compute -----------------------------------------------------------------------------

    def _apply_gap(self, state: ClassState, gap: Time) -> None:
        """A gap that is not a float: another kind of number, or an array of
        compute that differs between the class's ranks (their times part)."""
        if self._per_rank:  # laid out when drawn: an add or two per event
            factor = self._factor(state)
            if state.pending:
                gap = gap + state.pending
            state.t = state.t + (gap if factor.__class__ is float and factor == 1.0
                                 else gap * factor)
            state.pending = 0.0
            state.gap_clock += state.gap_tops[state.pc]
            state.epoch += 1
            return
        gap = np.asarray(gap, dtype=float)
        if not gap.ndim:
            state.pending += float(gap)
            state.gap_clock += float(gap)
            return
        shape = self.layout.local_shape
        if gap.ndim != len(shape) or any(g not in (1, s)
                                         for g, s in zip(gap.shape, shape, strict=True)):
            raise ValueError(f"a compute model's gaps must be floats or arrays over the class's "
                             f"slice of the mesh {shape}, got shape {gap.shape}")
        # columns the shared one stands for may no longer agree
        self._relayout(self.layout.keep_columns_apart(self.layout.columns_to_part(gap)))
        # ``pending`` stays a scalar (the fast path): fold the gap into ``t``,
        # and the new epoch tells the wait shortcut the times moved
        state.t = self._now(state) + self.layout.internal(gap) * self._factor(state)
        state.pending = 0.0
        state.gap_clock += float(gap.max())
        state.epoch += 1

    # -- ops ---------------------------------------------------------------------------------

    def _issue(self, state: ClassState, event: Event, reals: tuple[RealRank, ...] | None
               ) -> None:
        info = state.ops[event.op]
        op = info.spec
        state.issued_at[event.op] = (state.epoch, state.gap_clock)
        if self._volatile_links:  # a link's state depends on when the op runs
            self._costs.pop((state.program.class_id, event.op), None)
        # the class's real ranks when they issue this op, else None
        pending = None if reals is None else reals[0].pending
        real_here = reals if pending is not None and pending[0] == state.pc else None
        perturbed = self._arrivals_perturbed and (
            self.multi is None or self.windows.arrivals_perturbed_in(state.iteration))
        if info.local and not (self.record or real_here or perturbed):
            # The fast path: no one needs the per-rank arrivals, only the groups' last.
            cost, lowest = self._op_cost(state, event.op)
            self._complete(state, event.op,
                           self._queue(state, op.family, self._group_last(state, info, event.op),
                                       cost), slack=lowest)
            state.issued += 1
            return
        if real_here and len(real_here) == 1 and info.local and self.real_shortcuts and not (
                self.record or perturbed) and issue_alone(self, state, event.op, info,
                                                          real_here[0]):
            state.issued += 1
            return
        arrival = self._now(state)
        for p, part in self.windows.active("delay", state, op.family):
            arrival = arrival + np.where(part, p.value, 0.0)
        for _, part in self.windows.active("fail", state, op.family):
            arrival = np.where(part, math.inf, arrival)
        if real_here:
            arrival = with_real(arrival, self.layout.class_shape, real_here, event.op)
        state.arrivals[event.op] = arrival
        state.issued += 1
        if op.is_p2p:
            self._issue_p2p(state, event.op, op)
        elif info.spans_classes:
            self._issue_across_classes(state, event.op, op)
        else:
            cost, lowest = self._op_cost(state, event.op)
            self._complete(state, event.op, self._queue(
                state, op.family, self.group_max(state, arrival, info, event.op), cost),
                slack=lowest)

    @overload
    def group_max(self, state: ClassState, times: NDArray[np.float64], info: OpInfo,
                  op_index: int) -> NDArray[np.float64]: ...

    @overload
    def group_max(self, state: ClassState, times: Time, info: OpInfo, op_index: int) -> Time: ...

    def group_max(self, state: ClassState, times: Time, info: OpInfo, op_index: int) -> Time:
        """Each group's latest time, over every column of the population when
        only a sample of them is simulated (see :mod:`.sampling`)."""
        if info.population:
            return group_max(times, info.axes, self.layout, state.uniforms.get(op_index))
        return max_over(times, info.axes)

    def _group_last(self, state: ClassState, info: OpInfo, op_index: int) -> Time:
        """When the last member of each group arrives, without forming per-rank
        arrivals when the class's times already agree within groups."""
        if info.population:
            return self.group_max(state, self._now(state), info, op_index)
        t = state.t
        family, axes = info.spec.family, info.axes
        if not state.pending:
            return max_over(t, axes)
        factor = self._factor(state)
        if not isinstance(factor, np.ndarray):
            return max_over(t + state.pending * factor, axes)
        if isinstance(t, np.ndarray) and any(t.shape[a] != 1 for a in axes):
            return max_over(t + state.pending * factor, axes)
        # t is constant over the group: max(t + g·f) = t + g·max(f)
        factor_max = state.factor_max.get(family)
        if factor_max is None:
            factor_max = state.factor_max[family] = factor.max(axis=axes, keepdims=True)
        return t + state.pending * factor_max

    @staticmethod
    def _queue(state: ClassState, family: str, last: Time, cost: Time) -> Time:
        """An op of ``family`` whose groups' last members arrive at ``last``:
        it starts once its group's stream is free too, and ends ``cost`` later
        (so it still ends at least ``cost`` after each arrival: the wait
        shortcut's slack holds)."""
        free = state.streams.get(family)
        done = (last if free is None else maximum(last, free)) + cost
        state.streams[family] = done
        return done

    def _issue_across_classes(self, state: ClassState, op_index: int, op: OpSpec) -> None:
        seq = state.next_sequence(("coll", op.family))
        key = ("coll", op.family, state.iteration, seq)
        waiting = self._collectives.setdefault(key, {})
        waiting[state.program.class_id] = (op_index, state.arrivals[op_index], state.iteration,
                                           state.uniforms.get(op_index))
        if len(waiting) < len(self.states):
            return
        del self._collectives[key]
        specs = {class_id: self.states[class_id].program.ops[index]
                 for class_id, (index, _, _, _) in waiting.items()}
        if len({(s.kind, s.nbytes) for s in specs.values()}) > 1:
            raise GraphError(
                f"the classes disagree on collective {seq + 1} of iteration {state.iteration} "
                f"on {op.family}: " + "; ".join(f"class {c} issues {describe_op(s)}"
                                                for c, s in sorted(specs.items())))
        full = np.empty((len(self.states), *self.layout.class_shape))
        for class_id, (_, arrival, _, _) in waiting.items():
            full[class_id] = arrival
        local_axes = self.layout.local_axes(op.family)
        done = full.max(axis=(0, *(1 + a for a in local_axes)), keepdims=True)[0]
        unsampled = None
        if self.states[0].ops[waiting[0][0]].population:
            # each class's columns are a population of their own
            unsampled = np.stack([np.broadcast_to(group_max(
                full[c], local_axes, self.layout, waiting[c][3]), done.shape)
                for c in range(len(self.states))])
            done = np.maximum(done, unsampled.max(axis=0))
        real = self.real
        if real is not None:
            entry = waiting.get(real.class_id)
            if entry is not None and entry[2] == self.states[real.class_id].iteration:
                real.spanning[entry[0]] = (full, local_axes, unsampled)
        cause = None
        if self.record:
            latest = int(np.argmax(full.reshape(len(self.states), -1).max(axis=1)))
            cause = (latest, waiting[latest][0])
        # every class's share of a group saw the same ops end: their streams
        # agree, but take the latest should link costs have told them apart
        start = done
        for class_id in waiting:
            free = self.states[class_id].streams.get(op.family)
            if free is not None:
                start = maximum(start, free)
        for class_id, (index, arrival, iteration, _) in waiting.items():
            other = self.states[class_id]
            cost, lowest = self._op_cost(other, index)
            finish = other.streams[op.family] = start + cost
            self._complete(other, index, finish, iteration, cause, lowest, arrival)

    def _issue_p2p(self, state: ClassState, op_index: int, op: OpSpec) -> None:
        # The n-th send from one class to another, in one direction, pairs with
        # the n-th matching recv there (NCCL matches p2p ops in order).
        step = op.peer if op.kind == "send" else -op.peer  # the sender's offset
        me = state.program.class_id
        if state.ops[op_index].spans_classes:
            peer = me + op.peer
            if not 0 <= peer < len(self.states):
                raise GraphError(f"class {me} has a {op.kind} to class {peer}, which does "
                                 "not exist")
        else:
            peer = me
        source, target = (me, peer) if op.kind == "send" else (peer, me)
        seq = state.next_sequence(("p2p", source, target, step, op.kind))
        key = ("p2p", source, target, step, state.iteration, seq)
        event = state.events[state.pc]
        unit = self._unit(state, op, event.batch)
        arrival = state.arrivals[op_index]
        # (a unit of one op, the common case, copies no array)
        unit.arrival = maximum(unit.arrival, arrival) if unit.ops else arrival
        unit.ops.append((op_index, state.iteration, arrival))
        unit.unresolved += 1
        waiting = self._pairs.setdefault(key, {})
        # the arrival travels with the entry: a sender that never waits may end
        # its iteration before the receiver posts the matching receive
        waiting[op.kind] = (me, op_index, arrival, state.iteration, unit)
        if len(waiting) == 2:
            del self._pairs[key]
            self._pair(waiting, seq, state.iteration)
        following = state.events[state.pc + 1] if state.pc + 1 < len(state.events) else None
        if not event.batch or following is None or following.action != "issue" \
                or following.batch != event.batch:
            state.open_unit = None  # the batch is complete: NCCL launches it now
            self._launch(state, unit)

    def _stream_keys(self, op: OpSpec) -> tuple[StreamKey, ...]:
        """The streams ``op`` may run on."""
        if not op.is_p2p:
            return (op.family,)
        size = self.graph.mesh.shape[self.graph.family_axes(op.family)[0]]
        return (("batch", op.family), ("pair", op.family, op.peer % size))

    def _unit(self, state: ClassState, op: OpSpec, batch: int) -> Unit:
        """The unit an op joins.  Without eager init, ProcessGroupNCCL runs a
        lone p2p op on a 2-rank communicator of its own per peer pair (so on
        its stream: send and recv with one peer run in issue order), and a
        batch on the group's communicator, as one NCCL group.  (Here a group's
        batches have a stream apart from its collectives: pipeline groups
        hardly run any.)"""
        if batch:
            if state.open_unit is None:
                state.open_unit = Unit(state.program.class_id, ("batch", op.family))
            return state.open_unit
        size = self.graph.mesh.shape[self.graph.family_axes(op.family)[0]]
        return Unit(state.program.class_id, ("pair", op.family, op.peer % size))

    def _pair(self, waiting: dict[str, _Side], seq: int, iteration: int) -> None:
        """A send and its recv have both been issued: they run once both
        sides' units have started."""
        send_class, send_op, sent, _, send_unit = waiting["send"]
        recv_class, recv_op, received, _, recv_unit = waiting["recv"]
        sender, receiver = self.states[send_class], self.states[recv_class]
        spec = sender.program.ops[send_op]
        if spec.nbytes != receiver.program.ops[recv_op].nbytes:
            raise GraphError(
                f"send {seq + 1} of iteration {iteration} from class {send_class} to "
                f"class {recv_class} on {spec.family} carries {spec.nbytes} bytes but the "
                f"matching recv expects {receiver.program.ops[recv_op].nbytes}")
        # Across classes the ranks pair element by element (same coordinates off
        # the class axis); inside a class, rank x sends to x + step on the axis.
        step = spec.peer
        axis = None if sender is not receiver else self.layout.local_axes(spec.family)[0]
        real = self.real
        for kind, peers in (("recv", roll(sent, step, axis)),
                            ("send", roll(received, -step, axis))):
            class_id, op_index, own, op_iteration, _ = waiting[kind]
            if real is not None and class_id == real.class_id \
                    and op_iteration == self.states[class_id].iteration:
                # the real rank's side: its peer, if the peer arrived later, was waited for
                peer_rank = real_peer(self.graph, real.rank,
                                      self.states[class_id].program.ops[op_index])
                peer_time = at(peers, real.index, self.layout.class_shape)
                own_time = at(own, real.index, self.layout.class_shape)
                real.last[op_index] = ((peer_rank, peer_time) if peer_time >= own_time
                                       else (real.rank, own_time))
        if self.record:
            late = "send" if np.max(sent) >= np.max(received) else "recv"
            send_unit.causes[send_op] = recv_unit.causes[recv_op] = waiting[late][:2]
        match = Match(send_unit, recv_unit, step, axis, send_class, send_op)
        send_unit.matches.append(match)
        if recv_unit is not send_unit:
            recv_unit.matches.append(match)

    def _launch(self, state: ClassState, unit: Unit) -> None:
        unit.launched = True
        queue = state.queues.get(unit.key)
        if queue is None:
            queue = state.queues[unit.key] = collections.deque()
        queue.append(unit)
        if len(queue) == 1:
            self._start(unit)

    def _start(self, unit: Unit) -> None:
        """``unit`` reached the head of its stream's queue: it starts once its
        last op is issued and the stream is free, and its ops run once their
        peers' units start too; each unit that ends frees its stream for the next."""
        starting = [unit]
        while starting:
            unit = starting.pop()
            state = self.states[unit.class_id]
            free = state.p2p_free.get(unit.key)
            unit.start = unit.arrival if free is None else maximum(unit.arrival, free)
            for match in unit.matches:
                send_unit, recv_unit = match.send_unit, match.recv_unit
                if match.resolved or send_unit.start is None or recv_unit.start is None:
                    continue
                match.resolved = True
                step, axis = match.step, match.axis
                cost, slack = self._op_cost(self.states[match.send_class], match.send_op)
                done = maximum(roll(send_unit.start, step, axis), recv_unit.start) \
                    + roll(cost, step, axis)
                recv_unit.end = done if recv_unit.end is None else maximum(recv_unit.end, done)
                done = roll(done, -step, axis)
                send_unit.end = done if send_unit.end is None else maximum(send_unit.end, done)
                for side in (send_unit, recv_unit):
                    side.slack = min(side.slack, slack)
                    side.unresolved -= 1
                    if not side.unresolved:
                        following = self._finish(side)
                        if following is not None:
                            starting.append(following)

    def _finish(self, unit: Unit) -> Unit | None:
        """Every op of ``unit`` ran: they complete together; returns the unit
        next on its stream, if one is queued."""
        state = self.states[unit.class_id]
        end = unit.end
        assert end is not None, "a unit finishes once its ops' matches set its end"
        for op_index, iteration, arrival in unit.ops:
            self._complete(state, op_index, end, iteration, unit.causes.get(op_index),
                           unit.slack, arrival)
        state.p2p_free[unit.key] = end
        queue = state.queues[unit.key]
        queue.popleft()
        return queue[0] if queue else None

    def _complete(self, state: ClassState, op_index: int, done: Time,
                  iteration: int | None = None, cause: tuple[int, int] | None = None,
                  slack: float = 0.0, arrival: Time | None = None) -> None:
        if iteration is None:
            iteration = state.iteration
        if self.record:
            if arrival is None:
                arrival = state.arrivals.get(op_index)
            self.records.append(OpTiming(state.program.class_id, iteration, op_index,
                                         None if arrival is None
                                         else self.layout.external(arrival),
                                         self.layout.external(done),
                                         cause or (state.program.class_id, op_index)))
        if iteration != state.iteration:
            # Its class has moved on: only its real ranks may still wait for it.
            if state.reals is not None:
                state.reals[0].done[(iteration, op_index)] = done
            return
        state.done[op_index] = done
        state.slack[op_index] = slack

    def _op_cost(self, state: ClassState, op_index: int) -> tuple[Time, float]:
        """An op's time, and its least over the class (what the wait shortcut needs)."""
        key = (state.program.class_id, op_index)
        found = self._costs.get(key)
        if found is None:
            op = state.program.ops[op_index]
            cost: Time = self._cost(op, self.layout.placement(op))
            if self.windows.links:
                cost = self.windows.link_cost(cost, op, state, least(self._now(state)))
            found = self._costs[key] = (cost, least(cost))
        return found

