"""The closed form a prediction is checked against: a DDP-shaped world (every
rank computes, then one all-reduce over all of them) with iid normal
compute has an expected iteration time of g·E[max of n normals] + the
all-reduce's cost — order statistics, by numerical integration, no Monte
Carlo.  Used by ``tools/bench_predict.py`` and ``tests/predict``.  Pure core."""

from __future__ import annotations

from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec
from prism_debug.variability import expected_max_normal

DDP_BYTES = 100 << 20  # one 100 MiB bucket of gradients


def ddp_graph(ranks: int, gap_s: float, *, nbytes: int = DDP_BYTES,
              gpus_per_node: int = 8) -> ExecutionGraph:
    """One class on one ``dp`` axis of ``ranks``: compute ``gap_s``, issue an
    all-reduce over every rank, wait for it, end the iteration."""
    program = ClassProgram(
        class_id=0, ops=(OpSpec("all_reduce", "dp", nbytes),), warmup=(),
        steady=(Event("issue", gap_s, 0), Event("wait", 0.0, 0), Event("end", 0.0)))
    return ExecutionGraph(mesh=Mesh((ranks,), ("dp",)), families={"dp": ("dp",)},
                          class_axis=None, programs=(program,), gpus_per_node=gpus_per_node)


def ddp_expected_iteration_s(ranks: int, gap_s: float, cv: float, cost_s: float) -> float:
    """E[iteration] of :func:`ddp_graph` when each rank's compute is ``gap_s``
    × an iid normal factor of mean 1 and standard deviation ``cv``: every
    rank leaves the all-reduce when the slowest arrives plus its cost, so an
    iteration lasts gap_s·max(factors) + cost_s."""
    return expected_max_normal(ranks, gap_s, gap_s * cv) + cost_s
