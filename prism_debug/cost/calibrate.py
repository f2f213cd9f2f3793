"""Fit a hardware profile to measurements (pure: parsing and arithmetic).

Measurements are (op, bytes, seconds) samples on a group of ``num_ranks``
ranks over ``num_nodes`` nodes: parsed from nccl-tests output, or measured
with real gloo collectives on this host (``workflows/local_bench.py``).

* nccl-tests runs (``fit``) keep the base profile's form and fit, by least
  squares over every size of every run, the bandwidths and latency scales
  the runs can show (one-node runs: NVLink, NVLS, intra-node latency;
  multi-node runs: NIC, network latency, and the network's loss per doubling
  of nodes when the runs span several node counts).
* Local gloo runs (``local_profile``) fit each op on its own: latency and
  bus bandwidth by linear least squares over all its sizes, with a second
  bandwidth beyond a knee when messages outgrow the caches.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from prism_debug.cost.hardware import HardwareProfile, OpFit
from prism_debug.cost.model import CostModel, Placement, bus_factor
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
    # per sample, how much repeated measurements of it vary (half their
    # interquartile range over their median); empty when not measured here
    spread: tuple[float, ...] = ()

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


# an nccl-tests log is a page or two; a file far larger is something else
MAX_LOG_BYTES = 16 << 20
MAX_SAMPLES = 100_000


def read_nccl_tests(path: Path, op: str | None = None) -> Measurements:
    """:func:`parse_nccl_tests` of the file at ``path``; :class:`ConfigError`
    when it cannot be read, is not text, or is too large to be a log."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_LOG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_LOG_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_LOG_BYTES >> 20} MiB: give the output of "
                          "one nccl-tests run")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not text ({exc.reason} at byte {exc.start}): give the "
                          "output of an nccl-tests run") from None
    return parse_nccl_tests(text, str(path), op)


def parse_nccl_tests(text: str, source: str, op: str | None = None) -> Measurements:
    """An nccl-tests ``*_perf`` output: out-of-place times per size, and the
    ranks and hosts from its ``# Rank`` lines.  A result row whose time is
    not a positive number of microseconds (``N/A``, ``nan``) is an error
    naming its line: a fit from part of a table would mislead."""
    op = op or _op_from_name(source)
    hosts, ranks, time_column, samples = set(), 0, None, []
    for number, line in enumerate(text.splitlines(), 1):
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
        # isdecimal, not isdigit: "²" is a digit int() cannot read
        if time_column is None or len(tokens) <= time_column or not tokens[0].isdecimal():
            continue
        size, micros = _result(tokens[0], tokens[time_column], f"{source}:{number}")
        samples.append((size, micros * 1e-6))
        if len(samples) > MAX_SAMPLES:
            raise ConfigError(f"{source}: more than {MAX_SAMPLES} results: give the output "
                              "of one nccl-tests run")
    if not samples:
        raise ConfigError(f"{source}: no nccl-tests results found (expected the table "
                          "printed by all_reduce_perf and friends)")
    if ranks == 0:
        raise ConfigError(f"{source}: no '# Rank … on HOST' lines, so the ranks and nodes of "
                          "the run are unknown; keep the whole nccl-tests output")
    if ranks < 2:
        raise ConfigError(f"{source}: one rank: a collective needs at least two to measure")
    return Measurements(op, ranks, len(hosts), tuple(samples), source)


def _result(size_text: str, time_text: str, where: str) -> tuple[int, float]:
    """A result row's size (bytes) and time (µs), checked."""
    size = int(size_text) if len(size_text) <= 18 else -1  # (int() of 5000 digits raises)
    if not 0 < size <= 1 << 50:
        raise ConfigError(f"{where}: size {size_text} is not a message size in bytes (1 B to "
                          "1 PiB): give nccl-tests output as it printed it")
    try:
        micros = float(time_text)
    except ValueError:
        micros = math.nan
    if not 0 < micros < math.inf:
        raise ConfigError(f"{where}: the time of {size} bytes is {time_text!r}, not a positive "
                          "number of microseconds: rerun that size, or delete the line")
    return size, micros


def _op_from_name(source: str) -> str:
    name = Path(source).name.lower()
    for key in sorted(NCCL_TESTS_OPS, key=len, reverse=True):
        if key in name:
            return NCCL_TESTS_OPS[key]
    raise ConfigError(f"cannot tell the collective of {source} from its name: give it as "
                      f"OP=PATH (OP one of {', '.join(sorted(set(NCCL_TESTS_OPS.values())))})")


