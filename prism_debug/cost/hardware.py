"""Hardware profiles: the data a cost model needs about one cluster design.

Profiles are TOML files that cite their sources.  Bundled ones live in
``prism_debug/cost/profiles/``; ``--hardware`` takes a bundled name or a path.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from prism_debug.checked import (
    MAX_GPUS_PER_NODE,
    Check,
    Untrusted,
    dotted,
    non_negative,
    not_empty,
    positive,
    unit_interval,
)
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
        latencies = (*self.base_ring, *self.base_tree, *self.nvlink_ring, *self.nvlink_tree,
                     *self.net_ring, *self.net_tree, self.nvls_lat, self.nvls_tree_net_lat)
        if not all(0 <= v < math.inf for v in latencies):
            raise HardwareProfileError(
                f"profile {self.name!r}: latencies must be finite and >= 0")
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HardwareProfile:
        """The profile :meth:`to_dict` gave (read back from JSON: lists for tuples)."""
        data = dict(data)
        for key, value in data.items():
            if isinstance(value, list):
                data[key] = tuple(value)
        data["op_fits"] = tuple(OpFit(**fit) for fit in data.get("op_fits", ()))
        return cls(**data)


def bundled_profiles() -> list[str]:
    return sorted(p.stem for p in BUNDLED_DIR.glob("*.toml"))


# a profile is a page of numbers; a file much larger is not one
MAX_PROFILE_BYTES = 1 << 20


def load_profile(name_or_path: str) -> HardwareProfile:
    """Load a bundled profile by name, or a TOML file by path; one
    :class:`HardwareProfileError` line naming the table and key at fault when
    the file is malformed (a table of the wrong type, a string, a negative,
    NaN or infinite number where a finite non-negative one belongs)."""
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = BUNDLED_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        raise HardwareProfileError(
            f"unknown hardware profile {name_or_path!r}: give a TOML file or one of "
            f"{', '.join(bundled_profiles())}"
        )
    try:
        with path.open("rb") as f:
            data = f.read(MAX_PROFILE_BYTES + 1)
        if len(data) > MAX_PROFILE_BYTES:
            raise HardwareProfileError(f"hardware profile {path} is larger than "
                                       f"{MAX_PROFILE_BYTES >> 10} KiB: not a profile")
        raw = tomllib.loads(data.decode("utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HardwareProfileError(f"cannot read hardware profile {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise HardwareProfileError(f"cannot read hardware profile {path}: not UTF-8 text "
                                   f"({exc.reason} at byte {exc.start})") from None
    return _parse(raw, path)


def _parse(raw: dict[str, Any], path: Path) -> HardwareProfile:
    read = Untrusted(HardwareProfileError, f"hardware profile {path}",
                     ": fix the file, or start from a bundled one "
                     f"({', '.join(bundled_profiles())})", place=_toml_place)

    read.known(raw, (), _KEYS)

    def table(name: str, required: bool = True) -> dict[str, Any]:
        data = read.mapping(read.get(raw, name, (), MISSING if required else {}), (name,))
        return data if name == "fit" else read.known(data, (name,), _KEYS[name])

    def number(name: str, key: str, check: Check = non_negative, infinite: bool = False
               ) -> float:
        data = table(name) if name else raw
        return read.number(read.get(data, key, (name,) if name else ()),
                           (name, key) if name else (key,), check, infinite=infinite)

    def bandwidth(key: str) -> float:  # GB/s; inf: a free link (the zero profile)
        return number("bandwidth_gbs", key, positive, infinite=True) * gbs

    def micros(key: str) -> tuple[float, float, float]:
        at = ("latency_us", key)
        values = read.items(read.get(table("latency_us"), key, ("latency_us",)), at,
                            most=3, length=3)
        return _three(read.number(v, at + (i,)) * 1e-6 for i, v in enumerate(values))

    gbs = 1e9
    sources = read.items(raw.get("sources", []), ("sources",), most=1024)
    return HardwareProfile(
        name=read.text(read.get(raw, "name", ()), ("name",), most=256, check=not_empty),
        description=read.text(raw.get("description", ""), ("description",)),
        gpus_per_node=read.int(read.get(raw, "gpus_per_node", ()), ("gpus_per_node",), 1,
                               MAX_GPUS_PER_NODE),
        sources=tuple(read.text(s, ("sources", i)) for i, s in enumerate(sources)),
        nvlink_bw=bandwidth("nvlink"),
        nvls_bw=number("bandwidth_gbs", "nvls", infinite=True) * gbs,  # 0: no NVLink SHARP
        nic_bw=bandwidth("nic"),
        tree_factor=number("bandwidth_gbs", "tree_factor", unit_interval),
        base_ring=micros("base_ring"),
        base_tree=micros("base_tree"),
        nvlink_ring=micros("nvlink_ring"),
        nvlink_tree=micros("nvlink_tree"),
        net_ring=micros("net_ring"),
        net_tree=micros("net_tree"),
        nvls_lat=number("latency_us", "nvls") * 1e-6,
        nvls_tree_net_lat=number("latency_us", "nvls_tree_net") * 1e-6,
        protocol_efficiency=_three(
            number("protocol_efficiency", p, unit_interval) for p in PROTOCOLS
        ),
        ll_max_bw=_three(bandwidth(f"ll_max_{nodes}") for nodes in ("1node", "2nodes", "3nodes")),
        # optional tables: files written before they existed still load
        net_scale_loss=number("scale", "net_loss_per_doubling", _below_one)
        if "scale" in raw else 0.0,
        op_fits=tuple(_op_fit(read, op, fit) for op, fit in table("fit", False).items()),
        path=str(path),
    )


def _three(values: Iterable[float]) -> tuple[float, float, float]:
    """``values`` (three of them: one per protocol or node count) as a triple."""
    first, second, third = values
    return first, second, third


def _toml_place(path: tuple[str | int, ...]) -> str:
    """A key path as a TOML file shows it: ``[latency_us] net_ring[2]``, ``[fit.send] ranks``."""
    if len(path) == 1:
        return str(path[0]) if path[0] not in _TABLES else f"[{path[0]}]"
    top, *rest = path
    head = str(top)  # the top level is a table or key: TOML's keys are text
    if head == "fit" and len(rest) >= 1:
        head, rest = f"fit.{rest[0]}", rest[1:]
    if head not in _TABLES and not head.startswith("fit."):
        return dotted(path)
    return f"[{head}]" + (" " + dotted(tuple(rest)) if rest else "")


# what a profile holds: each table's keys (what _parse reads)
_KEYS = {"name": (), "description": (), "gpus_per_node": (), "sources": (),
         "bandwidth_gbs": ("nvlink", "nvls", "nic", "tree_factor", "ll_max_1node",
                           "ll_max_2nodes", "ll_max_3nodes"),
         "latency_us": ("base_ring", "base_tree", "nvlink_ring", "nvlink_tree", "net_ring",
                        "net_tree", "nvls", "nvls_tree_net"),
         "protocol_efficiency": PROTOCOLS, "scale": ("net_loss_per_doubling",), "fit": ()}
_TABLES = ("bandwidth_gbs", "latency_us", "protocol_efficiency", "scale", "fit")


def _below_one(v: float) -> str | None:
    return None if 0 <= v < 1 else f"must be in [0, 1), got {v}"


def _op_fit(read: Untrusted, op: str, table: object) -> OpFit:
    at = ("fit", op)
    table = read.mapping(table, at)
    read.known(table, at, tuple(_FIT_KEYS))

    def number(key: str, check: Check = non_negative, infinite: bool = False) -> float:
        value = read.get(table, key, at, 0.0 if _FIT_KEYS[key] is None else MISSING)
        return read.number(value, at + (key,), check, infinite=infinite)

    return OpFit(op=op, ranks=read.int(read.get(table, "ranks", at), at + ("ranks",), 2,
                                       1 << 24),
                 latency=number("latency_us") * 1e-6,
                 busbw=number("busbw_gbs", positive, True) * 1e9,
                 knee_bytes=read.int(table.get("knee_bytes", 0), at + ("knee_bytes",), 0,
                                     1 << 62),
                 large_busbw=number("large_busbw_gbs", infinite=True) * 1e9,
                 small_bytes=read.int(table.get("small_bytes", 0), at + ("small_bytes",), 0,
                                      1 << 62),
                 small_latency=number("small_latency_us") * 1e-6)


# a [fit.OP] table's keys: None for the optional ones
_FIT_KEYS = {"ranks": "", "latency_us": "", "busbw_gbs": "", "knee_bytes": None,
             "large_busbw_gbs": None, "small_bytes": None, "small_latency_us": None,
             # how well the fit met its measurements (calibrate writes them for the
             # reader; nothing is priced from them)
             "median_error_pct": None, "worst_error_pct": None, "worst_error_bytes": None}
