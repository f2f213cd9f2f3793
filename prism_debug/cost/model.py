"""NCCL-style collective cost model.

``time = latency(algorithm, protocol, steps) + bytes * factor / bus_bandwidth``

* ``bytes`` follows nccl-tests' "size": the all-reduce buffer, the all-gather
  *output*, the reduce-scatter *input*, the whole all-to-all buffer.
* ``factor`` is nccl-tests' bus-bandwidth factor (2(n-1)/n for all-reduce,
  (n-1)/n for all-gather / reduce-scatter / all-to-all, 1 otherwise), so the
  busbw this model reports is directly comparable with nccl-tests output.
* Like NCCL's tuner, the model evaluates every algorithm (ring, tree, NVLS,
  NVLS-tree) and protocol (LL, LL128, Simple) that applies to the op and the
  group's placement, and takes the fastest.  Latency constants follow
  ``src/graph/tuning.cc``: ring latency grows with the number of steps, tree
  latency with log2(nodes), which is why a ring-only model is wrong at scale.
* Bandwidth depends on the node count as in NCCL's per-node-count columns
  (1 node, 2 nodes, 3+ nodes): on two nodes a tree (or NVLS-tree) crosses the
  network with half the data, so it can reach twice the NICs' bandwidth
  (NVIDIA/nccl#209, nccl-tests#196); from three nodes on it cannot.  Beyond
  that, a profile may lose a share of its network bandwidth per doubling of
  nodes (``net_scale_loss``: a fabric's congestion, which calibration fits).
* A profile measured on one node (``calibrate --local``) carries per-op
  least-squares fits, used as measured for groups on one node.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterator
from typing import Protocol

from prism_debug.cost.hardware import LL, LL128, SIMPLE, HardwareProfile, OpFit
from prism_debug.cost.ops import COLLECTIVES, op_name
from prism_debug.errors import ConfigError

_PROTOCOLS = (LL, LL128, SIMPLE)
_PROTOCOL_NAMES = ("LL", "LL128", "Simple")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a group's ranks sit: what the cost of a collective depends on."""

    num_ranks: int
    num_nodes: int
    ranks_per_node: int  # the most ranks the group has on any one node
    fewest_per_node: int = 0  # the fewest on any of its nodes (0: as many as the most)

    def __post_init__(self) -> None:
        if not self.fewest_per_node:
            object.__setattr__(self, "fewest_per_node", self.ranks_per_node)

    @classmethod
    def of(cls, global_ranks: Collection[int], gpus_per_node: int) -> Placement:
        per_node: dict[int, int] = {}
        for rank in global_ranks:
            node = rank // gpus_per_node
            per_node[node] = per_node.get(node, 0) + 1
        counts = per_node.values()
        return cls(len(global_ranks), len(per_node), max(counts, default=0),
                   min(counts, default=0))

    @classmethod
    def pair(cls, rank_a: int, rank_b: int, gpus_per_node: int) -> Placement:
        same_node = rank_a // gpus_per_node == rank_b // gpus_per_node
        return cls(2, 1 if same_node else 2, 2 if same_node else 1)


@dataclasses.dataclass(frozen=True)
class Estimate:
    op: str
    nbytes: int
    placement: Placement
    time_s: float
    busbw_gbs: float
    algorithm: str
    protocol: str

    def describe(self, hardware: str) -> str:
        """``all_reduce of 1073741824 bytes on 64 ranks (8 node(s) x 8) on h100-ib400:
        5731.2 us, busbw 368.8 GB/s (nvls_tree/Simple)`` (``prism-debug cost``)."""
        pl = self.placement
        return (f"{self.op} of {self.nbytes} bytes on {pl.num_ranks} ranks ({pl.num_nodes} "
                f"node(s) x {pl.ranks_per_node}) on {hardware}: {self.time_s * 1e6:.1f} us, "
                f"busbw {self.busbw_gbs:.1f} GB/s ({self.algorithm}/{self.protocol})")


