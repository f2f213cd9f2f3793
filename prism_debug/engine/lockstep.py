"""The lockstep engine: every virtual peer arrives when the real rank does.

The first engine behind the :class:`~prism_debug.engine.Engine` seam.  A group
op starts when the real rank arrives and the group's communication stream is
free (NCCL runs one communicator's ops in order on one stream), and costs what
the cost model says for its bytes and the group's placement.  Point-to-point
ops follow the replay engine's rule: a lone op on its peer pair's stream, a
batch's ops together on the group's stream of batches.  The replay
engine built from a slicing-made execution graph replaces it behind the same
interface.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from prism_debug.cost import CostModel, Placement
from prism_debug.graph import GroupRef


class Stream:
    """One communicator's in-order stream: when its last op completes."""

    __slots__ = ("placement", "ref", "busy_until", "costs", "batches", "batch", "batch_free",
                 "batch_times")

    def __init__(self, placement: Placement, ref: GroupRef, batches: Stream | None = None) -> None:
        self.placement = placement
        self.ref = ref
        self.busy_until = 0.0
        # (op, nbytes) -> seconds: a training loop repeats a handful of these,
        # and this spares the hot path hashing the placement every time.
        self.costs: dict[tuple[str, int], float] = {}
        # a peer pair's stream: its group's stream of batches (shared by its pairs)
        self.batches = batches
        self.batch = 0  # the batch being issued on this stream
        self.batch_free = 0.0  # when the stream is free for it
        self.batch_times = [0.0, 0.0]  # its last op's issue, its longest op's cost


class LockstepEngine:
    def __init__(self, cost: CostModel, gpus_per_node: int) -> None:
        self.cost = cost
        self.gpus_per_node = gpus_per_node

    def group(self, global_ranks: Collection[int], ref: GroupRef) -> Stream:
        placement = Placement.of(global_ranks, self.gpus_per_node)
        return Stream(placement, ref, Stream(placement, ref))

    def peer_stream(self, group: Stream, my_rank: int, peer_rank: int) -> Stream:
        # ProcessGroupNCCL (without eager init) runs a lone p2p op on a 2-rank
        # communicator per peer pair, with its own stream: ops to different
        # peers proceed concurrently, ops with one peer in issue order.
        return Stream(Placement.pair(my_rank, peer_rank, self.gpus_per_node), group.ref,
                      group.batches)

    def collective(self, stream: Stream, op: str, nbytes: int, arrival: float,
                   batch: int = 0) -> float | Callable[[], float]:
        """Emulated completion time of ``op`` entered by the real rank at
        ``arrival``; ``batch``: the batch_isend_irecv call that issued it (0:
        none).  A batch is one NCCL group on its group's communicator: NCCL
        launches it when its last op is issued, its ops start together once
        that stream is free, and all complete when the longest does (known
        once the batch is issued: the script waits after)."""
        cost = stream.costs.get((op, nbytes))
        if cost is None:
            cost = stream.costs[op, nbytes] = self.cost.time_s(op, nbytes, stream.placement)
        if batch and stream.batches is not None:
            batches = stream.batches
            if batches.batch != batch:
                batches.batch = batch
                batches.batch_free = batches.busy_until
                batches.batch_times = [arrival, cost]
            times, free = batches.batch_times, batches.batch_free
            # (a later op's issue moves the launch: no op may end before it began)
            times[0] = max(times[0], arrival)
            times[1] = max(times[1], cost)
            batches.busy_until = max(times[0], free) + times[1]
            return lambda: max(times[0], free) + times[1]
        start = arrival if arrival > stream.busy_until else stream.busy_until
        done = start + cost
        stream.busy_until = done
        return done
