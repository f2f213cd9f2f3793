"""What an execution graph says about one iteration (pure: numpy only)."""

from __future__ import annotations

import dataclasses

from prism_debug.engine.replay import CostFn, ReplayEngine
from prism_debug.graph import ExecutionGraph


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


def summarize(graph: ExecutionGraph, cost: CostFn, iterations: int = 3) -> list[ClassSummary]:
    """Per class: ops, bytes per family and compute per steady iteration, and
    the iteration time an unperturbed replay of the whole world gives."""
    engine = ReplayEngine(graph, cost)
    engine.run(iterations)
    summaries = []
    for program in graph.programs:
        rank = _representative(graph, program.class_id)
        steady = engine.iteration_times(rank)[1:] or engine.iteration_times(rank)
        summaries.append(ClassSummary(
            class_id=program.class_id, representative=rank,
            num_ops=sum(e.action == "issue" for e in program.steady),
            bytes_by_family=program.iteration_bytes(),
            compute_s=sum(e.gap_s for e in program.steady),
            iteration_s=sum(steady) / len(steady)))
    return summaries


def _representative(graph: ExecutionGraph, class_id: int) -> int:
    if graph.class_axis is None:
        return 0
    return class_id * graph.mesh.strides[graph.mesh.axis(graph.class_axis)]
