"""Group families: the process groups a script creates, clustered by role.

SPMD scripts call ``new_group`` for *every* group (all TP groups, then all DP
groups, ...), members or not, so the real rank sees the whole layout.  Groups
created together that partition the world form a *family*.  Families are what
later issues key on: the execution graph records "all-reduce on family dp",
perturbations select "family tp, group 17".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

WORLD_FAMILY = "world"


@dataclasses.dataclass(frozen=True)
class FamilySummary:
    name: str
    num_groups: int
    group_size: int
    stride: int | None  # rank distance inside a group when it is regular
    complete: bool  # True when the family's groups cover the whole world

    def to_dict(self) -> dict[str, str | int | bool | None]:
        return {
            "name": self.name, "num_groups": self.num_groups, "group_size": self.group_size,
            "stride": self.stride, "complete": self.complete,
        }


@dataclasses.dataclass
class _Family:
    name: str
    label: str  # the group description groups of this family were created with
    group_size: int
    stride: int | None
    num_groups: int = 0
    num_covered: int = 0
    covered: bytearray | None = None  # dropped once the family is complete

    def summary(self) -> FamilySummary:
        return FamilySummary(self.name, self.num_groups, self.group_size, self.stride,
                             self.covered is None)


@dataclasses.dataclass(frozen=True)
class GroupRef:
    """Where one group sits: its family and its index inside the family."""

    family: str
    index: int


class FamilyRecorder:
    """Clusters group definitions into families as the script creates them.

    A new group joins the most recent family that has the same description,
    size and stride, is not complete yet and shares no rank with it;
    otherwise it starts a new family.  (Disjoint groups of one size and
    stride that cover the world can only tile it as a mesh axis does.)
    O(group size) per definition.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._families: list[_Family] = [
            _Family(WORLD_FAMILY, WORLD_FAMILY, world_size, 1, num_groups=1, num_covered=world_size)
        ]
        self._names = {WORLD_FAMILY}
        self.version = 0  # bumped on every change, so readers can tell cheaply

    def add(self, ranks: Iterable[int], desc: str | None = None) -> GroupRef:
        ranks = list(ranks)
        label = _label(desc)
        stride = _stride(ranks)
        family = self._open_family(ranks, label, stride)
        if family is None:
            family = _Family(
                name=self._unique_name(label or f"family{len(self._families)}"),
                label=label, group_size=len(ranks), stride=stride,
                covered=bytearray(self.world_size),
            )
            self._families.append(family)
        assert family.covered is not None
        for rank in ranks:
            family.covered[rank] = 1
        family.num_covered += len(ranks)
        family.num_groups += 1
        if family.num_covered == self.world_size:
            family.covered = None
        self.version += 1
        return GroupRef(family.name, family.num_groups - 1)

    def summaries(self) -> list[FamilySummary]:
        return [f.summary() for f in self._families]

    def _open_family(self, ranks: list[int], label: str, stride: int | None) -> _Family | None:
        for family in reversed(self._families):
            covered = family.covered
            if (covered is not None and family.label == label
                    and family.group_size == len(ranks) and family.stride == stride
                    and not any(covered[r] for r in ranks)):
                return family
        return None

    def _unique_name(self, base: str) -> str:
        name, suffix = base, 2
        while name in self._names:
            name, suffix = f"{base}#{suffix}", suffix + 1
        self._names.add(name)
        return name


def _label(desc: str | None) -> str:
    # DeviceMesh describes its groups as "mesh_<dim name>"; users think "<dim name>".
    if not desc or desc == "undefined":
        return ""
    return desc.removeprefix("mesh_")


def _stride(ranks: list[int]) -> int | None:
    if len(ranks) < 2:
        return None
    stride = ranks[1] - ranks[0]
    if all(b - a == stride for a, b in zip(ranks, ranks[1:], strict=False)):
        return stride
    return None
