"""What-if from the graph alone: ``prism-debug replay GRAPH --perturb …``.

The world is replayed twice from the graph, without and with the faults, on
the path a run under ``--graph`` takes (faults resolved by
:func:`prism_debug.faults.resolve`, put in force by
:func:`prism_debug.engine.injection.apply_fault` on a :class:`ReplayEngine`),
so what a what-if says is what a run's virtual peers would do.  The answer:
each reported rank's iteration times and how much later each iteration ends,
how many ranks of the world each iteration delays, and — when a fault keeps
peers from arriving (``fail``, ``hang``, ``desync``) — where each reported
rank blocks and whom it waits for there: the collective a run's watchdog
would time out on.  Pure core (numpy; no torch).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from prism_debug.engine.compute import ComputeModel
from prism_debug.engine.injection import apply_fault
from prism_debug.engine.loop import CostFn
from prism_debug.engine.replay import ReplayEngine
from prism_debug.engine.state import describe_op
from prism_debug.faults import MISSING_ACTIONS, VALUE_ACTIONS, Action, Injection, rank_text
from prism_debug.graph.execution import ExecutionGraph, OpSpec

_EPS = 1e-9  # seconds: less than this is no delay (float sums of the same gaps)


@dataclasses.dataclass(frozen=True)
class Blocked:
    """Where a rank stops for good: the op it never completes."""

    rank: int
    iteration: int
    op: int  # the op's number in the iteration, from 1 (as ``op K`` of a fault)
    spec: OpSpec
    failed: bool  # it never arrives there itself (a fault's target)
    waiting_for: tuple[int, ...]  # members of its group that never arrive

    def describe(self, blocked: dict[int, Blocked]) -> str:
        where = f"op {self.op} of iteration {self.iteration}: {describe_op(self.spec)}"
        if self.failed:
            return f"rank {self.rank} never arrives at {where} (the fault)"
        whom = ", ".join(f"{r} ({'failed' if blocked.get(r) and blocked[r].failed else 'blocked'})"
                         for r in self.waiting_for[:8])
        more = f" and {len(self.waiting_for) - 8} more" if len(self.waiting_for) > 8 else ""
        return (f"rank {self.rank} blocks at {where}, waiting for rank(s) {whom}{more}: a run "
                "would time out there (NCCL's watchdog, after the group's timeout)")


@dataclasses.dataclass(frozen=True)
class IterationEffect:
    """How one iteration ends across the whole world, perturbed against not."""

    iteration: int
    delayed: int  # ranks that end it later than unperturbed
    max_delay_s: float  # the most any rank ends it later
    min_delay_s: float  # the least a delayed rank ends it later
    latest: int | None  # a rank with that delay
    never: int  # ranks that never end it
    failed: int  # of those, fault targets that never arrive (the rest block)


@dataclasses.dataclass(frozen=True)
class WhatIf:
    iterations: int
    faults: tuple[tuple[str, str, tuple[int, ...]], ...]  # as written, "ranks"/"nodes", whom
    base: dict[int, tuple[float, ...]]  # rank -> unperturbed iteration times
    times: dict[int, tuple[float, ...]]  # rank -> perturbed ones (inf: never ends)
    late: dict[int, tuple[float, ...]]  # rank -> how much later each iteration ends
    world: tuple[IterationEffect, ...]
    blocked: dict[int, Blocked]  # reported ranks (and the ranks they wait for) that stop
    value_only: tuple[str, ...] = ()  # faults (as written) that change values, not timing

    def to_dict(self) -> dict[str, object]:
        def finite(values: Iterable[float]) -> list[float | None]:
            return [v if math.isfinite(v) else None for v in values]
        return {
            "iterations": self.iterations,
            "perturbations": [{"text": t, what: list(r)} for t, what, r in self.faults],
            "times_s": {r: finite(v) for r, v in self.times.items()},
            "unperturbed_times_s": {r: list(v) for r, v in self.base.items()},
            "ends_later_s": {r: finite(v) for r, v in self.late.items()},
            "world": [dataclasses.asdict(e) for e in self.world],
            "blocked": {r: {"iteration": b.iteration, "op": b.op, "kind": b.spec.kind,
                            "family": b.spec.family, "nbytes": b.spec.nbytes,
                            "failed": b.failed, "waiting_for": list(b.waiting_for)}
                        for r, b in self.blocked.items()},
        }


def what_if(graph: ExecutionGraph, cost: CostFn, injections: Sequence[tuple[str, Injection]],
            iterations: int, ranks: Sequence[int], *, seed: int = 0,
            compute: ComputeModel | None = None) -> WhatIf:
    """Replay ``graph`` for ``iterations`` without and with ``injections``
    (each fault as written, resolved); report ``ranks``.  ``compute`` (e.g.
    stochastic peers) acts on both sides, seeded alike, so the faults are the
    only difference."""
    base = ReplayEngine(graph, cost, compute=compute, seed=seed)
    base.run(iterations)
    engine = ReplayEngine(graph, cost, record=True, compute=compute, seed=seed)
    for _, injection in injections:
        apply_fault(engine, injection)
    engine.run(iterations)
    missing = {r for _, i in injections if i.action in MISSING_ACTIONS for r in i.targets}

    ends_base = {r: base.iteration_starts(r)[1:iterations + 1] for r in range(graph.world_size)}
    ends = {r: engine.iteration_starts(r)[1:iterations + 1] for r in range(graph.world_size)}
    world = []
    for i in range(iterations):
        late = {r: ends[r][i] - ends_base[r][i] for r in ends}
        never = [r for r, v in late.items() if math.isinf(v)]
        delayed = [r for r, v in late.items() if _EPS < v < math.inf]
        latest = max(delayed, key=lambda r: late[r]) if delayed else None
        world.append(IterationEffect(
            i + 1, len(delayed), late[latest] if latest is not None else 0.0,
            min(late[r] for r in delayed) if delayed else 0.0, latest, len(never),
            len(set(never) & missing)))

    blocked: dict[int, Blocked] = {}
    for rank in ranks:
        found = _blocked(engine, graph, rank, missing)
        if found is not None:
            blocked[rank] = found
            for other in found.waiting_for:  # say whether those failed or block too
                if other not in blocked and (b := _blocked(engine, graph, other, missing)):
                    blocked[other] = b

    def times(e: ReplayEngine, rank: int) -> tuple[float, ...]:
        starts = e.iteration_starts(rank)[:iterations + 1]
        return tuple(b - a if math.isfinite(b) else math.inf
                     for a, b in zip(starts, starts[1:], strict=False))

    return WhatIf(
        iterations=iterations,
        faults=tuple((text, "nodes" if i.action == Action.LINK else "ranks", i.targets)
                     for text, i in injections),
        base={r: times(base, r) for r in ranks},
        times={r: times(engine, r) for r in ranks},
        late={r: tuple(b - a for a, b in zip(ends_base[r], ends[r], strict=True)) for r in ranks},
        world=tuple(world), blocked=blocked,
        value_only=tuple(text for text, i in injections if i.action in VALUE_ACTIONS))


def _blocked(engine: ReplayEngine, graph: ExecutionGraph, rank: int,
             missing: set[int]) -> Blocked | None:
    """The first op ``rank`` never completes, with whom it waits for there."""
    ends = engine.iteration_starts(rank)
    iteration = next((i for i, t in enumerate(ends[1:], 1) if math.isinf(t)), None)
    if iteration is None:
        return None
    order = _issue_order(graph, rank, iteration)
    timed = engine.op_times(rank, iteration)
    for position, op in enumerate(order, 1):
        arrival, done, _ = timed.get(op, (math.inf, math.inf, None))
        if math.isfinite(done):
            continue
        spec = graph.programs[graph.class_of(rank)].ops[op]
        if math.isinf(arrival):
            return Blocked(rank, iteration, position, spec, True, ())
        return Blocked(rank, iteration, position, spec, False,
                       _absent(engine, graph, rank, iteration, op, order))
    return None  # (it ends the iteration's ops but not the iteration: no op to name)


def _issue_order(graph: ExecutionGraph, rank: int, iteration: int) -> list[int]:
    events = graph.programs[graph.class_of(rank)].events(iteration)
    return [e.op for e in events if e.action == "issue"]


def _absent(engine: ReplayEngine, graph: ExecutionGraph, rank: int, iteration: int, op: int,
            order: Sequence[int]) -> tuple[int, ...]:
    """Members of ``rank``'s group at ``op`` that never arrive at their side of it."""
    spec = graph.programs[graph.class_of(rank)].ops[op]
    axes = graph.family_axes(spec.family)
    if spec.is_p2p:
        stride = graph.mesh.strides[axes[0]]
        peer = rank + spec.peer * stride
        ends = engine.iteration_starts(peer)
        return (peer,) if len(ends) <= iteration or math.isinf(ends[iteration]) else ()
    # the op's place among the rank's ops on that family: its members' match
    # by it, as the engine pairs collectives across classes
    same = [o for o in order if graph.programs[graph.class_of(rank)].ops[o].family == spec.family
            and not graph.programs[graph.class_of(rank)].ops[o].is_p2p]
    nth = same.index(op)
    absent = []
    for member in graph.mesh.group_ranks(axes, rank):
        if member == rank:
            continue
        program = graph.programs[graph.class_of(member)]
        theirs = [o for o in _issue_order(graph, member, iteration)
                  if program.ops[o].family == spec.family and not program.ops[o].is_p2p]
        arrival = (engine.op_times(member, iteration).get(theirs[nth], (math.inf,))[0]
                   if nth < len(theirs) else math.inf)
        if math.isinf(arrival):
            absent.append(member)
    return tuple(absent)


