"""From a fault's selector to the ranks it hits, in one place.

Ranks and nodes need only the world; family groups and rank classes need the
job's execution graph (a :class:`Topology`); a fraction is drawn from the
selector's own seed, so a scenario run headless, the same scenario put in
force from the console and the replay engine's prediction all pick the same
ranks.  Pure Python.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Protocol

from prism_debug.errors import ConfigError, PrismError
from prism_debug.faults.model import Action, Fault, Selector
from prism_debug.graph.selectors import expand, node_spans, select_ranks


class Topology(Protocol):
    """What selectors beyond ranks and nodes need of the job (an ``ExecutionGraph``)."""

    def family_group(self, name: str, index: int) -> list[int]: ...

    def class_ranks(self, class_id: int) -> list[int]: ...


def select(selector: Selector, world_size: int, gpus_per_node: int,
           topology: Topology | None = None) -> list[int]:
    """The ranks ``selector`` names, in order, each once; :class:`ConfigError`
    naming the selector when they are not in the world or need a graph."""
    if world_size < 1 or gpus_per_node < 1:
        raise ConfigError(f"no ranks in a world of {world_size} ({gpus_per_node} per node)")
    if selector.ranks_text is not None:
        return select_ranks(selector.ranks_text, world_size, gpus_per_node)
    if selector.selects_nodes:
        return [rank for node in select_nodes(selector, world_size, gpus_per_node)
                for rank in range(node * gpus_per_node,
                                  min(world_size, (node + 1) * gpus_per_node))]
    if selector.fraction is not None:
        count = max(1, round(selector.fraction * world_size))
        return sorted(random.Random(selector.seed or "0").sample(range(world_size), count))
    if topology is None:
        what = "a family's group" if selector.family is not None else "a class"
        raise ConfigError(f"{selector.word()}: selecting {what} needs the job's execution "
                          "graph: run without --lockstep, or with --graph (run.graph in a "
                          "scenario)")
    try:
        if selector.family is not None:
            assert selector.group is not None  # the selector's rules: family comes with group
            found = topology.family_group(selector.family, selector.group)
        else:
            assert selector.class_ is not None  # the one kind left (one_of in its rules)
            found = topology.class_ranks(selector.class_)
    except PrismError as exc:  # the graph's GraphError: no such family, group or class
        raise ConfigError(f"{selector.word()}: {exc}") from exc
    return list(dict.fromkeys(found))


def select_nodes(selector: Selector, world_size: int, gpus_per_node: int) -> list[int]:
    """The nodes a node selector names (a link fault's)."""
    return expand(node_spans(selector.node_text, -(-world_size // gpus_per_node)))


@dataclasses.dataclass(frozen=True)
class Injection:
    """A fault with its selector resolved: the ranks it hits (nodes, for a link)."""

    fault: Fault
    targets: tuple[int, ...]

    @property
    def action(self) -> Action:
        return self.fault.action

    def hits(self, rank: int) -> bool:
        return rank in self.targets

    def summary(self, text: str) -> str:
        """``text`` (the fault as written) and whom it hits, for ``perturb list``."""
        count = len(self.targets)
        what = "nodes" if self.action == Action.LINK else "ranks"
        shown = ",".join(map(str, self.targets[:4])) + (",…" if count > 4 else "")
        return f"{text}  ({count} {what}: {shown})"


def resolve(fault: Fault, world_size: int, gpus_per_node: int,
            topology: Topology | None = None) -> Injection:
    """Whom ``fault`` hits in this world (and graph)."""
    if fault.action == Action.LINK:
        return Injection(fault, tuple(select_nodes(fault.select, world_size, gpus_per_node)))
    return Injection(fault, tuple(select(fault.select, world_size, gpus_per_node, topology)))
