"""Perturbation windows of the replay engine (stragglers, late or failed
arrivals, degraded links), and what those in force do to a class at a point
of its replay: its compute factor, its arrivals, its ops' costs."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from prism_debug.engine.layout import Layout
from prism_debug.engine.state import ClassState
from prism_debug.engine.times import Time
from prism_debug.graph.execution import OpSpec


@dataclasses.dataclass(eq=False)
class Perturbation:
    kind: str  # "slow", "delay", "fail"
    mask: NDArray[np.bool_]  # mesh-shaped: the ranks it applies to
    value: float  # factor (slow) or seconds (delay)
    first_iteration: int = 1
    last_iteration: float = math.inf
    family: str | None = None  # delay, fail: only ops on this family
    # Op-level bounds, as (iteration, op): the op counts the class's ops
    # issued in that iteration from 0.  A window covers the ops from
    # (first_iteration, first_op) to (last_iteration, last_op), both included.
    first_op: int = 0
    last_op: float = math.inf
    # class id -> its mask, internal order
    parts: dict[int, NDArray[np.bool_]] = dataclasses.field(default_factory=dict)

    def covers(self, iteration: int, op: int) -> bool:
        return ((iteration, op) >= (self.first_iteration, self.first_op)
                and (iteration, op) <= (self.last_iteration, self.last_op))


@dataclasses.dataclass(eq=False)
class LinkPerturbation:
    nodes: frozenset[int]
    bandwidth_factor: float  # cost is divided by it
    added_latency_s: float
    first_iteration: int = 1
    last_iteration: float = math.inf
    # intermittent: degraded for ``duty`` of every ``period_s`` of emulated time
    period_s: float | None = None
    duty: float = 1.0

    def active(self, iteration: int, now: float) -> bool:
        if not self.first_iteration <= iteration <= self.last_iteration:
            return False
        return self.period_s is None or (now % self.period_s) < self.duty * self.period_s


class Windows:
    """The perturbations in force."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self.perturbations: list[Perturbation] = []
        self.links: list[LinkPerturbation] = []
        self._kinds: set[str] = set()  # kinds present, so the common case skips the scan
        self.arrivals_perturbed = False  # a delay or fail exists: form per-rank arrivals
        # a link whose state changes with time or iteration: op costs are not kept
        self.volatile_links = False

    def add(self, window: Perturbation | LinkPerturbation) -> None:
        if isinstance(window, LinkPerturbation):
            self.links.append(window)
        else:
            self.perturbations.append(window)
        self._changed()

    def remove(self, window: object) -> None:
        """Take ``window`` back; ValueError when it is not in force."""
        if isinstance(window, LinkPerturbation) and window in self.links:
            self.links.remove(window)
        elif isinstance(window, Perturbation) and window in self.perturbations:
            self.perturbations.remove(window)
        else:
            raise ValueError("no such perturbation (removed already?)")
        self._changed()

    def _changed(self) -> None:
        self._kinds = {p.kind for p in self.perturbations}
        self.arrivals_perturbed = bool(self._kinds & {"delay", "fail"})
        self.volatile_links = any(link.period_s is not None or link.first_iteration > 1
                                  or link.last_iteration < math.inf for link in self.links)

    def arrivals_perturbed_in(self, iteration: int) -> bool:
        """Whether a delay or fail window covers some op of ``iteration``."""
        return any(p.kind != "slow" and p.first_iteration <= iteration <= p.last_iteration
                   for p in self.perturbations)

    def forget_parts(self) -> None:
        """The class arrays' layout changed: cut the masks again."""
        for p in self.perturbations:
            p.parts.clear()

    def active(self, kind: str, state: ClassState,
               family: str | None = None
               ) -> Iterator[tuple[Perturbation, NDArray[np.bool_]]]:
        """The windows of ``kind`` covering the class's next op (on
        ``family``), each with its mask cut to the class's arrays."""
        if kind not in self._kinds:
            return
        for p in self.perturbations:
            if (p.kind == kind and p.covers(state.iteration, state.issued)
                    and (p.family is None or p.family == family)):
                part = p.parts.get(state.program.class_id)
                if part is None:
                    part = p.parts[state.program.class_id] = self._layout.internal(
                        p.mask[state.index] if state.index else p.mask)
                if part.any():
                    yield p, part

    def compute_factor(self, state: ClassState) -> Time:
        """What the class's compute is multiplied by now (per rank once slowed,
        or with a compute model's persistent per-rank factors)."""
        factor: Time = 1.0 if state.rank_factors is None else state.rank_factors
        for p, part in self.active("slow", state):
            factor = factor * np.where(part, p.value, 1.0)
        return factor

    def link_cost(self, base: Time, op: OpSpec, state: ClassState, now: float) -> Time:
        """``base``, the op's cost, where the links in force at ``now`` degrade it."""
        layout = self._layout
        nodes = layout.nodes()
        axes = layout.graph.family_axes(op.family)
        cost: Time = base
        for link in self.links:
            if not link.active(state.iteration, now):
                continue
            touched = np.isin(nodes, list(link.nodes))
            if op.is_p2p:
                # the pair of each rank: its peer ``op.peer`` steps along the axis
                other = np.roll(nodes, -op.peer, axis=axes[0])
                degraded = (nodes != other) & (touched | np.roll(touched, -op.peer, axis=axes[0]))
            else:
                # Traffic inside a node never touches its NICs: a group is degraded
                # when it spans several nodes and one of them is a degraded one.
                degraded = touched.any(axis=axes, keepdims=True) & (
                    nodes.min(axis=axes, keepdims=True) != nodes.max(axis=axes, keepdims=True))
            degraded = np.broadcast_to(degraded, layout.mesh.shape)
            degraded = layout.internal(degraded[state.index] if state.index else degraded)
            slower = base / link.bandwidth_factor + link.added_latency_s
            cost = np.where(degraded, slower, cost)
        return cost

    def describe(self, rank: int) -> list[str]:
        """What perturbs ``rank``, one line per window."""
        mesh = self._layout.mesh
        coords = mesh.coordinates(rank)
        node = rank // self._layout.graph.gpus_per_node
        lines = []
        for p in self.perturbations:
            if p.mask[coords]:
                span = (f"from iteration {p.first_iteration}" if p.last_iteration == math.inf
                        else f"iterations {p.first_iteration}-{p.last_iteration:g}")
                if p.first_op:
                    span += f" (op {p.first_op + 1} on)"
                what = {"slow": f"slow x{p.value:g}", "delay": f"delay {p.value * 1e3:g} ms",
                        "fail": "never arrives"}[p.kind] + (f" on {p.family}" if p.family else "")
                lines.append(f"{what} {span}")
        for link in self.links:
            if node in link.nodes:
                flapping = (f" for {link.duty:g} of every {link.period_s:g} s"
                            if link.period_s is not None else "")
                lines.append(f"link x{link.bandwidth_factor:g} bandwidth "
                             f"+{link.added_latency_s * 1e6:g} us{flapping}")
        return lines
