"""What an incident's dumps say, in a few lines, and the scenario that reproduces it.

The scenario runs one rank for real — a victim: a rank that arrived at the
collective where the job stopped and waited there, in the culprit's group —
with the rest of the world virtual, and a fault on each culprit placed at the
same group and collective: a rank that never arrived but wrote a dump
*hangs* there, one that left no dump *fails* (fail-stop), one that arrived
with the wrong call is *desynchronised* with that kind of mismatch.  It
expects what the incident showed: the watchdog's exception, and the verdict
torch's analyzer gave on the real dumps (missing ranks, or the mismatch's
kind and culprit).  Ranks without a dump that were not the stop's culprits
(gloo aborts a rank that receives more than it expects, before it can write
one) are left out of the verdict: they are the incident's noise, said in a
comment.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from prism_debug.errors import IncidentError
from prism_debug.graph.selectors import ranks_text
from prism_debug.incident.analysis import Incident, Stop
from prism_debug.incident.dumps import DumpSet
from prism_debug.incident.placement import Placement
from prism_debug.scenario.plan import FlightFindings, group_findings

WATCHDOG = "Watchdog caught collective operation timeout"
ABORTED = 134  # SIGABRT: the watchdog takes the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING 3)
FAULT_ACTIONS = {"hang": "hang", "fail": "fail", "mismatch": "desync"}


@dataclasses.dataclass(frozen=True)
class Reproduction:
    """What the scenario is built from, beside the incident."""

    command: tuple[str, ...] = ()  # the job's command, for one rank; () when not given
    graph: str = "profile"  # run.graph: "profile" (the command's), or a graph file
    placements: dict[int, Placement] = dataclasses.field(default_factory=dict)  # culprit ->
    unplaced: str = ""  # why the graph could not place the stop, when it could not
    analyzer: FlightFindings | None = None  # torch's fr_trace on the incident's dumps
    analyzer_note: str = ""  # how it was run (on repaired copies, ...)
    timeout_s: float | None = None  # the reproduction's group timeout, if not the job's
    skeleton_notes: tuple[str, ...] = ()  # what the graph from the dumps alone guessed


def victim_of(stop: Stop) -> int:
    """The rank to run for real: the lowest that arrived and waited."""
    waited = [r for r in stop.arrived if r not in stop.culprits]
    if not waited:
        raise IncidentError(f"no rank that left a dump waited in {stop.entry.op} "
                            f"#{stop.seq} of group {stop.group.name}: there is no rank to "
                            "run for real")
    return waited[0]


def describe(incident: Incident, dumps: DumpSet, repro: Reproduction) -> list[str]:
    """The incident in a few lines, as the ``incident`` command prints it."""
    lines = [f"incident: {len(dumps.dumps)} dumps in {dumps.directory} (prefix "
             f"{dumps.prefix!r}), world of {incident.world_size} ranks"
             + ("" if not incident.no_dump else
                f"; no dump from {_some(incident.no_dump)}")]
    for name, why in dumps.damaged.items():
        lines.append(f"  unreadable: {name}: {why}")
    lines.append("groups: " + _groups_line(incident))
    stop = incident.stop
    if stop is None:
        lines.append("stopped: nowhere the dumps show: every group's members recorded the same "
                     "collectives (a hang outside collectives, or dumps written before it)")
    else:
        lines.append("stopped: " + _stop_line(stop))
        for other in incident.stops[1:4]:
            lines.append("  then:  " + _stop_line(other))
        if len(incident.stops) > 4:
            lines.append(f"  and {len(incident.stops) - 4} more groups stopped after it")
    lines.append("last completed: " + _completed_line(incident))
    if incident.timeout_ms:
        lines.append(f"timeout: {incident.timeout_ms / 1000:g} s (the process group's, from "
                     "the entries)")
    if repro.analyzer is not None:
        verdict = analyzer_line(repro.analyzer)
        if stop is not None and repro.analyzer.failure is None:
            # every group that stopped is in fr_trace's verdict; the stop's own first
            mine = analyzer_line(group_findings(repro.analyzer, stop.group.name,
                                                stop.group.members))
            if mine != verdict:
                verdict = f"{mine} in group {stop.group.name}; {verdict} over all groups"
        lines.append("fr_trace: " + verdict
                     + (f" ({repro.analyzer_note})" if repro.analyzer_note else ""))
    if stop is not None:
        for culprit, placement in sorted(repro.placements.items()):
            lines.append(f"placed: rank {culprit}'s fault at iteration {placement.iteration}, "
                         f"its op {placement.collective} ({placement.op.kind} on "
                         f"{placement.family})"
                         + (f"; {placement.disagreement}" if placement.disagreement else ""))
        if repro.unplaced:
            lines.append(f"not placed: {repro.unplaced}")
    return lines


def analyzer_line(findings: FlightFindings) -> str:
    if findings.failure is not None:
        return f"no verdict ({findings.failure})"
    parts = []
    if findings.missing_ranks:
        parts.append(f"missing ranks {sorted(findings.missing_ranks)}")
    if findings.mismatches:
        parts.append(f"{'/'.join(sorted(findings.mismatches))} mismatch")
    if findings.culprits:
        parts.append(f"culprit {sorted(findings.culprits)}")
    return ", ".join(parts) or "no error found"


def scenario_text(incident: Incident, dumps: DumpSet, repro: Reproduction, *,
                  name: str) -> str:
    """The scenario as YAML, with comments that say where each value came from."""
    stop = incident.stop
    if stop is None:
        raise IncidentError("the dumps show no collective the job stopped in: there is "
                            "nothing to reproduce")
    victim = victim_of(stop)
    kind = stop.kind
    culprits = stop.culprits
    out = [f"# Written by prism-debug incident from {dumps.directory} ({len(dumps.dumps)} dumps).",
           *(f"# {line}" for line in describe(incident, dumps, repro)),
           *(f"# skeleton: {note}" for note in repro.skeleton_notes),
           f"name: {name}",
           f"description: {json.dumps(_stop_line(stop))}",
           f"world: {{size: {incident.world_size}, rank: {victim}}}  "
           f"# rank {victim} arrived and waited",
           "run:"]
    if repro.command:
        out.append(f"  command: [{', '.join(json.dumps(a) for a in repro.command)}]")
    else:
        out.append("  # command: [python, train.py, ...]   <- the job's command for one rank: "
                   "prism-debug incident DIR -- COMMAND writes it")
    out.append(f"  graph: {json.dumps(repro.graph)}")
    last = max((p.iteration for p in repro.placements.values()), default=None)
    if last is not None:
        out.append(f"  iterations: {last + 1}")
    if repro.timeout_s is not None:
        out.append(f"  timeout_s: {repro.timeout_s:g}  # the job's was "
                   f"{incident.timeout_ms / 1000:g} s: shortened by --timeout-s")
    elif incident.timeout_ms:
        out.append(f"  timeout_s: {incident.timeout_ms / 1000:g}  # the job's, from the entries")
    out.append("faults:")
    for culprit in culprits:
        out += _fault(kind, stop, culprit, repro)
    out.append("expect:")
    out.append(f"  - exit_code: {ABORTED}")
    out.append(f"  - exception: {{type: DistBackendError, match: {json.dumps(WATCHDOG)}}}")
    out.append("  - " + _flight_expectation(stop, repro))
    return "\n".join(out) + "\n"


def _fault(kind: str, stop: Stop, culprit: int, repro: Reproduction) -> list[str]:
    lines = [f"  - action: {FAULT_ACTIONS[kind]}"]
    if kind == "mismatch":
        mismatch = next(m for m in stop.mismatched if m.rank == culprit)
        lines.append(f"    kind: {mismatch.kind}  # it called {mismatch.got}, the others "
                     f"{mismatch.expected}")
    lines.append(f"    select: {{ranks: \"{culprit}\"}}")
    placement = repro.placements.get(culprit)
    if placement is not None:
        lines.append(f"    at: {{iteration: {placement.iteration}, collective: "
                     f"{placement.collective}}}  # {stop.entry.op} #{stop.seq} on group "
                     f"{stop.group.name} ({stop.group.desc})")
    else:
        lines.append(f"    # at: not placed ({repro.unplaced or 'no graph'}): the fault acts "
                     "from iteration 1")
    return lines


def _flight_expectation(stop: Stop, repro: Reproduction) -> str:
    """torch's verdict on the real dumps where it gave one, else the dumps' own reading."""
    found = repro.analyzer
    if found is not None:
        found = group_findings(found, stop.group.name, stop.group.members)
    if stop.kind == "mismatch":
        kinds = sorted({m.kind for m in stop.mismatched})
        culprits = sorted(stop.culprits)
        if found is not None and found.failure is None and found.mismatches:
            kinds = sorted(found.mismatches)
            culprits = sorted(found.culprits) or culprits
        body = f"mismatch: {kinds[0]}, culprits: {culprits}"
    else:
        missing = sorted(stop.culprits)
        if found is not None and found.failure is None and found.missing_ranks:
            missing = sorted(found.missing_ranks)
        body = f"missing_ranks: {missing}"
    source = (f"torch's fr_trace on the incident's dumps, group {stop.group.name}"
              if found is not None and found.failure is None and (found.missing_ranks or
                                                                  found.mismatches)
              else "the dumps' entries (fr_trace gave no verdict on this group)")
    return f"flight_record: {{{body}}}  # as {source}"


def _stop_line(stop: Stop) -> str:
    group = f"group {stop.group.name} ({stop.group.desc or 'no description'}, " \
            f"{len(stop.group.members)} ranks)"
    what = f"{stop.entry.call()} #{stop.seq} on {group}"
    if stop.kind == "mismatch":
        wrong = "; ".join(f"rank {m.rank} called {m.got}" for m in stop.mismatched)
        return f"{what}: {wrong}, the others {stop.entry.call()}"
    never = []
    if stop.missing:
        never.append(f"{_some(stop.missing)} never arrived")
    if stop.no_dump:
        never.append(f"{_some(stop.no_dump)} left no dump")
    return f"{what}: {' and '.join(never)}; {_some(stop.arrived)} waited"


def _groups_line(incident: Incident) -> str:
    by_desc: dict[str, list] = {}
    for group in incident.groups:
        by_desc.setdefault(group.desc or "?", []).append(group)
    parts = []
    for desc, groups in by_desc.items():
        sizes = sorted({len(g.members) for g in groups})
        shown = "/".join(str(s) for s in sizes)
        parts.append(f"{desc} ({len(groups)} of {shown} ranks)" if len(groups) > 1
                     else f"{desc} ({shown} ranks)")
    return " · ".join(parts)


def _completed_line(incident: Incident) -> str:
    by_desc: dict[str, set[int]] = {}
    for group in incident.groups:
        last = incident.last_completed.get(group.name)
        by_desc.setdefault(group.desc or "?", set()).add(last[0] if last else 0)
    return " · ".join(f"{desc} #{'/'.join(str(s) for s in sorted(seqs)[:4])}"
                      for desc, seqs in by_desc.items())


def _some(ranks: Sequence[int], most: int = 12) -> str:
    """Ranks, shortened past ``most`` ranges."""
    text = ranks_text(ranks)
    parts = text.split(", ")
    if len(parts) > most:
        text = ", ".join(parts[:most]) + f", … ({len(ranks)} ranks)"
    return ("rank " if len(ranks) == 1 else "ranks ") + text
