"""What lint knows beyond a scenario's text: the script its command runs, its
hardware profile, the graph file it names (or the graph the graph cache already holds for its job),
and what that graph says of its faults' families, groups, classes and
collectives.

Pure core: the machine's side — how a run resolves its command, where the
graph cache keeps a job's graph — comes in through :class:`Machine`, which
``workflows/scenario_lint.py`` implements with the run's own code.  Nothing here
profiles or launches anything; where no graph exists yet, the graph checks
say nothing rather than guess.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Protocol

from prism_debug.cost import load_profile
from prism_debug.errors import ConfigError, GraphError, KeyPath, PrismError, VariabilityError
from prism_debug.faults import Action, Selector, Trigger, select
from prism_debug.graph import ExecutionGraph
from prism_debug.scenario.model import Run, World, only_real_ranks_message
from prism_debug.variability import Variability


class Machine(Protocol):
    """What lint asks of the machine a scenario would run on."""

    def command_problem(self, run: Run, source: str) -> tuple[int, str] | None:
        """Why ``run.command`` (of the scenario file ``source``) could not start,
        as the index of the word at fault and a message; None when it could."""
        ...

    def cached_graph(self, run: Run, world: World, source: str) -> Path | None:
        """The graph file the graph cache holds for this run's job (``graph:
        profile``), or None when it holds none: never profiles."""
        ...


@dataclasses.dataclass(frozen=True)
class Read:
    """What the loader could read of a file, None where it could not: the
    world, the run, and each fault's selector, trigger, action and family."""

    world: World | None
    run: Run | None
    selects: Sequence[Selector | None] = ()
    triggers: Sequence[Trigger | None] = ()
    actions: Sequence[Action | None] = ()
    families: Sequence[str | None] = ()
    variability: Variability | None = None


def graph_file(graph: str, source: str) -> Path:
    """Where ``run.graph`` points: a path relative to the scenario file's folder."""
    path = Path(graph)
    return path if path.is_absolute() else Path(source).parent / path


def problems(read: Read, source: str, machine: Machine) -> Iterator[tuple[KeyPath, str]]:
    """Every problem the scenario's surroundings show, as (key path, message)."""
    world, run = read.world, read.run
    if run is None:
        return
    if run.command is not None and (found := machine.command_problem(run, source)):
        index, message = found
        yield ("run", "command", index), message
    if run.hardware is not None:
        try:
            load_profile(run.hardware)  # read as the run reads it
        except PrismError as exc:
            yield ("run", "hardware"), str(exc)
    named = yield from _graph(read, run, source, machine)
    if named is None or world is None:
        return
    graph, name = named
    if graph.world_size != world.size:
        yield ("run", "graph"), (f"{name} is of a world of {graph.world_size} ranks; the "
                                 f"scenario's world.size is {world.size}")
        return
    if graph.gpus_per_node != world.gpus_per_node:
        yield ("run", "graph"), (f"{name} places {graph.gpus_per_node} ranks per node; the "
                                 f"scenario's world.gpus_per_node is {world.gpus_per_node}")
        return
    yield from _against_graph(read, world, graph, name)


def _graph(read: Read, run: Run, source: str, machine: Machine
           ) -> Generator[tuple[KeyPath, str], None, tuple[ExecutionGraph, str] | None]:
    """The graph the run replays, with what messages call it; None where there
    is none to read (not profiled yet, or no graph where faults need one) or it
    cannot be read, each problem yielded on the way."""
    world = read.world
    if run.graph is not None and not run.profile_graph:
        path, name = graph_file(run.graph, source), f"the graph {run.graph}"
        if not path.is_file():
            yield ("run", "graph"), (f"no such file {path}: make one with prism-debug profile, "
                                     "or write graph: profile")
            return None
        try:
            return ExecutionGraph.load(path), name
        except (GraphError, OSError) as exc:
            yield ("run", "graph"), _reason(exc, path)
            return None
    if run.profile_graph and world is not None and run.snapshot is None:
        cached = machine.cached_graph(run, world, source)
        if cached is None:
            return None  # not profiled yet: what it will hold is not known
        try:
            return ExecutionGraph.load(cached), "the cached graph of this job"
        except (GraphError, OSError) as exc:
            yield ("run", "graph"), (f"the graph cache's graph of this job, {cached}, cannot be "
                                     f"read: {_reason(exc, cached)}; remove it to profile again")
            return None
    if run.graph is None and any(a is not None for a in read.actions):
        yield ("run",), ("faults act on virtual peers replayed from an execution graph: add "
                         "graph: profile (or a graph file prism-debug profile wrote)")
    elif run.graph is None and read.variability is not None:
        yield ("run",), ("variability draws the compute of virtual peers replayed from an "
                         "execution graph: add graph: profile (or a graph file prism-debug "
                         "profile wrote)")
    return None


