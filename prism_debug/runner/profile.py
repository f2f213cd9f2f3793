"""``prism-debug profile``: run one slice per rank class and build the graph.

Each slice is a real run of the script as one representative rank, with
collectives completing at once (the ``zero`` hardware), recording its
program.  The first slice reveals the layout (families, and the family
point-to-point ops travel on); it decides which other ranks to run.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

from prism_debug.agent.program import events_from_json
from prism_debug.cost import load_profile
from prism_debug.errors import ConfigError, LaunchError
from prism_debug.graph import ExecutionGraph
from prism_debug.graph.build import (
    MIN_ITERATIONS,
    RecordedIssue,
    SliceRecord,
    build_graph,
    class_axis,
    infer_mesh,
    representatives,
)
from prism_debug.runner import report as reporting
from prism_debug.runner.launch import RunOptions, run


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    command: list[str]
    world_size: int
    gpus_per_node: int
    iterations: int
    out: Path
    slice_ranks: tuple[int, ...] = ()
    run_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.iterations < MIN_ITERATIONS:
            raise ConfigError(f"--iterations must be at least {MIN_ITERATIONS} (a warm-up and "
                              f"two iterations to compare), got {self.iterations}")
        for rank in self.slice_ranks:
            if not 0 <= rank < self.world_size:
                raise ConfigError(f"slice rank {rank} is outside the world of {self.world_size}")
        if not self.out.resolve().parent.is_dir():
            raise ConfigError(f"--out {self.out}: directory {self.out.resolve().parent} does "
                              "not exist")


def profile(options: ProfileOptions, message: Callable[[str], None]) -> ExecutionGraph:
    hardware = dataclasses.replace(load_profile("zero"), gpus_per_node=options.gpus_per_node)
    slices: dict[int, SliceRecord] = {}

    def run_slice(rank: int, label: str) -> SliceRecord:
        message(f"profile: {label}: rank {rank} …")
        started = time.perf_counter()
        run_dir = (options.run_dir / f"rank{rank}") if options.run_dir else None
        result = run(RunOptions(
            command=options.command, rank=rank, world_size=options.world_size,
            profile=hardware, iterations=options.iterations, run_dir=run_dir,
            record_program=True, digests=False, bind=None), lambda line: None)
        if result.exit_code != 0:
            raise LaunchError(f"the slice for rank {rank} exited with code {result.exit_code}; "
                              f"its output is in {result.run_dir / 'rank.log'}")
        events = reporting.read_events(result.run_dir / "events.jsonl")
        iterations = tuple(events_from_json(e["program"]) for e in events
                           if e["kind"] == "iteration")
        families = next((e["families"] for e in reversed(events) if "families" in e), [])
        record = SliceRecord(rank, tuple(families), iterations[:options.iterations])
        num_issues = sum(isinstance(e, RecordedIssue) for e in iterations[-1]) \
            if iterations else 0
        message(f"profile: {label}: rank {rank} done in {time.perf_counter() - started:.1f} s: "
                f"{len(iterations)} iterations, {num_issues} ops per iteration")
        return record

    first_rank = options.slice_ranks[0] if options.slice_ranks else 0
    first = slices[first_rank] = run_slice(first_rank, "layout")
    mesh, family_axes = infer_mesh(options.world_size, first.families)
    axis = class_axis([first], family_axes)
    ranks = list(options.slice_ranks) or representatives(mesh, axis)
    message(f"profile: mesh {' x '.join(f'{n}={s}' for n, s in zip(mesh.names, mesh.shape))}; "
            f"{len(ranks)} class(es)" + (f" along {axis}" if axis else ""))
    for number, rank in enumerate(ranks, start=1):
        if rank not in slices:
            slices[rank] = run_slice(rank, f"class {number}/{len(ranks)}")
    graph = build_graph(options.world_size, options.gpus_per_node, list(slices.values()),
                        command=options.command)
    graph.save(options.out)
    message(f"profile: wrote {options.out} ({options.out.stat().st_size} bytes)")
    return graph