# -- what replay --perturb prints --------------------------------------------------------


def what_if_lines(result: WhatIf) -> list[str]:
    """The perturbed iteration times with each one's change (Δ) under it,
    then what each iteration does to the world, then where ranks block."""
    lines = [f"what-if: {text} (hits {what} {_spans(targets)})"
             + (": it changes values, not timing (run it to see them)"
                if text in result.value_only else "")
             for text, what, targets in result.faults]
    lines.append(f"{'rank':>7} " + " ".join(f"{'iter ' + str(i + 1) + ' ms':>12}"
                                            for i in range(result.iterations)))
    for rank, values in result.times.items():
        lines.append(f"{rank:>7} " + " ".join(_ms(v) for v in values))
        lines.append(f"{'Δ':>7} " + " ".join(_ms(v - b, signed=True) for v, b
                                             in zip(values, result.base[rank], strict=True)))
    for e in result.world:
        if e.never:
            lines.append(f"iteration {e.iteration}: {e.never} rank(s) never end it "
                         f"({e.failed} failed, {e.never - e.failed} blocked)"
                         + (f"; {e.delayed} more end it later" if e.delayed else ""))
        elif e.delayed and e.max_delay_s - e.min_delay_s <= _EPS:
            lines.append(f"iteration {e.iteration}: {e.delayed} rank(s) end it "
                         f"{e.max_delay_s * 1e3:.2f} ms later")
        elif e.delayed:
            lines.append(f"iteration {e.iteration}: {e.delayed} rank(s) end it later, by "
                         f"{e.min_delay_s * 1e3:.2f} to {e.max_delay_s * 1e3:.2f} ms "
                         f"(rank {e.latest} the most)")
        else:
            lines.append(f"iteration {e.iteration}: no rank ends it later")
    for b in result.blocked.values():
        lines.append(b.describe(result.blocked))
    return lines


def _ms(value: float, signed: bool = False) -> str:
    if math.isinf(value):
        return f"{'never':>12}"
    return f"{value * 1e3:>+12.2f}" if signed else f"{value * 1e3:>12.2f}"


def _spans(ranks: Sequence[int]) -> str:
    word = rank_text(ranks)
    return word if len(word) <= 60 else word[:57] + "…"
