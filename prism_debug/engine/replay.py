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
arrivals come from the real process (:meth:`ReplayEngine.real_issue`): its
class is held at the real rank's position, so a late real rank delays its
groups and everything downstream, as in the full-size job.  A job may have
several real ranks (``real_ranks``): each process holds a replica of the
engine that its own rank drives and the others' arrivals are fed to
(:meth:`ReplayEngine.peer_issue`); replicas fed the same arrivals, in any
order, compute the same timeline to the last bit.

The engine is not thread-safe: a caller with several threads (the agent's
main thread, its futures thread, the threads receiving peers' arrivals)
calls it under one lock.  No call blocks; a completion not known yet is
inf, asked again after the next call that fed it something.

This module is the engine's interface (perturbations, the real rank, what a
trace or a console asks); :mod:`.loop` replays, :mod:`.layout` lays out the
class arrays, :mod:`.windows` holds the perturbations and :mod:`.compute`
says how long the peers compute.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

import numpy as np

from prism_debug.engine.compute import ComputeModel, GraphCompute
from prism_debug.engine.layout import Layout
from prism_debug.engine.loop import CostFn, EventLoop
from prism_debug.engine.real import RealRanks, arrivals_of, next_issues
from prism_debug.engine.state import OpTiming, RealRank, check_follows
from prism_debug.engine.times import at
from prism_debug.engine.windows import LinkPerturbation, Perturbation, Windows
from prism_debug.errors import GraphError
from prism_debug.graph.execution import Event, ExecutionGraph, OpSpec

__all__ = ["CostFn", "ReplayEngine", "SAMPLE_COLUMNS", "generator"]

# Columns a per-rank compute model's replay simulates beside the explicit ones
# by default: the population maxima's error against the engine's cost.  On the
# bundled example at 65,536 ranks (cv 0.05, 80 iterations a side against the
# exact per-rank engine; s.e. 0.045 %): 32 columns -0.16 % on the mean
# iteration, 4.3 ms per iteration; 48: -0.11 %, 4.9 ms; 64: -0.12 %, 5.5 ms
# (tools/bench_engine.py, tests/engine/test_sampling.py)
SAMPLE_COLUMNS = 48


def generator(seed: int | Sequence[int]) -> np.random.Generator:
    """The engine's one seeded generator.  SFC64 rather than numpy's default
    PCG64: a per-rank compute model draws ~160,000 normals per iteration of
    the bundled example at 65,536 ranks, and SFC64 draws them 20 % faster
    (7.5 against 9.4 ns each here), with no weakness a simulation can see."""
    return np.random.Generator(np.random.SFC64(seed))


