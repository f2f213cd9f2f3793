"""Hardware profiles: the data a cost model needs about one cluster design.

Profiles are TOML files that cite their sources.  Bundled ones live in
``prism_debug/cost/profiles/``; ``--hardware`` takes a bundled name or a path.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

from prism_debug.errors import HardwareProfileError

BUNDLED_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "h100-ib400"
PROTOCOLS = ("ll", "ll128", "simple")

# Latency lists are indexed by protocol, in NCCL's order.
LL, LL128, SIMPLE = range(3)


@dataclasses.dataclass(frozen=True)
class OpFit:
    """One collective's time measured on one node and fitted by least squares
    (``calibrate --local``): ``latency + bytes × factor / busbw``, where bus
    bytes (bytes × factor) beyond ``knee_bytes`` move at the lower
    ``large_busbw`` (out of cache); ``knee_bytes`` 0: one bandwidth throughout."""

    op: str
    ranks: int
    latency: float  # seconds, at ``ranks`` ranks
    busbw: float  # bytes/s, nccl-tests' bus bandwidth
    knee_bytes: int = 0
    large_busbw: float = 0.0
    # messages of at most ``small_bytes`` bus bytes take ``small_latency``
    # instead (a backend's fast path for tiny messages); 0: none
    small_bytes: int = 0
    small_latency: float = 0.0

    def __post_init__(self) -> None:
        if (self.ranks < 2 or min(self.latency, self.small_latency) < 0 or not self.busbw > 0
                or min(self.knee_bytes, self.small_bytes) < 0):
            raise HardwareProfileError(f"fit for {self.op}: needs ranks >= 2, latency >= 0 and "
                                       f"busbw > 0, got {self}")
        if self.knee_bytes and not self.large_busbw > 0:
            raise HardwareProfileError(f"fit for {self.op}: a knee needs large_busbw > 0")

    def latency_s(self, bus_bytes: float) -> float:
        return self.small_latency if bus_bytes <= self.small_bytes else self.latency

    def transfer_s(self, bus_bytes: float) -> float:
        """Seconds to move ``bus_bytes`` (bytes × the op's bus factor)."""
        if not self.knee_bytes or bus_bytes <= self.knee_bytes:
            return bus_bytes / self.busbw
        return self.knee_bytes / self.busbw + (bus_bytes - self.knee_bytes) / self.large_busbw


@dataclasses.dataclass(frozen=True, kw_only=True)
class HardwareProfile:
    """Bandwidths in bytes/s, latencies in seconds (converted on load)."""

    name: str
    description: str
    gpus_per_node: int
    sources: tuple[str, ...]
    nvlink_bw: float
    nvls_bw: float
    nic_bw: float
    tree_factor: float
    base_ring: tuple[float, float, float]
    base_tree: tuple[float, float, float]
    nvlink_ring: tuple[float, float, float]
    nvlink_tree: tuple[float, float, float]
    net_ring: tuple[float, float, float]
    net_tree: tuple[float, float, float]
    nvls_lat: float
    nvls_tree_net_lat: float
    protocol_efficiency: tuple[float, float, float]
    ll_max_bw: tuple[float, float, float]  # LL's busbw cap on 1, 2 and 3+ nodes
    # Share of the network bandwidth lost per doubling of the node count beyond
    # two nodes (a fabric's congestion at scale; 0 keeps NCCL's flat 3+-node column)
    net_scale_loss: float = 0.0
    op_fits: tuple[OpFit, ...] = ()  # measured collectives on one node (calibrate --local)
    path: str = ""

    def __post_init__(self) -> None:
        if self.gpus_per_node < 1:
            raise HardwareProfileError(f"profile {self.name!r}: gpus_per_node must be >= 1")
        for field in ("nvlink_bw", "nic_bw"):
            if not getattr(self, field) > 0:
                raise HardwareProfileError(f"profile {self.name!r}: {field} must be > 0")
        if not self.nvls_bw >= 0:  # 0: no NVLink SHARP (A100, PCIe, gloo)
            raise HardwareProfileError(f"profile {self.name!r}: nvls_bw must be >= 0")
        if not 0 <= self.net_scale_loss < 1:
            raise HardwareProfileError(
                f"profile {self.name!r}: [scale] net_loss_per_doubling must be in [0, 1)")
        if not all(0 < e <= 1 for e in self.protocol_efficiency):
            raise HardwareProfileError(
                f"profile {self.name!r}: protocol_efficiency values must be in (0, 1]"
            )

    @property
    def is_free(self) -> bool:
        """True when every collective costs nothing (the ``zero`` profile)."""
        lats = (*self.base_ring, *self.base_tree, *self.nvlink_ring, *self.net_ring)
        return math.isinf(self.nvlink_bw) and math.isinf(self.nic_bw) and not any(lats)

    def op_fit(self, op: str) -> OpFit | None:
        return next((fit for fit in self.op_fits if fit.op == op), None)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HardwareProfile":
        data = dict(data)
        for key, value in data.items():
            if isinstance(value, list):
                data[key] = tuple(value)
        data["op_fits"] = tuple(OpFit(**fit) for fit in data.get("op_fits", ()))
        return cls(**data)


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.toml"))


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a bundled profile by name, or a TOML file by path."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = BUNDLED_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise HardwareProfileError(
            f"unknown hardware profile {name_or_path!r}: give a TOML file or one of "
            f"{', '.join(bundled_profiles())}"
        )
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HardwareProfileError(f"cannot read hardware profile {path}: {exc}") from exc
    return _parse(raw, path)


