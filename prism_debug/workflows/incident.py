"""``prism-debug incident``: from a directory of flight-recorder dumps to a
scenario that reproduces the incident.

The pure parts say what the dumps show (``incident.analysis``), place it in
the job's iterations (``incident.placement``) and write the scenario
(``incident.reproduce``); this adapter runs torch's own analyzer on the
dumps (on repaired copies where real gloo dumps stop it), profiles the job's
command into the graph cache the scenario's run then finds, and writes the
files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from prism_debug.errors import GraphError, IncidentError
from prism_debug.graph import ExecutionGraph
from prism_debug.incident.analysis import Group, Incident, analyse
from prism_debug.incident.dumps import DumpSet, read_dumps
from prism_debug.incident.placement import Placement, family_of, place
from prism_debug.incident.reproduce import Reproduction, describe, scenario_text
from prism_debug.incident.skeleton import build_skeleton
from prism_debug.process.interpreter import with_interpreter
from prism_debug.scenario.plan import FlightFindings
from prism_debug.workflows.fr_analyzer import needs_repair, repaired_copies, run_fr_trace
from prism_debug.workflows.graph_cache import cached_graph

Message = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class IncidentOptions:
    dump_dir: Path
    prefix: str | None = None
    out: Path | None = None  # the scenario file; None: print the summary only
    command: tuple[str, ...] = ()  # the job's command for one rank
    world_size: int | None = None  # where the dumps cannot tell it
    gpus_per_node: int = 8
    run_dir: Path | None = None  # the profile's files
    analyzer: bool = True  # run torch's fr_trace on the dumps
    timeout_s: float | None = None  # the reproduction's group timeout, if not the job's


@dataclasses.dataclass(frozen=True)
class IncidentResult:
    dumps: DumpSet
    incident: Incident
    reproduction: Reproduction
    summary: list[str]
    scenario: Path | None
    graph: Path | None  # the graph the fault was placed with
    skeleton_notes: tuple[str, ...] = ()  # what the skeleton guessed (no command given)


def import_incident(options: IncidentOptions,
                    message: Message = lambda line: None) -> IncidentResult:
    """What the dumps under ``options.dump_dir`` say happened, placed in the job's
    graph (``options.command``'s, profiled once, or the dumps' own skeleton),
    and the scenario that reproduces it, written to ``options.out``."""
    dumps = read_dumps(options.dump_dir, options.prefix)
    incident = analyse(dumps, options.world_size)
    findings, note = None, ""
    if options.analyzer:
        findings, note = _analyzer(dumps, incident)
    command = _absolute_scripts(options.command)
    placements: dict[int, Placement]  # culprit -> where its fault goes
    graph_path, placements, unplaced, graph_ref = None, {}, "", "profile"
    notes: tuple[str, ...] = ()
    stop = incident.stop
    if stop is not None and command:
        graph_path = cached_graph(with_interpreter(list(command)), incident.world_size,
                                  options.gpus_per_node, run_dir=options.run_dir,
                                  message=message)
        graph = ExecutionGraph.load(graph_path)
        placements, unplaced = _placements(
            graph, incident, lambda group, rank: family_of(graph, group, rank))
    elif stop is not None:
        # no code: the dumps' own skeleton places the stop, by the ops they recorded
        try:
            skeleton = build_skeleton(dumps, world_size=incident.world_size)
        except (IncidentError, GraphError) as error:  # the summary and scenario still stand
            skeleton, unplaced = None, f"the dumps make no graph: {error}"
        if skeleton is not None:
            notes = skeleton.notes
            placements, unplaced = _placements(
                skeleton.graph, incident,
                lambda group, rank: getattr(skeleton.groups.get(group.name), "family", None))
        if skeleton is not None and options.out is not None:
            graph_path = options.out.with_suffix(".prism")
            skeleton.graph.save(graph_path)
            graph_ref = graph_path.name  # beside the scenario, which names it relatively
    repro = Reproduction(command=command, graph=graph_ref, placements=placements,
                         unplaced=unplaced, analyzer=findings, analyzer_note=note,
                         timeout_s=options.timeout_s, skeleton_notes=notes)
    summary = describe(incident, dumps, repro)
    if graph_path is not None and not command:
        summary.append(f"skeleton: wrote {graph_path} (prism-debug graph show / replay it); "
                       f"{len(notes)} notes on what it guessed, in the scenario's comments")
    scenario = None
    if options.out is not None and stop is None:
        summary.append(f"no scenario written to {options.out}: the dumps show nothing to "
                       "reproduce")
    if options.out is not None and stop is not None:
        name = _scenario_name(options.dump_dir)
        text = scenario_text(incident, dumps, repro, name=name)
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(text, encoding="utf-8")
        scenario = options.out
    return IncidentResult(dumps, incident, repro, summary, scenario, graph_path, notes)


def _analyzer(dumps: DumpSet, incident: Incident) -> tuple[FlightFindings, str]:
    """fr_trace's verdict, and how it was reached."""
    incomplete = bool(incident.no_dump)
    if not needs_repair(dumps):
        return run_fr_trace(dumps.directory, dumps.prefix, incomplete=incomplete), ""
    stop = incident.stop
    lead = min((r for r in stop.arrived if r not in stop.culprits), default=None) \
        if stop is not None else None
    with tempfile.TemporaryDirectory(prefix="prism-fr-") as tmp:
        copies = repaired_copies(dumps, incident, Path(tmp) / "dumps", lead)
        found = run_fr_trace(copies, dumps.prefix, incomplete=incomplete)
    return found, ("on copies whose pg_config names the entries' groups: as written, "
                   "these dumps stop it")


def _placements(graph: ExecutionGraph, incident: Incident,
                family_for: Callable[[Group, int], str | None]
                ) -> tuple[dict[int, Placement], str]:
    """Each culprit's fault: where it should have issued the collective the
    others waited in; for a culprit whose own dump shows it stopped sooner in
    another group, the earliest op it never issued.  ``family_for`` names
    the graph's family of a dump's group."""
    stop = incident.stop
    assert stop is not None
    placements, reasons = {}, []
    if graph.world_size != incident.world_size:
        return {}, (f"the graph's world is {graph.world_size} ranks, the incident's "
                    f"{incident.world_size}")
    for culprit in stop.culprits:
        found = []
        for group in incident.groups:
            if culprit not in group.members:
                continue
            if group is stop.group:
                seq, entry = stop.seq, stop.entry
            elif culprit in group.last_seq and stop.kind == "hang":
                seq, entry = group.last_seq[culprit] + 1, None
            else:
                continue
            family = family_for(group, culprit)
            if family is None:
                reasons.append(f"no family of the graph holds group {group.name} "
                               f"({group.desc}) of ranks {list(group.members)[:8]}")
                continue
            placed = place(graph, culprit, family, seq, entry)
            if isinstance(placed, str):
                reasons.append(placed)
            else:
                found.append(placed)
        if found:
            placements[culprit] = min(found, key=lambda p: (p.iteration, p.collective))
    unplaced = "" if len(placements) == len(stop.culprits) else "; ".join(reasons)
    return placements, unplaced


def _absolute_scripts(command: tuple[str, ...]) -> tuple[str, ...]:
    """Scripts named relative to here, made absolute: the scenario may be run
    from elsewhere, and the graph cache keys on the command as written."""
    return tuple(str(Path(word).resolve()) if word.endswith(".py") and Path(word).is_file()
                 and not os.path.isabs(word) else word for word in command)


def _scenario_name(directory: Path) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", Path(directory).resolve().name).strip("-.")
    return base if base.startswith("incident") else f"incident-{base or 'dumps'}"