def _against_graph(read: Read, world: World, graph: ExecutionGraph,
                   name: str) -> Iterator[tuple[KeyPath, str]]:
    """Each fault's families, group, class and collective, and the classes
    and op kinds the variability names, against ``graph``."""
    if read.variability is not None:
        try:
            read.variability.check(graph)
        except VariabilityError as exc:
            yield ("variability",), f"{exc} ({name})"
    for i, action in enumerate(read.actions):
        if action is None:
            continue
        selector = read.selects[i] if i < len(read.selects) else None
        trigger = read.triggers[i] if i < len(read.triggers) else None
        family = read.families[i] if i < len(read.families) else None
        targets = None
        if selector is not None and action != Action.LINK:
            found = list(_selector_problems(selector, graph, name))
            for sub, message in found:
                yield ("faults", i, "select", *sub), message
            if not found:
                try:
                    targets = select(selector, world.size, world.gpus_per_node, graph)
                except ConfigError:
                    targets = None  # outside the world: the loader said so
            # (ranks, nodes and fractions the model checks: cross_rules)
            if targets and selector.kind in ("family", "class") and world.several_real_ranks \
                    and set(targets) <= set(world.real_ranks):
                yield (("faults", i, "select", selector.kind),
                       only_real_ranks_message(targets, world))
        if family is not None and family not in graph.families:
            yield ("faults", i, "family"), _no_family(family, graph, name)
        if trigger is not None and trigger.collective is not None \
                and trigger.iteration is not None and action != Action.LINK:
            # the selected ranks count their collectives; the real ranks'
            # data-parallel peers count the real ranks' (faults/model.py).
            # Ranks not known (a selector at fault): the busiest class bounds it
            classes = ({graph.class_of(rank) for rank in [*targets, *world.real_ranks]}
                       if targets is not None else range(len(graph.programs)))
            count = max(_issued(graph, c, trigger.iteration) for c in classes)
            if trigger.collective > count:
                yield ("faults", i, "at", "collective"), (
                    f"collective {trigger.collective} is beyond the {count} collectives of "
                    f"iteration {trigger.iteration} in {name}: give 1-{count}"
                    if count else
                    f"iteration {trigger.iteration} has no collectives in {name}: remove "
                    "collective")


def _selector_problems(selector: Selector, graph: ExecutionGraph,
                       name: str) -> Iterator[tuple[KeyPath, str]]:
    if selector.family is not None:
        if selector.family not in graph.families:
            yield ("family",), _no_family(selector.family, graph, name)
        elif selector.group is not None:
            count = _num_groups(graph, selector.family)
            if selector.group >= count:
                yield ("group",), (f"family {selector.family} has groups 0-{count - 1} in "
                                   f"{name}, not {selector.group}")
    if selector.class_ is not None and selector.class_ >= len(graph.programs):
        yield ("class",), (f"class {selector.class_} does not exist: {name} has classes "
                           f"0-{len(graph.programs) - 1}")


def _no_family(family: str, graph: ExecutionGraph, name: str) -> str:
    families = list(graph.families)
    # family names are short (tp, dp): a looser cutoff than for keys
    close = difflib.get_close_matches(family, families, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"no family {family!r} in {name}: {hint}it has {', '.join(families)}"


def _num_groups(graph: ExecutionGraph, family: str) -> int:
    axes = graph.family_axes(family)
    count = 1
    for axis, size in enumerate(graph.mesh.shape):
        if axis not in axes:
            count *= size
    return count


def _issued(graph: ExecutionGraph, class_id: int, iteration: int) -> int:
    """How many ops class ``class_id`` issues in ``iteration`` (the count a
    fault's ``collective`` is in)."""
    return sum(e.action == "issue" for e in graph.programs[class_id].events(iteration))


def _reason(exc: Exception, path: Path) -> str:
    if isinstance(exc, OSError):
        return f"cannot read {path}: {exc.strerror or exc}"
    return str(exc)