def _parse(raw: dict, path: Path) -> HardwareProfile:
    def get(table: str, key: str):
        try:
            return raw[table][key] if table else raw[key]
        except KeyError:
            where = f"[{table}] " if table else ""
            raise HardwareProfileError(
                f"hardware profile {path}: missing {where}{key}"
            ) from None

    def number(table: str, key: str, kind=float):
        value = get(table, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise HardwareProfileError(
                f"hardware profile {path}: [{table}] {key} must be a number, got {value!r}")
        return kind(value)

    def micros(key: str) -> tuple[float, float, float]:
        value = get("latency_us", key)
        if not (isinstance(value, list) and len(value) == 3
                and all(isinstance(v, (int, float)) for v in value)):
            raise HardwareProfileError(
                f"hardware profile {path}: [latency_us] {key} must be [LL, LL128, Simple] in µs"
            )
        return tuple(float(v) * 1e-6 for v in value)  # type: ignore[return-value]

    gbs = 1e9
    return HardwareProfile(
        name=str(get("", "name")),
        description=str(raw.get("description", "")),
        gpus_per_node=number("", "gpus_per_node", int),
        sources=tuple(raw.get("sources", ())),
        nvlink_bw=number("bandwidth_gbs", "nvlink") * gbs,
        nvls_bw=number("bandwidth_gbs", "nvls") * gbs,
        nic_bw=number("bandwidth_gbs", "nic") * gbs,
        tree_factor=number("bandwidth_gbs", "tree_factor"),
        base_ring=micros("base_ring"),
        base_tree=micros("base_tree"),
        nvlink_ring=micros("nvlink_ring"),
        nvlink_tree=micros("nvlink_tree"),
        net_ring=micros("net_ring"),
        net_tree=micros("net_tree"),
        nvls_lat=number("latency_us", "nvls") * 1e-6,
        nvls_tree_net_lat=number("latency_us", "nvls_tree_net") * 1e-6,
        protocol_efficiency=tuple(
            number("protocol_efficiency", p) for p in PROTOCOLS
        ),  # type: ignore[arg-type]
        ll_max_bw=tuple(number("bandwidth_gbs", f"ll_max_{nodes}") * gbs
                        for nodes in ("1node", "2nodes", "3nodes")),  # type: ignore[arg-type]
        # optional tables: files written before they existed still load
        net_scale_loss=number("scale", "net_loss_per_doubling") if "scale" in raw else 0.0,
        op_fits=tuple(_op_fit(op, table, path) for op, table in raw.get("fit", {}).items()),
        path=str(path),
    )


def _op_fit(op: str, table: dict, path: Path) -> OpFit:
    try:
        return OpFit(op=op, ranks=int(table["ranks"]), latency=float(table["latency_us"]) * 1e-6,
                     busbw=float(table["busbw_gbs"]) * 1e9,
                     knee_bytes=int(table.get("knee_bytes", 0)),
                     large_busbw=float(table.get("large_busbw_gbs", 0.0)) * 1e9,
                     small_bytes=int(table.get("small_bytes", 0)),
                     small_latency=float(table.get("small_latency_us", 0.0)) * 1e-6)
    except (KeyError, TypeError, ValueError) as exc:
        raise HardwareProfileError(
            f"hardware profile {path}: [fit.{op}] needs ranks, latency_us and busbw_gbs "
            f"(numbers): {exc}") from None
