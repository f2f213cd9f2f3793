"""The replay engine behind the backend's Engine seam (``run --graph``).

The backend asks, per op, when it completes.  With a graph that answer can
depend on ops the real rank has not issued yet (a ``batch_isend_irecv``
issues a receive before the send the other stage needs first), so the
completion time is a deferred value the Work resolves when the script waits.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import NoReturn, Protocol

from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph import ExecutionGraph, GraphError, GroupRef, OpSpec


class DeferredCompletion:
    """A completion time the replay engine gives once it can."""

    __slots__ = ("replay", "handle", "last")

    def __init__(self, replay: ReplayEngine, handle: tuple[int, int]) -> None:
        self.replay = replay
        self.handle = handle
        # who arrived last, kept at its iteration's end (GraphEngine.keep_last_arrivals)
        self.last: tuple[int, float] | None | _Unknown = _UNKNOWN

    def __call__(self) -> float:
        return self.replay.real_completion(self.handle)


class _Unknown:
    """Not kept (yet): ask the replay engine."""


_UNKNOWN = _Unknown()


class Exchange(Protocol):
    """Where a rank among several real ones tells the others its arrivals
    and iteration ends (agent/real.py's ArrivalExchange)."""

    def issued(self, iteration: int, op: int, arrival: float) -> None: ...

    def iteration_ended(self, iteration: int) -> None: ...


class GraphStream:
    __slots__ = ("family", "peer", "specs")

    def __init__(self, family: str, peer: int = 0) -> None:
        self.family = family
        self.peer = peer  # p2p: steps along the family's axis
        # (op, nbytes) -> its OpSpec: a frozen dataclass costs ~2 µs to make,
        # and a training loop repeats a handful of them
        self.specs: dict[tuple[str, int], OpSpec] = {}


class GraphEngine:
    def __init__(self, graph: ExecutionGraph, replay: ReplayEngine,
                 on_mismatch: Callable[[GraphError], None] | None = None) -> None:
        self.graph = graph
        self.replay = replay
        # the agent ends the rank with one clear error rather than letting the
        # exception unwind through the script (and torch's C++ callers)
        self._on_mismatch = on_mismatch
        # Who arrived last at an op is the replay engine's only while the op's
        # iteration runs; the console's timeline asks once it is over.  Set,
        # each op's is kept at its iteration's end (the run table's source);
        # the agent sets it once a console talks to the rank.
        self.keep_last_arrivals = False
        self._issued: list[DeferredCompletion] = []
        # several real ranks: where this rank's arrivals and iteration ends are
        # told to the others (``issued(iteration, op, arrival)``,
        # ``iteration_ended(iteration)``; agent/real.py), and its iteration
        self.exchange: Exchange | None = None
        self.iteration = 1
        self.arrivals: dict[int, list[tuple[int, float]]] = {}  # (op, arrival) by iteration

    def _mismatch(self, error: GraphError) -> NoReturn:
        if self._on_mismatch is None:
            raise error
        self._on_mismatch(error)
        raise error

    def group(self, global_ranks: Collection[int], ref: GroupRef) -> GraphStream:
        axes = self.graph.families.get(ref.family)
        if axes is None:
            self._mismatch(GraphError(
                f"the script creates family {ref.family!r}, which the graph does not have "
                f"(graph families: {', '.join(self.graph.families)})"))
        mesh = self.graph.mesh
        rank = self.replay.real_rank
        assert rank is not None, "the graph engine times a real rank"
        expected = mesh.group_ranks(self.graph.family_axes(ref.family), rank)
        if sorted(global_ranks) != expected:
            self._mismatch(GraphError(
                f"family {ref.family!r}: rank {rank}'s group is "
                f"{_ranks(global_ranks)} in the script and {_ranks(expected)} in the graph"))
        return GraphStream(ref.family)

    def peer_stream(self, group: GraphStream, my_rank: int, peer_rank: int) -> GraphStream:
        (axis,) = self.graph.family_axes(group.family)[:1] or (None,)
        stride = self.graph.mesh.strides[axis] if axis is not None else 1
        return GraphStream(group.family, (peer_rank - my_rank) // stride)

    def collective(self, stream: GraphStream, op: str, nbytes: int, arrival: float,
                   batch: int = 0) -> DeferredCompletion:
        # (``batch`` is in the graph already: the real rank follows it)
        spec = stream.specs.get((op, nbytes))
        if spec is None:
            spec = stream.specs[op, nbytes] = OpSpec(op, stream.family, nbytes, peer=stream.peer)
        try:
            handle = self.replay.real_issue(spec, arrival)
        except GraphError as error:
            self._mismatch(error)
        if self.exchange is not None:
            self.exchange.issued(handle[0], handle[1], arrival)
            self.arrivals.setdefault(handle[0], []).append((handle[1], arrival))
        deferred = DeferredCompletion(self.replay, handle)
        if self.keep_last_arrivals:
            self._issued.append(deferred)
        return deferred

    def last_arrival(self, deferred: DeferredCompletion) -> tuple[int, float] | None:
        """(rank, time) of the last arrival at the real rank's op, or None;
        after its iteration's end only when ``keep_last_arrivals`` kept it."""
        last = deferred.last
        if isinstance(last, _Unknown):
            return self.replay.last_arrival(deferred.handle)
        return last

    def kept_last_arrival(self, deferred: DeferredCompletion) -> tuple[int, float] | None:
        """What :meth:`last_arrival` kept at the op's iteration's end, or None;
        never asks the replay engine, so another thread may call it."""
        last = deferred.last
        return None if isinstance(last, _Unknown) else last

    def op_of(self, deferred: DeferredCompletion) -> OpSpec:
        return self.replay.real_op(deferred.handle)

    def iteration_end(self) -> None:
        issued, self._issued = self._issued, []
        for deferred in issued:
            deferred.last = self.replay.last_arrival(deferred.handle)
        try:
            self.replay.real_iteration_end()
        except GraphError as error:
            self._mismatch(error)
        if self.exchange is not None:
            self.exchange.iteration_ended(self.iteration)
        self.iteration += 1


def _ranks(ranks: Iterable[int]) -> str:
    ranks = sorted(ranks)
    if len(ranks) > 6:
        return f"[{ranks[0]}, {ranks[1]}, … {ranks[-1]}] ({len(ranks)} ranks)"
    return str(ranks)
