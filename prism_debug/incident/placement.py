"""Where in the job's iterations a collective of the dumps falls.

The dumps number each group's collectives from the job's start and say
nothing of iterations; the execution graph of the job's command says how
many collectives each iteration issues on each family (warm-up iterations
apart).  Counting along the rank's class program finds the iteration of the
N-th collective on a group, and its position among everything the rank
issues in that iteration: what a fault's ``at: {iteration, collective}``
names (faults/model.py).  The op found there is checked against the dump's
(kind, element count): a graph that disagrees is not this job's graph, or
not at this world size, and the placement says so.
"""

from __future__ import annotations

import dataclasses

from prism_debug.backend.fr_dump_format import dtype_of_scalar_type
from prism_debug.graph.execution import ExecutionGraph, OpSpec
from prism_debug.graph.families import WORLD_FAMILY
from prism_debug.incident.analysis import Group
from prism_debug.incident.dumps import DEFAULT_GROUP, Entry

# bytes per element of the dtypes dumps name (torch.dtype.itemsize)
ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1,
            "int16": 2, "int32": 4, "int64": 8, "bool": 1, "complex64": 8, "complex128": 16,
            "float8_e4m3fn": 1, "float8_e5m2": 1, "uint16": 2, "uint32": 4, "uint64": 8}


@dataclasses.dataclass(frozen=True)
class Placement:
    iteration: int  # from 1
    collective: int  # the op's position among the rank's issues in that iteration, from 1
    family: str
    op: OpSpec
    disagreement: str = ""  # how the graph's op differs from the dump's, if it does


def family_of(graph: ExecutionGraph, group: Group, rank: int) -> str | None:
    """The graph's family of a dump's group: the one named like the group's
    description whose group of ``rank`` holds the members the dumps show."""
    label = group.desc.removeprefix("mesh_")
    if group.name == DEFAULT_GROUP or label == "default_pg":
        return WORLD_FAMILY
    members = set(group.members)
    candidates = [label] if label in graph.families else []
    candidates += [f for f in graph.families if f not in candidates and f != WORLD_FAMILY]
    for family in candidates:
        ranks = set(graph.mesh.group_ranks(graph.family_axes(family), rank))
        if members <= ranks and (family == label or members == ranks):
            return family
    return None


def place(graph: ExecutionGraph, rank: int, family: str, seq: int,
          entry: Entry | None = None) -> Placement | str:
    """The ``seq``-th collective (from 1) ``rank`` issues on ``family``, or
    why the graph cannot say."""
    if not 0 <= rank < graph.world_size:
        return f"rank {rank} is outside the graph's world of {graph.world_size}"
    program = graph.programs[graph.class_of(rank)]
    count, iteration = 0, 0
    while True:
        iteration += 1
        events = program.events(iteration)
        issues = [program.ops[e.op] for e in events if e.action == "issue"]
        on_family = [op for op in issues if op.family == family and not op.is_p2p]
        if not on_family and iteration > len(program.warmup):
            return (f"the graph's class {program.class_id} issues no collective on family "
                    f"{family!r} in its steady iterations")
        if count + len(on_family) >= seq:
            wanted = seq - count
            for position, op in enumerate(issues, start=1):
                if op.family == family and not op.is_p2p:
                    wanted -= 1
                    if wanted == 0:
                        return Placement(iteration, position, family, op,
                                         _disagreement(op, entry))
        count += len(on_family)


def _disagreement(op: OpSpec, entry: Entry | None) -> str:
    if entry is None:
        return ""
    dtype = dtype_of_scalar_type(entry.input_dtypes[0]) if entry.input_dtypes else None
    nbytes = entry.numel * ITEMSIZE.get(dtype or "", 0)
    if op.kind != entry.op.removeprefix("_").removesuffix("_base"):
        return f"the graph has {op.kind} there, the dumps {entry.op}"
    if dtype is not None and nbytes and nbytes != op.nbytes:
        return f"the graph's {op.kind} there moves {op.nbytes} bytes, the dumps' {nbytes}"
    return ""
