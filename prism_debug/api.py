"""prism-debug from Python: run a command as one rank of a huge job, restore a
snapshot, run a scenario, import an incident's flight-recorder dumps — the
calls the CLI, the scenario runner and test plugins make too.  ::

    from prism_debug import api

    result = api.run(api.RunOptions(
        command=["python", "train.py"], rank=4097, world_size=8192,
        profile=api.load_profile("h100-ib400"), profile_graph=True,
        faults=(api.parse_fault("slow node:512 1.16 from 3"),), snapshot_at=(2,)))
    again = api.restore(api.RestoreOptions(snapshot_id=result.snapshots[0], iterations=2))
    assert again.report["iterations"][-1]["digest"] == result.report["iterations"][3]["digest"]

    verdict = api.run_scenario(api.load_scenario("examples/scenarios/nan_peer.yaml"))
    assert verdict.passed, [v.line() for v in verdict.verdicts]

    found = api.import_incident(api.IncidentOptions(
        dump_dir=Path("incident-dumps"), out=Path("repro.yaml"),
        command=("python", "train.py")))
    print("\n".join(found.summary)); api.run_scenario(api.load_scenario(found.scenario))

``profile_graph=True`` replays virtual peers from the job's graph, profiled
once and cached (what ``prism-debug run`` does unless told ``--lockstep``);
``graph_path`` names a graph file instead; with neither, peers arrive in
lockstep with the real rank.

Each call blocks until the rank has exited and returns what it left (its
report, exit code and files); ``message`` receives the lines the CLI would
print (none by default).  Errors are :class:`~prism_debug.errors.PrismError`
subclasses whose message says what to do.
"""

from __future__ import annotations

from collections.abc import Callable

from prism_debug.controller import launch
from prism_debug.controller.launch import restore
from prism_debug.cost import HardwareProfile, load_profile
from prism_debug.errors import PrismError
from prism_debug.faults import Fault, fault_from_dict, fault_text, parse_fault
from prism_debug.process.options import RestoreOptions, RunOptions, RunResult
from prism_debug.scenario import Scenario, load_scenario, parse_scenario
from prism_debug.workflows.graph_cache import with_graph
from prism_debug.workflows.incident import IncidentOptions, IncidentResult, import_incident
from prism_debug.workflows.scenario_run import ScenarioResult, run_scenario


def run(options: RunOptions, message: Callable[[str], None] = lambda line: None) -> RunResult:
    """Run ``options.command`` as one real rank of the emulated job, to its
    end — its graph profiled first (or taken from the cache) when
    ``options.profile_graph`` asks for one."""
    return launch.run(options, message, with_graph)


__all__ = [
    "Fault", "HardwareProfile", "IncidentOptions", "IncidentResult", "PrismError",
    "RestoreOptions", "RunOptions", "RunResult", "Scenario", "ScenarioResult",
    "fault_from_dict", "fault_text", "import_incident", "load_profile", "load_scenario",
    "parse_fault", "parse_scenario", "restore", "run", "run_scenario",
]