class ReplayEngine:
    def __init__(self, graph: ExecutionGraph, cost: CostFn, *, real_rank: int | None = None,
                 real_ranks: Iterable[int] | None = None, record: bool = False,
                 compress: bool = True,
                 compute: ComputeModel | None = None, seed: int = 0,
                 sample_columns: int | None = None) -> None:
        """Replay ``graph`` with op costs from ``cost``; follow the real
        process as ``real_rank``; keep :attr:`records` with ``record``.
        ``compute`` says how long the peers compute (the graph's gaps by
        default); it draws from one generator seeded with ``seed``.  Under a
        per-rank model (``compute.per_rank``) the engine simulates the
        explicit columns and at most ``sample_columns`` others
        (:data:`SAMPLE_COLUMNS` by default; see :mod:`.sampling`).

        ``real_ranks`` (the job's real ranks, ``real_rank`` among them; None:
        ``real_rank`` alone) with several ranks makes this engine one replica
        of a job with several real processes: ``real_rank`` drives it through
        :meth:`real_issue`, the others' arrivals are fed through
        :meth:`peer_issue` and :meth:`peer_iteration_end`, and replicas fed
        the same arrivals compute the same timeline to the last bit,
        whatever the order (see :class:`.real.RealRanks`; the draws are then
        keyed by class, iteration and stream, so a seeded timeline differs
        from one real rank's)."""
        self.graph = graph
        self.mesh = graph.mesh
        self.real_rank = real_rank
        ranks = [] if real_rank is None else [real_rank]
        if real_ranks is not None:
            ranks = sorted(real_ranks)
            if real_rank not in ranks or len(set(ranks)) != len(ranks):
                raise GraphError(f"the real ranks {ranks} must name each rank once, this "
                                 f"engine's real rank {real_rank} among them")
        for rank in ranks:
            if not 0 <= rank < self.mesh.world_size:
                raise GraphError(f"rank {rank} is outside the graph's world of "
                                 f"{self.mesh.world_size}")
        self.real_ranks = tuple(ranks)
        real: RealRank | None = None
        multi: RealRanks | None = None
        if real_rank is not None and len(ranks) > 1:  # (several: real_rank among them)
            multi = RealRanks(graph, ranks, real_rank, seed)
            real = multi.local
        elif real_rank is not None:
            real = RealRank(real_rank, graph.class_of(real_rank))
        self._multi = multi
        per_rank = getattr(compute, "per_rank", False)
        self._layout = Layout(graph, compress, (sample_columns or SAMPLE_COLUMNS) if per_rank
                              else None)
        if ranks:  # (before a per-rank model draws in the layout's shape)
            self._layout.keep_apart(self._layout.mask(ranks))
        self._windows = Windows(self._layout)
        self._loop = EventLoop(graph, cost, self._layout, self._windows,
                               GraphCompute() if compute is None else compute,
                               generator(seed), real=real, record=record, multi=multi)
        self._states = self._loop.states
        # id(events) -> (events, the index of the first issue at or after each)
        self._next_issues: dict[int, tuple[tuple[Event, ...], tuple[int | None, ...]]] = {}
        self._loop.keep_apart(self._layout.mask(ranks))

    @property
    def record(self) -> bool:
        """Whether every op's timing is kept in :attr:`records`."""
        return self._loop.record

    @record.setter
    def record(self, value: bool) -> None:
        self._loop.record = value

    @property
    def records(self) -> list[OpTiming]:
        return self._loop.records

    @records.setter
    def records(self, value: list[OpTiming]) -> None:
        self._loop.records = value

    @property
    def class_shape(self) -> tuple[int, ...]:
        """Shape of a class's time arrays, in the engine's internal axis order."""
        return self._layout.class_shape

    # -- the perturbation interface (driven by fault injection) -----------------------

    # Each call returns a handle that :meth:`remove` takes back.  Removing
    # stops a perturbation's effect from the next event on; what it already did
    # stays done (an op a failed peer missed stays missed).

    def slow(self, ranks: Iterable[int], factor: float, *, first_iteration: int = 1,
             iterations: float = math.inf) -> object:
        """Multiply the compute of ``ranks`` by ``factor`` (stragglers, a hot node)."""
        if factor <= 0:
            raise ValueError(f"a compute factor must be positive, got {factor}")
        mask = self._layout.mask(ranks)
        self._loop.keep_apart(mask)
        perturbation = Perturbation(
            "slow", mask, factor, first_iteration, first_iteration + iterations - 1)
        self._loop.add_window(perturbation)
        return perturbation

    def delay(self, ranks: Iterable[int], seconds: float, *, family: str | None = None,
              first_iteration: int = 1, iterations: float = math.inf,
              first_op: int = 0, ops: float = math.inf) -> object:
        """Delay the arrival of ``ranks`` at every op (of ``family``) by
        ``seconds``; ``first_op``/``ops`` bound it to ops of the first
        iteration (a stall at one collective: ``iterations=1, ops=1``)."""
        if seconds < 0:
            raise ValueError(f"a delay cannot be negative, got {seconds}")
        return self._arrival_perturbation("delay", ranks, seconds, family, first_iteration,
                                          iterations, first_op, ops)

    def fail(self, ranks: Iterable[int], *, at_iteration: int = 1, at_op: int = 0,
             family: str | None = None) -> object:
        """From op ``at_op`` of ``at_iteration`` on (ops of ``family``, when
        given), ``ranks`` never arrive: a fail-stop, a hang, or a collective
        they issue differently (a desync), which no peer can complete."""
        return self._arrival_perturbation("fail", ranks, math.inf, family, at_iteration,
                                          math.inf, at_op, math.inf)

    def _arrival_perturbation(self, kind: str, ranks: Iterable[int], value: float,
                              family: str | None, first_iteration: int, iterations: float,
                              first_op: int, ops: float) -> Perturbation:
        if first_iteration < 1 or first_op < 0:
            raise ValueError(f"iterations count from 1 and ops from 0, got iteration "
                             f"{first_iteration} op {first_op}")
        mask = self._layout.mask(ranks)
        self._loop.keep_apart(mask)
        last_op = first_op + ops - 1 if iterations == 1 else math.inf
        perturbation = Perturbation(kind, mask, value, first_iteration,
                                    first_iteration + iterations - 1, family, first_op, last_op)
        self._loop.add_window(perturbation)
        return perturbation

    def link(self, nodes: Collection[int], *, bandwidth_factor: float = 1.0,
             added_latency_s: float = 0.0, first_iteration: int = 1, iterations: float = math.inf,
             period_s: float | None = None, duty: float = 1.0) -> object:
        """Degrade collectives whose groups span any of ``nodes``: cost divided
        by ``bandwidth_factor`` plus ``added_latency_s``; with ``period_s``,
        only during the first ``duty`` of every period (a flapping link)."""
        if bandwidth_factor <= 0:
            raise ValueError(f"a bandwidth factor must be positive, got {bandwidth_factor}")
        if period_s is not None and not (period_s > 0 and 0 < duty <= 1):
            raise ValueError(f"an intermittent link needs period_s > 0 and 0 < duty <= 1, "
                             f"got {period_s} and {duty}")
        link = LinkPerturbation(frozenset(nodes), bandwidth_factor, added_latency_s,
                                first_iteration, first_iteration + iterations - 1, period_s, duty)
        self._loop.add_window(link)
        self._loop.keep_apart(np.isin(self._layout.nodes(), list(nodes)))
        return link

    def remove(self, handle: object) -> None:
        """Take back a perturbation (a handle from slow, delay, fail or link)."""
        self._loop.remove_window(handle)

    def clear(self) -> None:
        """Take back every perturbation."""
        for handle in [*self._windows.perturbations, *self._windows.links]:
            self.remove(handle)

    # -- the real rank ---------------------------------------------------------------

    def real_issue(self, spec: OpSpec, arrival: float) -> tuple[int, int]:
        """The real rank issues its next op at ``arrival``; returns a handle for
        :meth:`real_completion`.  The op must be the next one its class
        program issues, or :class:`GraphError` names the first mismatch.
        The handle is (iteration, op index): the op's index in the class
        program's ``ops`` (what :meth:`peer_issue` names on other replicas).
        With several real ranks the real rank may run ahead of its class,
        which waits for its peers' arrivals."""
        if self._multi is not None:
            handle = self._multi.local_issue(spec, arrival)
            self._loop.advance()
            return handle
        real = self._loop.real
        if real is None:
            raise _no_real_rank()
        state = self._states[real.class_id]
        events = state.events
        found = self._next_issues.get(id(events))
        if found is None or found[0] is not events:
            found = self._next_issues[id(events)] = (events, next_issues(events))
        index = found[1][max(state.pc, real.allowed + 1)]
        expected = state.program.ops[events[index].op] if index is not None else None
        check_follows(expected, spec, state.iteration, real.rank)
        assert index is not None, "check_follows refuses an issue the program does not have"
        real.allowed = index
        real.pending = (index, arrival)
        self._loop.advance()
        return state.iteration, events[index].op

    def real_completion(self, handle: tuple[int, int]) -> float:
        """When the real rank's op completes: inf while it cannot yet (its peers
        have not issued their side, or never will: a failed peer; with
        several real ranks, also while an arrival it depends on has not been
        fed).  Once finite, the answer never changes."""
        iteration, op = handle
        real = self._loop.real
        if real is None:
            raise _no_real_rank()
        state = self._states[real.class_id]
        if not (self._loop.settled and self._loop.real_shortcuts):
            self._loop.advance()  # (else the last advance went as far as any would)
        done = state.done.get(op) if state.iteration == iteration else real.done.get(handle)
        if done is None:
            return math.inf
        if type(done) is float:
            return done
        return at(done, real.index, self.class_shape)

    def last_arrival(self, handle: tuple[int, int]) -> tuple[int, float] | None:
        """Who arrived last at one of the real rank's ops, and when (None once
        its iteration is over).  For p2p it is the peer; for a group op the
        member of the real rank's group with the latest arrival."""
        iteration, op_index = handle
        real = self._loop.real
        if real is None:
            raise _no_real_rank()
        state = self._states[real.class_id]
        info = state.ops[op_index]
        if state.iteration != iteration or op_index not in state.arrivals:
            return None
        if info.spec.is_p2p:
            return real.last.get(op_index)
        if info.spans_classes:
            found = real.spanning.get(op_index)
            if found is None:
                return None
            full, axes, unsampled = found
            # the class axis leads ``full``; the group varies it and ``axes``
            index: list[int | slice] = [slice(None), *real.index]
            for axis in axes:
                index[1 + axis] = slice(None)
            group = np.broadcast_to(full, (len(self._states), *self.class_shape))[tuple(index)]
            offsets = np.unravel_index(int(np.argmax(group)), group.shape)
            coords = list(real.index)
            for axis, offset in zip(axes, offsets[1:], strict=True):
                coords[axis] = int(offset)
            if unsampled is not None:  # each class's unsampled columns' max
                maxima = [at(m, real.index, self.class_shape) for m in unsampled]
                latest = int(np.argmax(maxima))
                if maxima[latest] > group.max():
                    return self._unsampled_rank(latest, coords, real), maxima[latest]
            return self._rank_of(int(offsets[0]), coords), float(group.max())
        arrival = arrivals_of(state, real, op_index, self.class_shape)
        index = list(real.index)
        for axis in info.axes:
            index[axis] = slice(None)
        group = arrival[tuple(index)]
        offsets = np.unravel_index(int(np.argmax(group)), group.shape)
        coords = list(real.index)
        for axis, offset in zip(info.axes, offsets, strict=True):
            coords[axis] = int(offset)
        if info.population:  # the group's unsampled columns may have arrived later
            everyone = at(self._loop.group_max(state, arrival, info, op_index), real.index,
                          self.class_shape)
            if everyone > group.max():
                return self._unsampled_rank(state.program.class_id, coords, real), everyone
        return self._rank_of(state.program.class_id, coords), float(group.max())

    def _rank_of(self, class_id: int, internal_coords: Sequence[int]) -> int:
        base = self.real_rank if self.real_rank is not None else 0
        return self._layout.rank_of(class_id, internal_coords, base)

    def _unsampled_rank(self, class_id: int, internal_coords: Sequence[int],
                        real: RealRank) -> int:
        """The rank named when an unsampled column arrived last: the first
        unsampled column's, at the ``real`` rank's place off the columns' axis."""
        return self._layout.unsampled_rank(class_id, internal_coords, real.rank)

    def real_op(self, handle: tuple[int, int]) -> OpSpec:
        real = self._loop.real
        if real is None:
            raise _no_real_rank()
        return self._states[real.class_id].program.ops[handle[1]]

    def real_iteration_end(self) -> None:
        """The real rank finished an iteration: its class may run to the end."""
        if self._multi is not None:
            self._multi.local_iteration_end()
            self._loop.advance()
            return
        real = self._loop.real
        if real is None:
            raise _no_real_rank()
        state = self._states[real.class_id]
        events = state.events
        skipped = next((e for e in events[max(state.pc, real.allowed + 1):]
                        if e.action == "issue"), None)
        check_follows(None if skipped is None else state.program.ops[skipped.op], None,
                      state.iteration, real.rank)
        real.allowed = len(events) - 1
        self._loop.advance()
        real.allowed = -1

    # -- several real ranks ----------------------------------------------------------

    def peer_issue(self, rank: int, iteration: int, op_index: int, arrival: float) -> None:
        """Another real rank, ``rank``, issued op ``op_index`` of ``iteration``
        at ``arrival`` (job time).  ``op_index`` is the op's index in the
        ``ops`` of ``rank``'s class program (0-based; ``program.events(
        iteration)`` issues it), the second element of the handle
        :meth:`real_issue` returned on ``rank``'s own replica.  Any order
        with the local rank's calls and other feeds; a repeat of a known
        arrival is ignored, a different one is a :class:`GraphError`."""
        self._peers().peer_issue(rank, iteration, op_index, arrival)
        self._loop.advance()

    def peer_iteration_end(self, rank: int, iteration: int) -> None:
        """Another real rank ended ``iteration`` (after issuing all its ops:
        their arrivals may still come after this call)."""
        self._peers().peer_iteration_end(rank, iteration)
        self._loop.advance()

    def completion(self, rank: int, iteration: int, op_index: int) -> float:
        """When op ``op_index`` of ``iteration`` of real rank ``rank`` (this
        engine's or a peer's) completes, as :meth:`real_completion` answers:
        inf while not known (yet).  An op's completion is kept until its
        class ends the second iteration after the op's (ask before then)."""
        if rank not in self.real_ranks:
            raise GraphError(f"rank {rank} is not a real rank of this engine "
                             f"({list(self.real_ranks)})")
        if self._multi is None:
            return self.real_completion((iteration, op_index))
        if not self._loop.settled:
            self._loop.advance()
        return self._multi.completion(rank, iteration, op_index, self.class_shape)

    def _peers(self) -> RealRanks:
        if self._multi is None:
            raise GraphError("this engine follows one real rank: it has no peers to be fed")
        return self._multi

    # -- records -----------------------------------------------------------------------

    def ops_of(self, rank: int, iteration: int) -> list[tuple[OpSpec, float, float]]:
        """(op, arrival, done) of ``rank`` in ``iteration``, from the records
        (``record=True``): what the trace shows of a virtual rank."""
        ops = self._states[self.graph.class_of(rank)].program.ops
        return [(ops[index], arrival, done)
                for index, (arrival, done, _) in self.op_times(rank, iteration).items()]

    def op_times(self, rank: int, iteration: int
                 ) -> dict[int, tuple[float, float, tuple[int, int] | None]]:
        """Op index -> (arrival, done, cause) of ``rank`` in ``iteration``, from
        the records (``record=True``); ``cause`` is :attr:`OpTiming.cause`."""
        class_id = self.graph.class_of(rank)
        coords = self._layout.local_coordinates(rank)
        local_shape = self._layout.local_shape
        return {record.op: (at(record.arrival, coords, local_shape),
                            at(record.done, coords, local_shape), record.cause)
                for record in self.records
                if record.class_id == class_id and record.iteration == iteration
                and record.arrival is not None}

    def forget_records(self, before_iteration: int) -> None:
        self.records = [r for r in self.records if r.iteration >= before_iteration]

    # -- pure replay -------------------------------------------------------------------

    def run(self, iterations: int) -> None:
        """Replay until every class has finished ``iterations`` iterations."""
        if self.real_rank is not None:
            raise GraphError("run() replays the whole world; this engine follows a real rank")
        self._loop.target = iterations
        self._loop.advance()
        stuck = [s.program.class_id for s in self._states if s.iteration <= iterations]
        if stuck:
            raise GraphError(f"the replay cannot progress: classes {stuck} wait on ops no "
                             f"other class issues (the programs do not match)")

    def describe(self, rank: int) -> dict[str, object]:
        """What the engine knows of one rank: its class, place in the mesh and
        on the nodes, its last finished iteration, and what perturbs it."""
        times = self.iteration_times(rank)
        return {"rank": rank, "node": rank // self.graph.gpus_per_node,
                "class": self.graph.class_of(rank),
                "coords": dict(zip(self.mesh.names, self.mesh.coordinates(rank), strict=True)),
                "time_ms": times[-1] * 1e3 if times else None,
                "perturbations": self._windows.describe(rank)}

    def iteration_starts(self, rank: int) -> list[float]:
        """When each iteration of ``rank`` began, and when its last finished one ended."""
        state = self._states[self.graph.class_of(rank)]
        coords = self._layout.internal_coordinates(rank)
        return [at(s, coords, self.class_shape) for s in state.iteration_starts]

    def iteration_times(self, rank: int) -> list[float]:
        """Durations of the finished iterations of ``rank``."""
        starts = self.iteration_starts(rank)
        return [b - a for a, b in zip(starts, starts[1:], strict=False)]


def _no_real_rank() -> GraphError:
    """What the real rank's interface raises on an engine that follows none."""
    return GraphError("this engine follows no real rank: give ReplayEngine a real_rank")
