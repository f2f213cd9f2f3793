"""The lockstep engine: every virtual peer arrives when the real rank does.

The first engine behind the :class:`~prism_debug.engine.Engine` seam.  A group
op starts when the real rank arrives and the group's communication stream is
free (NCCL runs one communicator's ops in order on one stream), and costs what
the cost model says for its bytes and the group's placement.  The replay
engine built from a slicing-made execution graph replaces it behind the same
interface.
"""

from __future__ import annotations

from prism_debug.cost import CostModel, Placement
from prism_debug.graph import GroupRef


class Stream:
    """One communicator's in-order stream: when its last op completes."""

    __slots__ = ("placement", "ref", "busy_until", "costs")

    def __init__(self, placement: Placement, ref: GroupRef) -> None:
        self.placement = placement
        self.ref = ref
        self.busy_until = 0.0
        # (op, nbytes) -> seconds: a training loop repeats a handful of these,
        # and this spares the hot path hashing the placement every time.
        self.costs: dict[tuple[str, int], float] = {}


class LockstepEngine:
    def __init__(self, cost: CostModel, gpus_per_node: int) -> None:
        self.cost = cost
        self.gpus_per_node = gpus_per_node

    def group(self, global_ranks, ref: GroupRef) -> Stream:
        return Stream(Placement.of(global_ranks, self.gpus_per_node), ref)

    def peer_stream(self, group: Stream, my_rank: int, peer_rank: int) -> Stream:
        # NCCL point-to-point ops to different peers proceed concurrently, so
        # each (group, peer) pair gets a stream of its own.
        return Stream(Placement.pair(my_rank, peer_rank, self.gpus_per_node), group.ref)

    def collective(self, stream: Stream, op: str, nbytes: int, arrival: float) -> float:
        """Emulated completion time of ``op`` entered by the real rank at ``arrival``."""
        cost = stream.costs.get((op, nbytes))
        if cost is None:
            cost = stream.costs[op, nbytes] = self.cost.time_s(op, nbytes, stream.placement)
        start = arrival if arrival > stream.busy_until else stream.busy_until
        done = start + cost
        stream.busy_until = done
        return done
