"""What an execution graph says about one iteration (pure: numpy only)."""

from __future__ import annotations

import dataclasses

from prism_debug.engine.replay import CostFn, ReplayEngine
from prism_debug.graph import ExecutionGraph
from prism_debug.graph.build import representatives


@dataclasses.dataclass(frozen=True)
class ClassSummary:
    class_id: int
    representative: int  # a rank of the class
    num_ops: int
    bytes_by_family: dict[str, int]
    compute_s: float  # the program's own compute per steady iteration
    iteration_s: float  # replayed steady iteration time

    @property
    def waiting_s(self) -> float:
        return max(0.0, self.iteration_s - self.compute_s)


def summarize(graph: ExecutionGraph, cost: CostFn,
              steady_iterations: int = 2) -> list[ClassSummary]:
    """Per class: ops, bytes per family and compute per steady iteration, and
    the iteration time an unperturbed replay of the whole world gives, averaged
    over ``steady_iterations`` after every class's warm-up."""
    # Even without a warm-up, the first iteration holds the pipeline's fill.
    skip = max(1, max(len(p.warmup) for p in graph.programs))
    engine = ReplayEngine(graph, cost)
    engine.run(skip + steady_iterations)
    ranks = representatives(graph.mesh, graph.class_axis)
    summaries = []
    for program in graph.programs:
        rank = ranks[program.class_id]
        steady = engine.iteration_times(rank)[skip:]
        summaries.append(ClassSummary(
            class_id=program.class_id, representative=rank,
            num_ops=sum(e.action == "issue" for e in program.steady),
            bytes_by_family=program.iteration_bytes(),
            compute_s=sum(e.gap_s for e in program.steady),
            iteration_s=sum(steady) / len(steady)))
    return summaries


@dataclasses.dataclass(frozen=True)
class Segment:
    """One link of a critical path: compute of a class, or an op's transfer."""

    class_id: int
    what: str  # "compute", or the op: "all_reduce on tp", "send on pp"
    family: str | None  # the op's family (None for compute)
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


def critical_path(graph: ExecutionGraph, cost: CostFn) -> list[Segment]:
    """The chain of compute and transfers that sets one steady iteration's
    length, first link first (an unperturbed replay of the whole world).

    Walking back from the class that ends the iteration last: compute runs
    back to the latest wait that blocked; that op completed when its last
    member arrived plus its own time, so the chain goes on from the op whose
    arrival was last — in this class or another — at its issue.  It ends
    where a class's iteration began.
    """
    iteration = max(1, max(len(p.warmup) for p in graph.programs)) + 1
    engine = ReplayEngine(graph, cost, record=True)
    engine.run(iteration)
    ranks = representatives(graph.mesh, graph.class_axis)
    times = [engine.op_times(rank, iteration) for rank in ranks]
    bounds = [engine.iteration_starts(rank)[iteration - 1:iteration + 1] for rank in ranks]

    def timeline(class_id: int) -> list[tuple[float, float]]:
        """Each event's time once its compute gap ran, and once it was over."""
        t, out = bounds[class_id][0], []
        for event in graph.programs[class_id].events(iteration):
            t += event.gap_s
            before = t
            if event.action == "wait":
                t = max(t, times[class_id][event.op][1])
            out.append((before, t))
        return out

    class_id = max(range(len(ranks)), key=lambda c: bounds[c][1])
    events = graph.programs[class_id].events(iteration)
    position = len(events) - 1
    segments: list[Segment] = []
    while position >= 0:
        events = graph.programs[class_id].events(iteration)
        steps = timeline(class_id)
        event = events[position]
        before, after = steps[position]
        if event.action == "wait" and after > before:
            # blocked: the op's last arrival, then the op itself, are the chain
            spec = graph.programs[class_id].ops[event.op]
            cause = times[class_id][event.op][2]
            assert cause is not None, "the event loop records every op's cause"
            cause_class, cause_op = cause
            arrival = times[cause_class][cause_op][0]
            segments.append(Segment(class_id, f"{spec.kind} on {spec.family}", spec.family,
                                    arrival, after))
            class_id = cause_class
            position = next(i for i, e in enumerate(graph.programs[class_id].events(iteration))
                            if e.action == "issue" and e.op == cause_op)
            continue
        if event.gap_s:
            segments.append(Segment(class_id, "compute", None, before - event.gap_s, before))
        position -= 1
    segments.reverse()
    return _merged(segments)


def _merged(segments: list[Segment]) -> list[Segment]:
    """Adjacent compute of one class as one segment."""
    merged: list[Segment] = []
    for segment in segments:
        last = merged[-1] if merged else None
        if last and last.what == segment.what == "compute" and last.class_id == segment.class_id:
            merged[-1] = dataclasses.replace(last, end_s=segment.end_s)
        else:
            merged.append(segment)
    return merged
