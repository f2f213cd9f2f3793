"""Timing of the virtual peers (pure core: no torch, CRIU or ZeroMQ).

:class:`Engine` is the seam the torch backend depends on; the lockstep engine
serves it by default, and with ``prism-debug run --graph`` the graph engine
(:mod:`prism_debug.engine.graph_engine`) serves it from the replay engine
(:mod:`prism_debug.engine.replay`), which replays every virtual peer from an
execution graph; a :class:`ComputeModel` says how long the peers compute.
"""

from collections.abc import Callable, Collection
from typing import Protocol, TypeVar

from prism_debug.engine.clock import EmulatedClock
from prism_debug.engine.compute import ComputeModel, GraphCompute
from prism_debug.engine.lockstep import LockstepEngine, Stream
from prism_debug.engine.replay import ReplayEngine
from prism_debug.engine.state import OpTiming
from prism_debug.graph import GroupRef

# an engine's handle for a group's (or a peer pair's) stream: what it gives
# the backend and takes back (the lockstep engine's Stream, the graph engine's
# GraphStream)
StreamT = TypeVar("StreamT")


class Engine(Protocol[StreamT]):
    def group(self, global_ranks: Collection[int], ref: GroupRef) -> StreamT:
        """A handle for one group the real rank belongs to."""
        ...

    def peer_stream(self, group: StreamT, my_rank: int, peer_rank: int) -> StreamT:
        """A handle for point-to-point traffic with one peer of ``group``."""
        ...

    def collective(self, stream: StreamT, op: str, nbytes: int, arrival: float,
                   batch: int = 0) -> float | Callable[[], float]:
        """Completion time (emulated clock) of an op the real rank entered at
        ``arrival`` (a point-to-point op: issued by the ``batch``-th
        batch_isend_irecv call, or alone: 0), or a zero-argument callable that
        gives it once the script waits (the graph engine's
        ``DeferredCompletion``: it may depend on ops the real rank has not
        issued yet)."""
        ...


__all__ = ["ComputeModel", "EmulatedClock", "Engine", "GraphCompute", "LockstepEngine", "OpTiming",
           "ReplayEngine", "Stream"]
