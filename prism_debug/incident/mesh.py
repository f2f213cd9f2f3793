"""The world's mesh from the process groups flight-recorder dumps name.

A group's members are pg_config's where a dump lists them (NCCL's, and
prism-debug's own), else the ranks whose entries name it (gloo's); the
groups of one description are a family, filled out to the whole world by
the family's stride (ranks that left no dump belong where the stride puts
them), and the families give the mesh as a profiled job's do
(graph/families.py, graph/build.py's ``infer_mesh``).  Every guess is a
note.  Pure: no torch.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from prism_debug.errors import GraphError, IncidentError
from prism_debug.graph.build import infer_mesh
from prism_debug.graph.execution import Mesh
from prism_debug.graph.families import WORLD_FAMILY, FamilyRecorder
from prism_debug.incident.dumps import DEFAULT_GROUP, DumpSet

DEFAULT_GROUP_DESC = "default_pg"


@dataclasses.dataclass(frozen=True)
class DumpLayout:
    world_size: int
    mesh: Mesh
    family_axes: dict[str, tuple[str, ...]]  # family -> the mesh axes its groups vary
    members: dict[str, tuple[int, ...]]  # group name -> the ranks the dumps show in it
    group_family: dict[str, str]  # group name -> its family


def dump_layout(dumps: DumpSet, world_size: int | None, notes: list[str]) -> DumpLayout:
    """The world, its mesh and every group's family; ``world_size`` where
    known, else the least the dumps allow (a note says so)."""
    members, descs, exact = _groups(dumps)
    world_size = _world_size(dumps, members, world_size, notes)
    families, group_family = _families(members, descs, exact, world_size, notes)
    recorder = FamilyRecorder(world_size)
    for name, groups in families.items():
        for ranks in groups:
            recorder.add(ranks, name)
    try:
        mesh, family_axes = infer_mesh(world_size, [s.to_dict() for s in recorder.summaries()])
    except GraphError as error:
        raise IncidentError(f"the dumps' groups make no mesh: {error}") from None
    unnamed = [name for name in mesh.names if name.startswith("_axis")]
    if len(mesh.names) == 1 and unnamed:
        notes.append("the dumps show the default group only: the mesh is one axis")
    elif unnamed:
        notes.append(f"mesh axes {', '.join(unnamed)}: no group in the dumps varies "
                     f"{'it' if len(unnamed) == 1 else 'them'} alone (the world's extent beyond "
                     "the recorded groups)")
    # FamilyRecorder names a family after its label, unless another has it already
    names = {s.name for s in recorder.summaries()}
    group_family = {g: (f if f in names else WORLD_FAMILY) for g, f in group_family.items()}
    return DumpLayout(world_size, mesh, family_axes,
                      {g: tuple(sorted(r)) for g, r in members.items()}, group_family)


def _groups(dumps: DumpSet) -> tuple[dict[str, set[int]], dict[str, str], set[str]]:
    """Each group's members (pg_config's where a dump lists them, else the
    ranks whose entries name it), its description, and which are exact."""
    members: dict[str, set[int]] = {}
    descs: dict[str, str] = {}
    exact: set[str] = set()
    for rank, dump in dumps.dumps.items():
        for name, ranks in dump.group_ranks.items():
            members.setdefault(name, set()).update(ranks)
            exact.add(name)
        for entry in dump.entries:
            members.setdefault(entry.group, set()).add(rank)
            descs.setdefault(entry.group, entry.group_desc)
    return members, descs, exact


def _world_size(dumps: DumpSet, members: dict[str, set[int]], given: int | None,
                notes: list[str]) -> int:
    seen = max([*dumps.dumps, *(r for ranks in members.values() for r in ranks)]) + 1
    if given is not None:
        if given < seen:
            raise IncidentError(f"world size {given} is smaller than the dumps' ranks "
                                f"(up to {seen - 1})")
        return given
    if DEFAULT_GROUP in _exact_groups(dumps):
        return seen  # pg_config's list of the default group's members is the world
    # a mesh tiles the world: round up to the widest span a family's groups cover
    span = 1
    for name, ranks in members.items():
        if name != DEFAULT_GROUP and len(ranks) > 1:
            ordered = sorted(ranks)
            stride = math.gcd(*(b - a for a, b in itertools.pairwise(ordered)))
            span = math.lcm(span, stride * len(range(ordered[0], ordered[-1] + 1, stride)))
    world = -(-seen // span) * span
    notes.append(f"world size {world} is a lower bound (the highest rank the dumps name, "
                 f"{seen - 1}, rounded up to the groups' span {span}): give the real one")
    return world


def _exact_groups(dumps: DumpSet) -> set[str]:
    return {name for dump in dumps.dumps.values() for name in dump.group_ranks}


def _families(members: dict[str, set[int]], descs: dict[str, str], exact: set[str],
              world_size: int, notes: list[str]
              ) -> tuple[dict[str, list[list[int]]], dict[str, str]]:
    """Each family's groups, filled out to the world by the family's stride,
    and each named group's family."""
    by_desc: dict[str, list[str]] = {}
    group_family: dict[str, str] = {}
    for name in sorted(members, key=group_order):
        desc = descs.get(name, "")
        if name == DEFAULT_GROUP or desc == DEFAULT_GROUP_DESC or \
                sorted(members[name]) == list(range(world_size)):
            group_family[name] = WORLD_FAMILY
            continue
        label = desc.removeprefix("mesh_") or f"group{name}"
        by_desc.setdefault(label, []).append(name)
        group_family[name] = label
    families: dict[str, list[list[int]]] = {}
    for label, names in by_desc.items():
        sized = [sorted(members[n]) for n in names]
        size = max(len(r) for r in sized)
        strides = {math.gcd(*(b - a for a, b in itertools.pairwise(r)))
                   for r in sized if len(r) > 1}
        if len(strides) > 1:
            raise IncidentError(f"the {label} groups are spaced differently ({sorted(strides)} "
                                "ranks apart): the skeleton needs a mesh-shaped layout")
        stride = strides.pop() if strides else 1
        if size == 1:
            notes.append(f"{label}: every group was seen with one rank only: taken as groups "
                         "of one")
        size = max([size] + [(r[-1] - r[0]) // stride + 1 for r in sized])
        if world_size % (stride * size):
            raise IncidentError(f"the {label} groups ({size} ranks {stride} apart) do not tile a "
                                f"world of {world_size}: give the world size")
        groups = {tuple(_filled(rank, stride, size)) for rank in range(world_size)}
        families[label] = [list(g) for g in sorted(groups)]
        partial = [n for n in names if len(members[n]) < size and n not in exact]
        if partial:
            notes.append(f"{label}: {size} ranks {stride} apart per group; groups "
                         f"{', '.join(partial[:5])} are filled out by that stride (their other "
                         "members left no entry)")
        for name, ranks in zip(names, sized, strict=True):
            if not set(ranks) <= set(_filled(ranks[0], stride, size)):
                raise IncidentError(f"group {name} ({label}) holds ranks {ranks}, which no "
                                    f"mesh axis of {size} ranks {stride} apart groups")
    return families, group_family


def _filled(rank: int, stride: int, size: int) -> list[int]:
    base = rank - (rank // stride) % size * stride
    return [base + i * stride for i in range(size)]


def group_order(name: str) -> tuple:
    """Groups in the order they were created: torch names them by a counter."""
    return (0, int(name), "") if name.isdecimal() else (1, 0, name)


def span_text(ranks: list[int]) -> str:
    """``0-3, 7``: ranks as runs."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
