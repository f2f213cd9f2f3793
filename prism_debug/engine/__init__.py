"""Timing of the virtual peers (pure core: no torch, CRIU or ZeroMQ).

:class:`Engine` is the seam the torch backend depends on; the lockstep engine
serves it now; the replay engine (:mod:`prism_debug.engine.replay`) replays
every virtual peer from an execution graph and will serve it behind the same
seam once ``prism-debug run --graph`` lands.
"""

from typing import Any, Protocol

from prism_debug.engine.clock import EmulatedClock
from prism_debug.engine.lockstep import LockstepEngine, Stream
from prism_debug.engine.replay import OpRecord, ReplayEngine


class Engine(Protocol):
    def group(self, global_ranks, ref) -> Any:
        """A handle for one group the real rank belongs to."""

    def peer_stream(self, group: Any, my_rank: int, peer_rank: int) -> Any:
        """A handle for point-to-point traffic with one peer of ``group``."""

    def collective(self, stream: Any, op: str, nbytes: int, arrival: float) -> float:
        """Completion time (emulated clock) of an op the real rank entered at ``arrival``."""


__all__ = ["EmulatedClock", "Engine", "LockstepEngine", "OpRecord", "ReplayEngine", "Stream"]