def fit(base: HardwareProfile, measurements: list[Measurements], name: str) -> HardwareProfile:
    """``base`` with its bandwidths, latency scales and network loss at scale
    fitted to ``measurements`` by least squares over every size of every run
    (relative error: a 1 GiB message counts as much as an 8-byte one)."""
    if not measurements:
        raise ConfigError("nothing to fit: give at least one nccl-tests output")
    start = _first_guess(base, measurements)
    params = _free_parameters(base, measurements)
    x0 = np.zeros(len(params))
    x0[[i for i, p in enumerate(params) if p.name == "loss"]] = start.net_scale_loss

    def residuals(x: NDArray[np.float64]) -> NDArray[np.float64]:
        model = CostModel(_apply(start, params, x))
        return np.array([math.log(model.estimate(m.op, size, m.placement).time_s / seconds)
                         for m in measurements for size, seconds in m.samples])

    lower = np.array([0.0 if p.name == "loss" else -12.0 for p in params])
    upper = np.array([0.95 if p.name == "loss" else 12.0 for p in params])
    best = _levenberg_marquardt(residuals, x0, lower, upper)
    return dataclasses.replace(
        _apply(start, params, best), name=name, sources=tuple(m.source for m in measurements),
        description=f"fitted by prism-debug calibrate from {base.name}")


@dataclasses.dataclass(frozen=True)
class _Param:
    name: str
    fields: tuple[str, ...]  # profile fields one multiplier scales together


_INTRA_LATENCY = ("base_ring", "base_tree", "nvlink_ring", "nvlink_tree", "nvls_lat")
_NET_LATENCY = ("net_ring", "net_tree", "nvls_tree_net_lat")


def _free_parameters(base: HardwareProfile, measurements: list[Measurements]) -> list[_Param]:
    """What the runs can tell: intra-node bandwidth and latency from one-node
    runs, network bandwidth and latency from multi-node runs, and the loss per
    doubling of nodes only from runs on two or more node counts beyond one."""
    nodes = {m.num_nodes for m in measurements}
    # latency constants are free only where some message is small enough to show them
    small = {m.num_nodes > 1 for m in measurements if min(m.samples)[0] <= SMALL_BYTES}
    params = []
    if 1 in nodes:
        params.append(_Param("nvlink", ("nvlink_bw",)))
        if False in small:
            params.append(_Param("intra_lat", _INTRA_LATENCY))
        if base.nvls_bw > 0 and any(m.op == "all_reduce" and m.num_nodes == 1
                                    and m.num_ranks == base.gpus_per_node for m in measurements):
            params.append(_Param("nvls", ("nvls_bw",)))
    multi = nodes - {1}
    if multi:
        params.append(_Param("nic", ("nic_bw",)))
        if True in small:
            params.append(_Param("net_lat", _NET_LATENCY))
        if len(multi) >= 2 and max(multi) >= 3:
            params.append(_Param("loss", ("net_scale_loss",)))
    return params


def _apply(profile: HardwareProfile, params: list[_Param], x: NDArray[np.float64]
           ) -> HardwareProfile:
    changes: dict[str, float | tuple[float, ...]] = {}
    for param, value in zip(params, x, strict=True):
        for field in param.fields:
            if param.name == "loss":
                changes[field] = float(value)
                continue
            old, scale = getattr(profile, field), math.exp(value)
            changes[field] = (tuple(v * scale for v in old) if isinstance(old, tuple)
                              else old * scale)
    return _replaced(profile, changes)


def _replaced(profile: HardwareProfile, changes: dict[str, float | tuple[float, ...]]
              ) -> HardwareProfile:
    """``profile`` with the bandwidths and latencies named in ``changes``."""
    # the fields are named at run time: mypy checks ``**changes`` against every
    # field's type (text, ints, fits), not against those of the fields named
    return dataclasses.replace(profile, **cast(dict[str, Any], changes))


_Residuals = Callable[[NDArray[np.float64]], NDArray[np.float64]]


