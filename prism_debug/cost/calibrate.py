"""Fit a hardware profile to measurements (pure: parsing and arithmetic).

Measurements are (op, bytes, seconds) samples on a group of ``num_ranks``
ranks over ``num_nodes`` nodes: parsed from nccl-tests output, or measured
with real gloo collectives on this host (``runner/local_bench.py``).  The
model's form is kept (``time = latency + bytes × factor / bandwidth``): a
fit sets the bandwidth from the largest messages and rescales the latency
constants so the model reproduces the smallest messages' time.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from prism_debug.cost.model import CostModel, Placement, bus_factor
from prism_debug.cost.profile import HardwareProfile
from prism_debug.errors import ConfigError

NCCL_TESTS_OPS = {
    "all_reduce": "all_reduce", "allreduce": "all_reduce",
    "all_gather": "all_gather", "allgather": "all_gather",
    "reduce_scatter": "reduce_scatter", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "all_to_all": "all_to_all",
    "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send",
}
SMALL_BYTES = 64 * 1024  # latency-dominated
LARGE_SHARE = 3  # the largest sizes set the bandwidth


@dataclasses.dataclass(frozen=True)
class Measurements:
    op: str
    num_ranks: int
    num_nodes: int
    samples: tuple[tuple[int, float], ...]  # (bytes, seconds)
    source: str

    @property
    def placement(self) -> Placement:
        per_node = -(-self.num_ranks // self.num_nodes)
        return Placement(self.num_ranks, self.num_nodes, per_node)

    def latency_s(self) -> float:
        small = [t for size, t in self.samples if size <= SMALL_BYTES]
        return min(small) if small else min(t for _, t in self.samples)

    def bus_bandwidth(self) -> float:
        """Bytes/s in the nccl-tests convention, from the largest messages."""
        factor = bus_factor(self.op, self.num_ranks)
        largest = sorted(self.samples)[-LARGE_SHARE:]
        return max(size * factor / t for size, t in largest if t > 0)


def parse_nccl_tests(text: str, source: str, op: str | None = None) -> Measurements:
    """An nccl-tests ``*_perf`` output: out-of-place times per size, and the
    ranks and hosts from its ``# Rank`` lines."""
    op = op or _op_from_name(source)
    hosts, ranks, time_column, samples = set(), 0, None, []
    for line in text.splitlines():
        stripped = line.strip()
        rank = re.match(r"#\s*Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)", stripped)
        if rank:
            hosts.add(rank.group(1))
            ranks += 1
            continue
        if stripped.startswith("#"):
            tokens = stripped.lstrip("#").split()
            if "size" in tokens and "time" in tokens and time_column is None:
                time_column = tokens.index("time")
            continue
        tokens = stripped.split()
        if time_column is None or len(tokens) <= time_column or not tokens[0].isdigit():
            continue
        samples.append((int(tokens[0]), float(tokens[time_column]) * 1e-6))
    if not samples:
        raise ConfigError(f"{source}: no nccl-tests results found (expected the table "
                          "printed by all_reduce_perf and friends)")
    if ranks == 0:
        raise ConfigError(f"{source}: no '# Rank … on HOST' lines, so the ranks and nodes of "
                          "the run are unknown; keep the whole nccl-tests output")
    return Measurements(op, ranks, len(hosts), tuple(samples), source)


def _op_from_name(source: str) -> str:
    name = Path(source).name.lower()
    for key in sorted(NCCL_TESTS_OPS, key=len, reverse=True):
        if key in name:
            return NCCL_TESTS_OPS[key]
    raise ConfigError(f"cannot tell the collective of {source} from its name: give it as "
                      f"OP=PATH (OP one of {', '.join(sorted(set(NCCL_TESTS_OPS.values())))})")


def fit(base: HardwareProfile, measurements: list[Measurements], name: str) -> HardwareProfile:
    """``base`` with bandwidths and latency scales fitted to ``measurements``."""
    profile = dataclasses.replace(base, name=name, sources=tuple(m.source for m in measurements),
                                  description=f"fitted by prism-debug calibrate from {base.name}")
    for m in sorted(measurements, key=lambda m: m.num_nodes):  # intra-node first
        bandwidth = m.bus_bandwidth()
        if m.num_nodes == 1:
            field = "nvls_bw" if (m.op == "all_reduce" and m.num_ranks == base.gpus_per_node
                                  and base.nvls_bw > base.nvlink_bw) else "nvlink_bw"
            profile = dataclasses.replace(profile, **{field: bandwidth})
        else:
            per_node = m.placement.ranks_per_node
            nic = bandwidth / (1 if m.op == "all_to_all" else per_node)
            profile = dataclasses.replace(profile, nic_bw=nic)
        predicted = CostModel(profile).estimate(m.op, min(s for s, _ in m.samples), m.placement)
        if predicted.time_s > 0:
            profile = _scale_latency(profile, m.latency_s() / predicted.time_s,
                                     inter=m.num_nodes > 1)
    return profile


