"""Compose the execution graph of the whole world from a few profiled slices.

A *slice* is one representative rank run for a few iterations with
collectives completing at once; it records, per iteration, the events of its
program.  From the group families the script defined, the world's mesh is
inferred (each regular family is an axis, or a run of adjacent axes); the
family point-to-point ops travel on is the *class axis* (one class per
pipeline stage), and each class's program comes from its slice: the longest
tail of iterations that repeat exactly is the steady state (median compute
gaps), what precedes it the warm-up (at least the first iteration).

How the steady gaps spread around their medians is fitted too (graph/fits.py:
normal, gamma or lognormal, the least Kolmogorov–Smirnov distance): each
event's own samples where the steady iterations give at least MIN_SAMPLES,
else its op kind's in the class pooled, else the whole class's; each sample
divided by its own event's median first, since a draw multiplies that median.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prism_debug.errors import GraphError
from prism_debug.graph.execution import (
    P2P_KINDS,
    ClassProgram,
    Event,
    ExecutionGraph,
    Mesh,
    OpSpec,
)
from prism_debug.graph.families import WORLD_FAMILY
from prism_debug.graph.fits import MIN_GAP_S, MIN_SAMPLES, GapFit, fit_samples
from prism_debug.graph.messages import PeerMessage

MIN_ITERATIONS = 3  # a warm-up and two steady iterations to compare


@dataclasses.dataclass(frozen=True)
class RecordedIssue:
    gap_s: float
    kind: str
    family: str
    nbytes: int
    dtype: str
    peer_delta: int = 0  # p2p: the peer's global rank minus the rank's own
    batch: int = 0  # p2p: its batch_isend_irecv's number in the iteration (0: alone)


@dataclasses.dataclass(frozen=True)
class RecordedWait:
    gap_s: float
    issue: int  # position of the awaited issue within the iteration


@dataclasses.dataclass(frozen=True)
class RecordedEnd:
    gap_s: float


RecordedEvent = RecordedIssue | RecordedWait | RecordedEnd


@dataclasses.dataclass(frozen=True)
class SliceRecord:
    """What one profiled rank did."""

    rank: int
    # FamilySummary.to_dict() of every family the script made (JSON from the rank)
    families: tuple[dict[str, Any], ...]
    iterations: tuple[tuple[RecordedEvent, ...], ...]
    # what it sent outside the tensor data path (pickled objects, control tensors)
    messages: tuple[PeerMessage, ...] = ()


# -- the mesh ------------------------------------------------------------------------


def infer_mesh(world_size: int, families: Iterable[Mapping[str, Any]]
               ) -> tuple[Mesh, dict[str, tuple[str, ...]]]:
    """The world's mesh and each family's axes, from the families' strides.

    A complete family whose groups are ``base + stride·i`` covers the rank
    distances from ``stride`` to ``stride × group_size``; every such bound is
    an axis boundary, and the axes are the spans between consecutive
    boundaries.  An axis is named after the family that spans exactly it
    (otherwise ``_axis<k>``); a flattened family spans several axes.  A family
    of single ranks (``tp=1``) spans no axis but stays a family: the script
    creates it whatever the graph says.
    """
    families = [f for f in families if f["name"] != WORLD_FAMILY]
    regular = [f for f in families if f["group_size"] > 1]
    for family in regular:
        if not family["complete"] or family["stride"] is None:
            raise GraphError(
                f"family {family['name']!r} ({family['num_groups']} groups of "
                f"{family['group_size']}) does not tile the world with evenly spaced ranks; "
                "the execution graph needs mesh-shaped layouts")
    found = {1, world_size}
    for family in regular:
        found.update((family["stride"], family["stride"] * family["group_size"]))
    bounds = sorted(found)
    for low, high in zip(bounds, bounds[1:], strict=False):
        if high % low:
            raise GraphError(f"the families do not nest into a mesh: spans at rank distance "
                             f"{low} and {high} do not divide (families: "
                             f"{', '.join(f['name'] for f in regular)})")
    spans = list(zip(bounds, bounds[1:], strict=False))  # fastest axis first
    exact = {(f["stride"], f["stride"] * f["group_size"]): f["name"] for f in regular}
    names = [exact.get(span, f"_axis{k}") for k, span in enumerate(spans)]
    mesh = Mesh(tuple(high // low for low, high in reversed(spans)), tuple(reversed(names)))
    family_axes = {WORLD_FAMILY: mesh.names} | {f["name"]: () for f in families}
    for family in regular:
        low, high = family["stride"], family["stride"] * family["group_size"]
        family_axes[family["name"]] = tuple(
            name for name, (a, b) in zip(reversed(names), reversed(spans), strict=True)
            if low <= a and b <= high)
    return mesh, family_axes


def class_axis(slices: list[SliceRecord], family_axes: dict[str, tuple[str, ...]]) -> str | None:
    """The axis point-to-point ops travel on (the pipeline), if any."""
    families = {e.family for s in slices for it in s.iterations for e in it
                if isinstance(e, RecordedIssue) and e.kind in P2P_KINDS}
    if not families:
        return None
    axes = {family_axes[f] for f in families if f in family_axes}
    if len(families) > 1 or len(axes) != 1 or len(next(iter(axes))) != 1:
        raise GraphError(f"point-to-point ops travel on {sorted(families)}; the execution "
                         "graph supports them on one family that is one mesh axis")
    return next(iter(axes))[0]


def representatives(mesh: Mesh, axis: str | None) -> list[int]:
    """One rank per class: coordinate c on the class axis, 0 elsewhere."""
    if axis is None:
        return [0]
    return [c * mesh.strides[mesh.axis(axis)] for c in range(mesh.shape[mesh.axis(axis)])]


# -- programs --------------------------------------------------------------------------


def _signature(event: RecordedEvent) -> tuple[str | int, ...]:
    if isinstance(event, RecordedIssue):
        return ("issue", event.kind, event.family, event.nbytes, event.dtype, event.peer_delta,
                event.batch)
    if isinstance(event, RecordedWait):
        return ("wait", event.issue)
    return ("end",)


def _describe(event: RecordedEvent | None) -> str:
    if event is None:
        return "nothing"
    if isinstance(event, RecordedIssue):
        peer = f" with rank {event.peer_delta:+d}" if event.kind in P2P_KINDS else ""
        return f"{event.kind} of {event.nbytes} bytes on {event.family}{peer}"
    if isinstance(event, RecordedWait):
        return f"a wait for its op {event.issue}"
    return "the end of the iteration"


def steady_start(record: SliceRecord) -> int:
    """How many iterations of warm-up precede the steady state: the longest
    tail of at least two iterations that issue the same ops in the same order.
    Without one, the error names where the last two iterations part."""
    if len(record.iterations) < MIN_ITERATIONS:
        raise GraphError(f"rank {record.rank} finished {len(record.iterations)} iterations; "
                         f"profiling needs at least {MIN_ITERATIONS}")
    signatures = [[_signature(e) for e in it] for it in record.iterations]
    last = len(signatures) - 1
    start = last
    while start > 0 and signatures[start - 1] == signatures[last]:
        start -= 1
    if last - start + 1 >= 2:
        return max(start, 1)  # the first iteration is warm-up whatever it looks like
    before, after = record.iterations[last - 1], record.iterations[last]
    for position in range(max(len(before), len(after))):
        a = after[position] if position < len(after) else None
        b = before[position] if position < len(before) else None
        if a is None or b is None or _signature(a) != _signature(b):
            raise GraphError(
                f"rank {record.rank}: iteration {last + 1} does not repeat iteration {last}: "
                f"at event {position} it has {_describe(a)} where iteration {last} has "
                f"{_describe(b)}")
    raise AssertionError("unreachable: the iterations differ somewhere")


def program(record: SliceRecord, class_id: int, mesh: Mesh,
            family_axes: dict[str, tuple[str, ...]]) -> ClassProgram:
    warmup_iterations = steady_start(record)
    ops: list[OpSpec] = []
    index: dict[tuple[OpSpec, int], int] = {}

    def events_of(iteration: Sequence[RecordedEvent], gaps: Sequence[float]
                  ) -> tuple[Event, ...]:
        issues: list[int] = []
        events: list[Event] = []
        for event, gap in zip(iteration, gaps, strict=True):
            if isinstance(event, RecordedIssue):
                spec = OpSpec(event.kind, event.family, event.nbytes, event.dtype,
                              _steps(event, mesh, family_axes))
                key = (spec, len(issues))
                if key not in index:
                    index[key] = len(ops)
                    ops.append(spec)
                issues.append(index[key])
                events.append(Event("issue", gap, index[key], event.batch))
            elif isinstance(event, RecordedWait):
                events.append(Event("wait", gap, issues[event.issue]))
            else:
                events.append(Event("end", gap))
        return tuple(events)

    steady_runs = record.iterations[warmup_iterations:]
    gaps = [statistics.median(run[i].gap_s for run in steady_runs)
            for i in range(len(steady_runs[0]))]
    steady = events_of(steady_runs[0], gaps)
    warmup = tuple(events_of(it, [e.gap_s for e in it])
                   for it in record.iterations[:warmup_iterations])
    steady_signature = [_signature(e) for e in steady_runs[0]]
    if all([_signature(e) for e in it] == steady_signature
           for it in record.iterations[:warmup_iterations]):
        warmup = ()  # the warm-up issues what the steady state does: replay it as steady
    return ClassProgram(class_id, tuple(ops), warmup, steady)


def gap_fits(record: SliceRecord, built: ClassProgram) -> tuple[GapFit | None, ...]:
    """One fit per steady event of ``built`` (the program made from
    ``record``), from the steady iterations' gaps relative to their medians;
    None where the median is under MIN_GAP_S (0, or bookkeeping)."""
    runs = record.iterations[steady_start(record):]
    relative: list[list[float] | None] = []
    for index, event in enumerate(built.steady):
        median = event.gap_s
        relative.append(None if median < MIN_GAP_S else
                        [run[index].gap_s / median for run in runs])
    kinds = ["end" if e.action == "end" else built.ops[e.op].kind for e in built.steady]
    pooled: dict[str, GapFit | None] = {}  # op kind (or "class") -> its pool's fit, made once

    def pool_fit(key: str) -> GapFit | None:
        if key not in pooled:
            samples = [x for i, xs in enumerate(relative) if xs is not None
                       and (key == "class" or kinds[i] == key) for x in xs]
            pooled[key] = fit_samples(samples, "kind" if key != "class" else "class") \
                if len(samples) >= MIN_SAMPLES else None
        return pooled[key]

    fits: list[GapFit | None] = []
    for index, samples in enumerate(relative):
        if samples is None:
            fits.append(None)
        elif len(samples) >= MIN_SAMPLES:
            fits.append(fit_samples(samples, "op"))
        else:
            fits.append(pool_fit(kinds[index]) or pool_fit("class"))
    return tuple(fits)


def _steps(event: RecordedIssue, mesh: Mesh, family_axes: Mapping[str, tuple[str, ...]]
           ) -> int:
    if event.kind not in P2P_KINDS:
        return 0
    (axis,) = family_axes[event.family]
    stride = mesh.strides[mesh.axis(axis)]
    if event.peer_delta % stride:
        raise GraphError(f"a {event.kind} to rank {event.peer_delta:+d} does not move along "
                         f"the {event.family} axis (stride {stride})")
    return event.peer_delta // stride


def build_graph(world_size: int, gpus_per_node: int, slices: list[SliceRecord],
                command: Iterable[str] = ()) -> ExecutionGraph:
    """The world's graph from one slice per class (any order)."""
    mesh, family_axes = infer_mesh(world_size, slices[0].families)
    axis = class_axis(slices, family_axes)
    by_class: dict[int, SliceRecord] = {}
    for record in slices:
        class_id = mesh.coordinates(record.rank)[mesh.axis(axis)] if axis else 0
        by_class.setdefault(class_id, record)
    num_classes = mesh.shape[mesh.axis(axis)] if axis else 1
    missing = [c for c in range(num_classes) if c not in by_class]
    if missing:
        raise GraphError(f"no slice for classes {missing} along {axis!r}: profile one rank of "
                         f"each (e.g. ranks {[representatives(mesh, axis)[c] for c in missing]})")
    programs = tuple(program(by_class[c], c, mesh, family_axes) for c in range(num_classes))
    fits = {c: gap_fits(by_class[c], programs[c]) for c in range(num_classes)}
    assert math.prod(mesh.shape) == world_size
    messages = {c: by_class[c].messages for c in range(num_classes) if by_class[c].messages}
    return ExecutionGraph(mesh=mesh, families=family_axes, class_axis=axis, programs=programs,
                          gpus_per_node=gpus_per_node, command=tuple(command),
                          messages=messages, gap_fits={c: f for c, f in fits.items() if any(f)},
                          message_iterations=max(len(s.iterations) for s in slices))