def _levenberg_marquardt(residuals: _Residuals, x0: NDArray[np.float64],
                         lower: NDArray[np.float64], upper: NDArray[np.float64],
                         iterations: int = 60) -> NDArray[np.float64]:
    """Minimise ``|residuals(x)|²`` within bounds (numeric Jacobian; the
    model is piecewise smooth: it takes the fastest algorithm)."""
    x: NDArray[np.float64] = np.clip(np.asarray(x0, dtype=float), lower, upper)
    r = residuals(x)
    cost, damping = float(r @ r), 1e-3
    for _ in range(iterations):
        jacobian = np.empty((r.size, x.size))
        for j in range(x.size):
            h = 1e-6 * max(1.0, abs(x[j]))
            probe = x.copy()
            probe[j] = probe[j] + h if probe[j] + h <= upper[j] else probe[j] - h
            jacobian[:, j] = (residuals(probe) - r) / (probe[j] - x[j])
        scale = np.sqrt(np.maximum((jacobian ** 2).sum(axis=0), 1e-12))
        while True:
            a = np.vstack([jacobian, np.diag(math.sqrt(damping) * scale)])
            b = np.concatenate([-r, np.zeros(x.size)])
            step = np.linalg.lstsq(a, b, rcond=None)[0]
            candidate = np.clip(x + step, lower, upper)
            r_new = residuals(candidate)
            if float(r_new @ r_new) < cost:
                break
            damping *= 4
            if damping > 1e12:
                return x
        improvement = cost - float(r_new @ r_new)
        x, r, cost, damping = candidate, r_new, float(r_new @ r_new), max(damping / 3, 1e-9)
        if improvement < 1e-12 * max(cost, 1e-30) or np.abs(step).max() < 1e-10:
            break
    return x


def _first_guess(base: HardwareProfile, measurements: list[Measurements]) -> HardwareProfile:
    """Bandwidths from the largest messages, latency scales from the smallest:
    where the least-squares fit starts."""
    profile = base
    for m in sorted(measurements, key=lambda m: m.num_nodes):  # intra-node first
        bandwidth = m.bus_bandwidth()
        if m.num_nodes == 1:
            field = "nvls_bw" if (m.op == "all_reduce" and m.num_ranks == base.gpus_per_node
                                  and base.nvls_bw > base.nvlink_bw) else "nvlink_bw"
            profile = _replaced(profile, {field: bandwidth})
        else:
            per_node = m.placement.ranks_per_node
            nic = bandwidth / (1 if m.op == "all_to_all" else per_node)
            profile = dataclasses.replace(profile, nic_bw=nic)
        smallest = min(size for size, _ in m.samples)
        predicted = CostModel(profile).estimate(m.op, smallest, m.placement)
        if predicted.time_s > 0 and smallest <= SMALL_BYTES:
            profile = _scale_latency(profile, m.latency_s() / predicted.time_s,
                                     inter=m.num_nodes > 1)
    return profile


def _scale_latency(profile: HardwareProfile, scale: float, inter: bool) -> HardwareProfile:
    fields = _NET_LATENCY if inter else _INTRA_LATENCY
    changes: dict[str, float | tuple[float, ...]] = {}
    for field in fields:
        value = getattr(profile, field)
        changes[field] = (tuple(v * scale for v in value) if isinstance(value, tuple)
                          else value * scale)
    return _replaced(profile, changes)


def fit_op(m: Measurements) -> OpFit:
    """``time = latency + bytes × factor / busbw`` for one op, by linear least
    squares on the relative error over all its sizes.  Two departures from
    one line are fitted where they fit better, each at a measured size: a
    knee past which the bandwidth falls (messages outgrowing the caches), and
    a faster path for the smallest messages (a backend switching algorithm,
    as NCCL switches to LL); ``_FAST_PATH`` keeps noise from buying the latter."""
    factor = bus_factor(m.op, m.num_ranks)
    x = np.array([size * factor for size, _ in m.samples], dtype=float)
    t = np.array([seconds for _, seconds in m.samples], dtype=float)
    sizes = sorted(set(x))
    knees = [0.0, *(k for k in sizes[1:-1] if k >= SMALL_BYTES)]  # past latency, not the last
    smalls = [0.0, *(s for s in sizes[:-2] if s < SMALL_BYTES)]  # latency-bound sizes only
    best: tuple[float, OpFit] | None = None
    for knee in knees:
        for small in smalls:
            fitted = _fit_form(m, x, t, knee, small)
            if fitted is not None and (best is None or fitted[0] < best[0] - 1e-12):
                best = fitted
    if best is None:  # times that fall with size: keep the bandwidth, no latency
        return OpFit(m.op, m.num_ranks, 0.0, float(np.sum(x * t) / np.sum(t * t)))
    return best[1]


_FAST_PATH = 0.8  # a fast path for small messages must save at least 20 % of the latency


