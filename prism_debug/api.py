"""prism-debug from Python: run a command as one rank of a huge job, restore a
snapshot, run a scenario, import an incident's flight-recorder dumps — the
calls the CLI, the scenario runner and test plugins make too.  ::

    from prism_debug import api

    result = api.run(api.RunOptions(
        command=["python", "train.py"], rank=4097, world_size=8192,
        faults=(api.parse_fault("slow node:512 1.16 from 3"),), snapshot_at=(2,)))
    again = api.restore(api.RestoreOptions(snapshot_id=result.snapshots[0], iterations=2))
    assert again.report["iterations"][-1]["digest"] == result.report["iterations"][3]["digest"]

    verdict = api.run_scenario(api.load_scenario("examples/scenarios/nan_peer.yaml"))
    assert verdict.passed, [v.line() for v in verdict.verdicts]

    found = api.import_incident(api.IncidentOptions(
        dump_dir=Path("incident-dumps"), out=Path("repro.yaml"),
        command=("python", "train.py")))
    print("\n".join(found.summary)); api.run_scenario(api.load_scenario(found.scenario))

``api.run(RunOptions(...))`` is the run ``prism-debug run`` makes of the same
arguments: virtual peers replay the job's graph, profiled once and cached
(``graph_path`` names a graph file instead, ``lockstep=True`` lets peers
arrive with the real rank), on the ``h100-ib400`` profile unless ``profile``
names another, the bundled example when ``command`` is empty, and in a
torchrun worker this host's share of ``ranks``.

Each call blocks until the rank has exited and returns what it left (its
report, exit code and files); ``message`` receives the lines the CLI would
print (none by default).  Errors are :class:`~prism_debug.errors.PrismError`
subclasses whose message says what to do.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prism_debug.controller import launch
from prism_debug.controller.restore import restore
from prism_debug.cost import HardwareProfile, load_profile
from prism_debug.errors import PrismError
from prism_debug.faults import Fault, fault_from_dict, fault_text, parse_fault
from prism_debug.process.options import RestoreOptions, RunOptions, RunResult, on_this_host
from prism_debug.workflows.graph_cache import PROFILE_ITERATIONS, with_graph

if TYPE_CHECKING:
    from prism_debug.scenario import Scenario, load_scenario, parse_scenario
    from prism_debug.workflows.incident import IncidentOptions, IncidentResult, import_incident
    from prism_debug.workflows.scenario_run import ScenarioResult, run_scenario

# The scenario runner and the incident import load on first use (PEP 562):
# every `prism-debug run` imports this module, and they would add a sixth
# of a second to its start.
_ON_FIRST_USE = {
    "Scenario": "prism_debug.scenario", "load_scenario": "prism_debug.scenario",
    "parse_scenario": "prism_debug.scenario",
    "IncidentOptions": "prism_debug.workflows.incident",
    "IncidentResult": "prism_debug.workflows.incident",
    "import_incident": "prism_debug.workflows.incident",
    "ScenarioResult": "prism_debug.workflows.scenario_run",
    "run_scenario": "prism_debug.workflows.scenario_run",
}


if not TYPE_CHECKING:  # (mypy reads the imports above: a misspelt name stays an error)
    def __getattr__(name: str) -> Any:
        module = _ON_FIRST_USE.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # (found directly from now on)
        return value


def __dir__() -> list[str]:
    return sorted(globals().keys() | _ON_FIRST_USE.keys())


def run(options: RunOptions, message: Callable[[str], None] = lambda line: None) -> RunResult:
    """Run ``options.command`` (the bundled example when empty) as the real
    rank(s) of the emulated job, to its end, as ``prism-debug run`` does: its
    graph profiled first (or taken from the cache) unless ``options.lockstep``
    or ``options.graph_path`` says otherwise, and in a torchrun worker this
    host's share of ``options.ranks``."""
    options = on_this_host(options, os.environ, PROFILE_ITERATIONS)
    return launch.run(options, message, with_graph)


__all__ = [
    "Fault", "HardwareProfile", "IncidentOptions", "IncidentResult", "PrismError",
    "RestoreOptions", "RunOptions", "RunResult", "Scenario", "ScenarioResult",
    "fault_from_dict", "fault_text", "import_incident", "load_profile", "load_scenario",
    "parse_fault", "parse_scenario", "restore", "run", "run_scenario",
]
