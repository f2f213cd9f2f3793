"""What ``prism-debug graph show`` and ``prism-debug replay`` print: the
analyses of :mod:`prism_debug.engine.analysis` and replayed iteration times as
lines of text, or as the dicts their ``--json`` prints (pure: no I/O)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from prism_debug.engine.analysis import ClassSummary, Segment
from prism_debug.graph import ExecutionGraph


def graph_summary(graph: ExecutionGraph, summaries: Sequence[ClassSummary],
                  segments: Sequence[Segment]) -> dict[str, object]:
    """``graph show --json``: the layout, each class's summary, the critical path."""
    return {
        "world_size": graph.world_size,
        "mesh": dict(zip(graph.mesh.names, graph.mesh.shape, strict=True)),
        "families": {k: list(v) for k, v in graph.families.items()},
        "class_axis": graph.class_axis,
        "classes": [dataclasses.asdict(c) | {"waiting_s": c.waiting_s} for c in summaries],
        "critical_path": [dataclasses.asdict(s) for s in segments],
    }


def graph_summary_lines(source: str, graph: ExecutionGraph, summaries: Sequence[ClassSummary],
                        segments: Sequence[Segment]) -> list[str]:
    """``graph show`` of the graph read from ``source``: the layout, a table
    of the classes, the slowest class (or the one pace they share), then
    :func:`critical_path_lines`."""
    lines = [
        f"graph {source}: world {graph.world_size} = "
        + " x ".join(f"{n} {s}" for n, s in zip(graph.mesh.names, graph.mesh.shape, strict=True))
        + f", {len(graph.programs)} class(es)"
        + (f" along {graph.class_axis}" if graph.class_axis else ""),
        "families: " + " · ".join(f"{name} ({' x '.join(axes) or 'single ranks'})"
                                  for name, axes in graph.families.items()),
        f"{'class':>5} {'rank':>7} {'ops':>5} {'compute ms':>11} {'iteration ms':>13} "
        f"{'waiting ms':>11}  bytes per iteration by family",
    ]
    for c in summaries:
        by_family = ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in c.bytes_by_family.items())
        lines.append(f"{c.class_id:>5} {c.representative:>7} {c.num_ops:>5} "
                     f"{c.compute_s * 1e3:>11.2f} {c.iteration_s * 1e3:>13.2f} "
                     f"{c.waiting_s * 1e3:>11.2f}  {by_family}")
    slowest = max(summaries, key=lambda c: c.iteration_s)
    if all(math.isclose(c.iteration_s, slowest.iteration_s, rel_tol=1e-9) for c in summaries):
        lines.append(f"every class: {slowest.iteration_s * 1e3:.2f} ms per iteration "
                     "(they move at one pace; the critical path shows whose)")
    else:
        lines.append(f"slowest class: {slowest.class_id} (rank {slowest.representative}): "
                     f"{slowest.iteration_s * 1e3:.2f} ms per iteration, "
                     f"{slowest.compute_s * 1e3:.2f} ms of it compute")
    return lines + critical_path_lines(segments)


def critical_path_lines(segments: Sequence[Segment]) -> list[str]:
    """The critical path's length and ends, then its compute per class and
    its communication per family (most first)."""
    total = segments[-1].end_s - segments[0].start_s if segments else 0.0
    by_class: dict[int, float] = {}
    by_family: dict[str, float] = {}
    for s in segments:
        if s.family is None:
            by_class[s.class_id] = by_class.get(s.class_id, 0.0) + s.duration_s
        else:
            by_family[s.family] = by_family.get(s.family, 0.0) + s.duration_s
    return [
        f"critical path of a steady iteration: {total * 1e3:.2f} ms in "
        f"{len(segments)} links, from class {segments[0].class_id if segments else '-'} "
        f"to class {segments[-1].class_id if segments else '-'}",
        "  compute: " + (" · ".join(f"class {c} {t * 1e3:.2f} ms"
                                    for c, t in sorted(by_class.items())) or "none"),
        "  communication: " + (" · ".join(
            f"{f} {t * 1e3:.2f} ms" for f, t in sorted(by_family.items(), key=lambda kv: -kv[1]))
            or "none"),
    ]


def iteration_table(times: Mapping[int, Sequence[float]], iterations: int) -> list[str]:
    """``replay``: a row of iteration times (ms) per rank, one column per iteration."""
    lines = [f"{'rank':>7} " + " ".join(f"{'iter ' + str(i + 1) + ' ms':>12}"
                                        for i in range(iterations))]
    for rank, values in times.items():
        lines.append(f"{rank:>7} " + " ".join(f"{v * 1e3:>12.2f}" for v in values))
    return lines