def _fit_form(m: Measurements, x: NDArray[np.float64], t: NDArray[np.float64], knee: float,
              small: float) -> tuple[float, OpFit] | None:
    """(squared relative error, fit) of one form, or None where the least
    squares answer is no latency-and-bandwidth (a negative or rising one)."""
    columns = [(x > small).astype(float)]
    if small:
        columns.append((x <= small).astype(float))
    columns.append(np.minimum(x, knee) if knee else x)
    if knee:
        columns.append(np.maximum(x - knee, 0.0))
    design = np.stack(columns, axis=1) / t[:, None]  # relative residuals
    coef = list(np.linalg.lstsq(design, np.ones_like(t), rcond=None)[0])
    error = float(np.sum((design @ np.array(coef) - 1.0) ** 2))
    latency = coef.pop(0)
    small_latency = coef.pop(0) if small else 0.0
    slopes = coef
    if latency < 0 or small_latency < 0 or min(slopes) <= 0 or (knee and slopes[1] < slopes[0]):
        return None
    if small and small_latency > _FAST_PATH * latency:
        return None
    return error, OpFit(m.op, m.num_ranks, float(latency), 1 / slopes[0], int(knee),
                        1 / slopes[1] if knee else 0.0, int(small), float(small_latency))


def local_profile(measurements: list[Measurements], name: str) -> HardwareProfile:
    """A profile for ranks on this host talking through gloo: one "node" of
    ``num_ranks`` ranks.  Each measured op is priced from its own fit; the
    rest (all-to-all, gather, ...) from a Simple ring whose bandwidth and
    per-step latency come from the all-reduce and send/recv fits."""
    fits = {m.op: fit_op(m) for m in measurements}
    missing = {"all_reduce", "send"} - set(fits)
    if missing:
        raise ConfigError(f"local calibration needs all_reduce and send measurements, "
                          f"missing {', '.join(sorted(missing))}")
    all_reduce, p2p = fits["all_reduce"], fits["send"]
    n = all_reduce.ranks
    bandwidth = min(all_reduce.busbw, p2p.busbw)
    # ring all-reduce: base + 2(n-1)·hop;  p2p: base + hop
    hop = max(0.0, (all_reduce.latency - p2p.latency) / max(1, 2 * (n - 1) - 1))
    base = max(0.0, p2p.latency - hop)
    never = 1.0  # a second: LL, LL128 and NVLS never win
    return HardwareProfile(
        name=name, description=f"gloo between {n} processes on this host, measured",
        gpus_per_node=n, sources=tuple(dict.fromkeys(m.source for m in measurements)),
        nvlink_bw=bandwidth, nvls_bw=0.0, nic_bw=bandwidth, tree_factor=1.0,
        base_ring=(never, never, base), base_tree=(never, never, base),
        nvlink_ring=(0.0, 0.0, hop), nvlink_tree=(0.0, 0.0, hop),
        net_ring=(0.0, 0.0, hop), net_tree=(0.0, 0.0, hop),
        nvls_lat=never, nvls_tree_net_lat=never,
        protocol_efficiency=(1.0, 1.0, 1.0), ll_max_bw=(math.inf,) * 3,
        op_fits=tuple(fits.values()))


def to_toml(profile: HardwareProfile, quality: tuple[FitQuality, ...] = ()) -> str:
    """The profile as a TOML file ``load_profile`` reads back; ``quality``
    (:func:`fit_quality`) is written beside each fit: how far the profile
    misses what it was fitted to."""
    def micros(values: Iterable[float]) -> str:
        return "[" + ", ".join(f"{v * 1e6:.9g}" for v in values) + "]"

    def gbs(value: float) -> str:
        return "inf" if math.isinf(value) else f"{value / 1e9:.9g}"

    sources = ",\n".join(f"  {s!r}" for s in profile.sources)
    text = f"""# Written by prism-debug calibrate.
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
nvls = {profile.nvls_lat * 1e6:.9g}
nvls_tree_net = {profile.nvls_tree_net_lat * 1e6:.9g}

[protocol_efficiency]
ll = {profile.protocol_efficiency[0]}
ll128 = {profile.protocol_efficiency[1]}
simple = {profile.protocol_efficiency[2]}

[scale]
net_loss_per_doubling = {profile.net_scale_loss:.9g}
"""
    judged = {(q.op, q.num_ranks): q for q in quality}
    for fit in profile.op_fits:
        text += (f"\n[fit.{fit.op}]  # least squares over every measured size\n"
                 f"ranks = {fit.ranks}\nlatency_us = {fit.latency * 1e6:.9g}\n"
                 f"busbw_gbs = {gbs(fit.busbw)}\n")
        q = judged.pop((fit.op, fit.ranks), None)
        if q is not None:
            text += (f"# the profile against its own measurements (not used to price ops)\n"
                     f"median_error_pct = {100 * q.median_error:.3g}\n"
                     f"worst_error_pct = {100 * q.worst_error:.3g}\n"
                     f"worst_error_bytes = {q.worst_bytes}\n")
        if fit.knee_bytes:
            text += f"knee_bytes = {fit.knee_bytes}\nlarge_busbw_gbs = {gbs(fit.large_busbw)}\n"
        if fit.small_bytes:
            text += (f"small_bytes = {fit.small_bytes}\n"
                     f"small_latency_us = {fit.small_latency * 1e6:.9g}\n")
    if judged:  # fitted into the base profile's form (nccl-tests): no [fit.OP] table
        text += "\n# fit quality: median and worst error against the measurements\n"
        for q in judged.values():
            text += (f"# {q.op} on {q.num_ranks} ranks, {q.num_nodes} node(s): median "
                     f"{100 * q.median_error:.1f} %, worst {100 * q.worst_error:+.1f} % at "
                     f"{_size(q.worst_bytes)}\n")
    return text