class PricedOp(Protocol):
    """What pricing needs of an op: its collective and its size
    (:class:`prism_debug.graph.OpSpec` is one)."""

    @property
    def kind(self) -> str: ...

    @property
    def nbytes(self) -> int: ...


def bus_factor(op: str, num_ranks: int) -> float:
    """nccl-tests' busbw = algbw * factor (doc/PERFORMANCE.md)."""
    n = num_ranks
    if op in ("all_reduce", "barrier"):
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


class CostModel:
    """Predicts how long one collective takes on a hardware profile."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.is_free = profile.is_free

    def time_s(self, op: str, nbytes: int, placement: Placement) -> float:
        """Seconds one ``op`` of ``nbytes`` takes on a group with ``placement``.
        (Engines memoise this per group: a training loop repeats a few sizes.)"""
        return self.estimate(op, nbytes, placement).time_s

    def op_time_s(self, op: PricedOp, placement: Placement) -> float:
        """Seconds ``op`` takes on a group with ``placement``: the cost
        function the replay engine takes (``ReplayEngine(graph, model.op_time_s)``)."""
        return self.time_s(op.kind, op.nbytes, placement)

    def estimate(self, op: str, nbytes: int, placement: Placement) -> Estimate:
        if op not in COLLECTIVES:
            op = op_name(op)  # another spelling of one (allreduce), or one error naming them
        if nbytes < 0:
            raise ConfigError(f"nbytes must be >= 0, got {nbytes}")
        n = placement.num_ranks
        if n <= 1 or self.is_free:
            return Estimate(op, nbytes, placement, 0.0, math.inf, "local", "-")
        # NCCL implements a barrier as an all-reduce of one element.
        priced_op, priced_bytes = ("all_reduce", 4) if op == "barrier" else (op, nbytes)
        fit = self.profile.op_fit("send" if priced_op == "recv" else priced_op)
        if fit is not None and placement.num_nodes == 1:
            time_s, algorithm, protocol = _fitted(fit, priced_op, priced_bytes, n)
        else:
            time_s, algorithm, protocol = min(self._candidates(priced_op, priced_bytes, placement))
        factor = bus_factor(op, n)
        busbw = nbytes * factor / time_s / 1e9 if time_s > 0 else math.inf
        return Estimate(op, nbytes, placement, time_s, busbw, algorithm, protocol)

    # -- algorithms ----------------------------------------------------------

    def _net_bw(self, nics: int, nodes: int) -> float:
        """Network bandwidth of ``nics`` NICs in a group over ``nodes`` nodes,
        less ``net_scale_loss`` per doubling of nodes beyond two."""
        doublings = max(0.0, math.log2(nodes) - 1)
        # a float: typeshed types float ** float as Any (a negative base gives
        # a complex), and 1 - net_scale_loss is in (0, 1]
        kept: float = (1 - self.profile.net_scale_loss) ** doublings
        return nics * self.profile.nic_bw * kept

    def _candidates(self, op: str, nbytes: int, pl: Placement
                    ) -> Iterator[tuple[float, str, str]]:
        p = self.profile
        n, k, m = pl.num_ranks, pl.num_nodes, pl.ranks_per_node
        factor = bus_factor(op, n)
        # Across nodes a ring is as fast as the node with the fewest NICs in it.
        net_bw = self._net_bw(pl.fewest_per_node, k) if k > 1 else math.inf
        ring_bw = min(p.nvlink_bw, net_bw)
        ll_cap = p.ll_max_bw[min(k, 3) - 1]

        if op in ("send", "recv"):
            bw = p.nvlink_bw if k == 1 else self._net_bw(1, k)
            hop = p.nvlink_ring if k == 1 else p.net_ring
            for proto in _PROTOCOLS:
                lat = p.base_ring[proto] + hop[proto]
                yield (self._time(lat, nbytes, 1.0, bw, proto, ll_cap), "p2p",
                       _PROTOCOL_NAMES[proto])
            return

        if op == "all_to_all":
            # Every rank exchanges with every other; traffic leaving the node is
            # limited to about one NIC per GPU (NCCL cannot aggregate NICs here).
            intra = nbytes * (m - 1) / n
            inter = nbytes * (n - m) / n
            hop = p.nvlink_ring if k == 1 else p.net_ring
            lat = p.base_ring[SIMPLE] + hop[SIMPLE]
            xfer = max(intra / p.nvlink_bw, inter / self._net_bw(1, k) if inter else 0.0)
            yield lat + xfer, "p2p", "Simple"
            return

        if op in ("broadcast", "reduce"):
            # A pipelined chain on the ring's channels: tuning.cc charges one
            # hop of latency, not one per rank.
            hop = p.nvlink_ring if k == 1 else p.net_ring
            for proto in _PROTOCOLS:
                lat = p.base_ring[proto] + hop[proto]
                yield (self._time(lat, nbytes, factor, ring_bw, proto, ll_cap), "ring",
                       _PROTOCOL_NAMES[proto])
            return

        # Ring: nsteps sequential hops; those crossing a node boundary pay the
        # network hop latency (tuning.cc: nInterSteps).
        if op == "all_reduce":
            steps, inter_steps = 2 * (n - 1), (2 * (k - 1) if k > 1 else 0)
        else:
            steps, inter_steps = n - 1, (k - 1 if k > 1 else 0)
        for proto in _PROTOCOLS:
            lat = (p.base_ring[proto] + (steps - inter_steps) * p.nvlink_ring[proto]
                   + inter_steps * p.net_ring[proto])
            yield (self._time(lat, nbytes, factor, ring_bw, proto, ll_cap), "ring",
                   _PROTOCOL_NAMES[proto])

        if op != "all_reduce":
            return
        # On two nodes a tree sends half the data over the network (the other
        # half stays on NVLink), so it can run at twice the NICs' bandwidth;
        # NCCL's tuning takes the intra-node speed for 1-2 nodes.
        tree_net = 2 * net_bw if k == 2 and pl.fewest_per_node > 1 else net_bw
        if k > 1:
            # Double binary tree between nodes, chain inside each node.
            depth = math.log2(k)
            for proto in _PROTOCOLS:
                lat = p.base_tree[proto] + 2 * (
                    (m - 1) * p.nvlink_tree[proto] + depth * p.net_tree[proto]
                )
                bw = min(p.nvlink_bw, tree_net) * p.tree_factor
                yield (self._time(lat, nbytes, factor, bw, proto, ll_cap), "tree",
                       _PROTOCOL_NAMES[proto])
        if pl.fewest_per_node == p.gpus_per_node and m > 1 and p.nvls_bw > 0:
            # NVLink SHARP: the switch reduces, inside a node (NVLS) or as the
            # intra-node half of NVLS-tree across nodes.
            if k == 1:
                lat, bw, name = p.nvls_lat, p.nvls_bw, "nvls"
            else:
                lat = p.nvls_lat + 2 * math.log2(k) * p.nvls_tree_net_lat
                bw, name = min(p.nvls_bw, tree_net), "nvls_tree"
            yield self._time(lat, nbytes, factor, bw, SIMPLE, ll_cap), name, "Simple"

    def _time(self, lat: float, nbytes: int, factor: float, bw: float, proto: int,
              ll_cap: float) -> float:
        bw *= self.profile.protocol_efficiency[proto]
        if proto == LL:
            bw = min(bw, ll_cap)  # tuning.cc's llMaxBws: LL stops scaling early
        return lat + nbytes * factor / bw


def _fitted(fit: OpFit, op: str, nbytes: int, n: int) -> tuple[float, str, str]:
    """``op`` priced from its one-node fit, measured on ``fit.ranks`` ranks: on
    ``n`` ranks the latency scales with the ring's sequential steps."""
    bus_bytes = nbytes * bus_factor(op, n)
    latency = fit.latency_s(bus_bytes) * _steps(op, n) / _steps(op, fit.ranks)
    time_s = latency + fit.transfer_s(bus_bytes)
    return time_s, ("p2p" if op in ("send", "recv") else "ring"), "Simple"


def _steps(op: str, n: int) -> int:
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return n - 1
    return 1  # point-to-point, and pipelined chains (broadcast, reduce)
