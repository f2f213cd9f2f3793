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

(``loop`` below is the :class:`~prism_debug.engine.loop.EventLoop`, which
imports this module: unannotated, to keep the imports one way.)"""

from __future__ import annotations

import numpy as np

from prism_debug.engine.state import ClassState, OpInfo
from prism_debug.graph.execution import Event, ExecutionGraph, OpSpec


def issue_alone(loop, state: ClassState, op_index: int, info: OpInfo) -> bool:
    """Complete the real rank's collective inside its class from the class's
    times (while they agree within its groups) and the real rank's arrival;
    False (nothing done) when the full per-rank path must take it."""
    real = loop.real
    arrival = real.pending[1]
    if not info.shared:  # a group of the real rank alone ends at its arrival
        return False
    now = loop._now(state)
    if now.__class__ is float:
        peers = last = now
        plan = _plan(loop, info.axes, None)
    elif isinstance(now, np.ndarray):
        plan = _plan(loop, info.axes, now.shape)
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


def _plan(loop, axes: tuple[int, ...], shape: tuple[int, ...] | None):
    """For an op on ``axes`` of a class whose times have ``shape`` (None: a
    scalar): where the real rank's group max is in the group maxima, the
    shape of group maxima and the real rank's group in it (None, None: one
    group); None when the real rank's element of the times may be its own
    alone in its group.  (Worked out once per layout.)"""
    key = (axes, shape)
    plans = loop.real.plans
    if key in plans:
        return plans[key]
    index = loop.real.index
    class_shape = loop.layout.class_shape
    plan = None
    if shape is None or (len(shape) == len(class_shape) and any(
            shape[a] == 1 < class_shape[a] for a in axes)):
        reduced = class_shape if shape is None else shape
        at_peers = tuple(0 if a in axes or n == 1 else i
                         for a, (i, n) in enumerate(zip(index, reduced)))
        if all(class_shape[a] == 1 for a in range(len(class_shape)) if a not in axes):
            plan = (at_peers, None, None)
        else:
            plan = (at_peers, tuple(1 if a in axes else n for a, n in enumerate(class_shape)),
                    tuple(0 if a in axes else i for a, i in enumerate(index)))
    plans[key] = plan
    return plan


def with_real(arrival, shape: tuple[int, ...], loop, op_index: int) -> np.ndarray:
    """The class's arrivals with the real rank's written in (the full path)."""
    real = loop.real
    full = np.empty(shape)
    full[...] = arrival  # (cheaper than np.array(np.broadcast_to(...)))
    full[real.index] = real.arrivals[op_index] = real.pending[1]
    real.pending = None
    return full


def arrivals_of(state: ClassState, real, op_index: int, shape: tuple[int, ...]) -> np.ndarray:
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