def _scale_latency(profile: HardwareProfile, scale: float, inter: bool) -> HardwareProfile:
    fields = ("net_ring", "net_tree", "nvls_tree_net_lat") if inter else (
        "base_ring", "base_tree", "nvlink_ring", "nvlink_tree", "nvls_lat")
    changes = {}
    for field in fields:
        value = getattr(profile, field)
        changes[field] = tuple(v * scale for v in value) if isinstance(value, tuple) else value * scale
    return dataclasses.replace(profile, **changes)


def local_profile(all_reduce: Measurements, p2p: Measurements, name: str) -> HardwareProfile:
    """A profile for ranks on this host talking through gloo: one "node" of
    ``num_ranks`` ranks, Simple ring only (LL, LL128 and NVLS are NCCL's)."""
    n = all_reduce.num_ranks
    bandwidth = min(all_reduce.bus_bandwidth(), p2p.bus_bandwidth())
    ar_latency, p2p_latency = all_reduce.latency_s(), p2p.latency_s()
    # ring all-reduce: base + 2(n-1)·hop;  p2p: base + hop
    hop = max(0.0, (ar_latency - p2p_latency) / max(1, 2 * (n - 1) - 1))
    base = max(0.0, p2p_latency - hop)
    never = 1.0  # a second: LL, LL128 and NVLS never win
    return HardwareProfile(
        name=name, description=f"gloo between {n} processes on this host, measured",
        gpus_per_node=n, sources=(all_reduce.source, p2p.source),
        nvlink_bw=bandwidth, nvls_bw=bandwidth, nic_bw=bandwidth, tree_factor=1.0,
        base_ring=(never, never, base), base_tree=(never, never, base),
        nvlink_ring=(0.0, 0.0, hop), nvlink_tree=(0.0, 0.0, hop),
        net_ring=(0.0, 0.0, hop), net_tree=(0.0, 0.0, hop),
        nvls_lat=never, nvls_tree_net_lat=never,
        protocol_efficiency=(1.0, 1.0, 1.0), ll_max_bw=(math.inf,) * 3)


def to_toml(profile: HardwareProfile) -> str:
    """The profile as a TOML file ``load_profile`` reads back."""
    def micros(values) -> str:
        return "[" + ", ".join(f"{v * 1e6:.6g}" for v in values) + "]"

    def gbs(value: float) -> str:
        return "inf" if math.isinf(value) else f"{value / 1e9:.6g}"

    sources = ",\n".join(f"  {s!r}" for s in profile.sources)
    return f"""# Written by prism-debug calibrate.
name = {profile.name!r}
description = {profile.description!r}
gpus_per_node = {profile.gpus_per_node}
sources = [
{sources}
]

[bandwidth_gbs]
nvlink = {gbs(profile.nvlink_bw)}
nvls = {gbs(profile.nvls_bw)}
nic = {gbs(profile.nic_bw)}
tree_factor = {profile.tree_factor}
ll_max_1node = {gbs(profile.ll_max_bw[0])}
ll_max_2nodes = {gbs(profile.ll_max_bw[1])}
ll_max_3nodes = {gbs(profile.ll_max_bw[2])}

[latency_us]
base_ring = {micros(profile.base_ring)}
base_tree = {micros(profile.base_tree)}
nvlink_ring = {micros(profile.nvlink_ring)}
nvlink_tree = {micros(profile.nvlink_tree)}
net_ring = {micros(profile.net_ring)}
net_tree = {micros(profile.net_tree)}
nvls = {profile.nvls_lat * 1e6:.6g}
nvls_tree_net = {profile.nvls_tree_net_lat * 1e6:.6g}

[protocol_efficiency]
ll = {profile.protocol_efficiency[0]}
ll128 = {profile.protocol_efficiency[1]}
simple = {profile.protocol_efficiency[2]}
"""


def fit_table(model: CostModel, measurements: list[Measurements]) -> list[str]:
    """How well ``model`` reproduces ``measurements``: the smallest and largest
    message of each, measured against predicted (``prism-debug calibrate``)."""
    lines = [f"{'op':>14} {'ranks':>6} {'nodes':>6} {'bytes':>10} {'measured us':>12} "
             f"{'model us':>10} {'error':>7}"]
    for m in measurements:
        for nbytes, seconds in (min(m.samples), max(m.samples)):
            predicted = model.estimate(m.op, nbytes, m.placement).time_s
            lines.append(f"{m.op:>14} {m.num_ranks:>6} {m.num_nodes:>6} {nbytes:>10} "
                         f"{seconds * 1e6:>12.1f} {predicted * 1e6:>10.1f} "
                         f"{100 * (predicted - seconds) / seconds:>+6.1f}%")
    return lines