def fit_table(model: CostModel, measurements: list[Measurements]) -> list[str]:
    """How well ``model`` reproduces ``measurements``: every size of each,
    measured against predicted, and how much the measurement itself varied
    where that is known (``prism-debug calibrate``)."""
    lines = [f"{'op':>14} {'ranks':>6} {'nodes':>6} {'bytes':>11} {'measured us':>12} "
             f"{'model us':>10} {'error':>7} {'noise':>6}"]
    for m in measurements:
        spread = m.spread or (None,) * len(m.samples)
        for (nbytes, seconds), noise in zip(m.samples, spread, strict=True):
            predicted = model.estimate(m.op, nbytes, m.placement).time_s
            lines.append(f"{m.op:>14} {m.num_ranks:>6} {m.num_nodes:>6} {nbytes:>11} "
                         f"{seconds * 1e6:>12.1f} {predicted * 1e6:>10.1f} "
                         f"{100 * (predicted - seconds) / seconds:>+6.1f}% "
                         + (f"{100 * noise:>5.1f}%" if noise is not None else f"{'-':>6}"))
    return lines


#: a fit that misses a measured size by more than this (either way) draws a warning
FIT_ERROR_WARN = 0.5


@dataclasses.dataclass(frozen=True)
class FitQuality:
    """How well a profile reproduces one op's measurements (``prism-debug calibrate``)."""
    op: str
    num_ranks: int
    num_nodes: int
    median_error: float  # of |predicted - measured| / measured, over the sizes
    worst_error: float  # signed: +1.5 is a prediction 150 % above the measurement
    worst_bytes: int
    # the sizes missed by more than FIT_ERROR_WARN, and their errors
    missed: tuple[tuple[int, float], ...]


def fit_quality(model: CostModel, measurements: list[Measurements]) -> tuple[FitQuality, ...]:
    """Per measured op, the relative errors of ``model`` at its sizes."""
    judged = []
    for m in measurements:
        errors = [(nbytes, (model.estimate(m.op, nbytes, m.placement).time_s - seconds) / seconds)
                  for nbytes, seconds in m.samples]
        worst = max(errors, key=lambda e: abs(e[1]))
        judged.append(FitQuality(
            m.op, m.num_ranks, m.num_nodes, float(np.median([abs(e) for _, e in errors])),
            worst[1], worst[0], tuple(e for e in errors if abs(e[1]) > FIT_ERROR_WARN)))
    return tuple(judged)


def fit_warnings(quality: tuple[FitQuality, ...], *, local: bool, cpus: int,
                 load: float) -> list[str]:
    """One line per op whose fit misses some size by more than
    :data:`FIT_ERROR_WARN`: which sizes, by how much, and what to do."""
    lines = []
    for q in quality:
        if not q.missed:
            continue
        sizes = sorted(nbytes for nbytes, _ in q.missed)
        span = _size(sizes[0]) if len(sizes) == 1 else f"{_size(sizes[0])}-{_size(sizes[-1])}"
        what = (f"calibrate: warning: the {q.op} fit misses {len(sizes)} of its sizes "
                f"({span}) by more than {100 * FIT_ERROR_WARN:.0f} %, worst "
                f"{100 * q.worst_error:+.0f} % at {_size(q.worst_bytes)}: ")
        if local:
            what += (f"gloo over this host's loopback ({cpus} cores, load {load:.1f}) does not "
                     f"follow a latency and a bandwidth there; run calibrate --local again "
                     f"on an idle machine, or fit real cluster runs with --nccl-tests")
        else:
            what += ("the profile's form cannot follow these runs; check the nccl-tests "
                     "files are from one cluster and one node count each")
        lines.append(what)
    return lines


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"
