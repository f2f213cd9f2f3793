"""Scenarios: scripted faults and expectations for a run (pure core: no torch,
ZeroMQ, CRIU or click).  The fault types are :mod:`prism_debug.faults`'s,
re-exported here because a scenario file is where most of them are written."""

from prism_debug.example import Example
from prism_debug.faults import (
    FAULT_TYPES,
    Action,
    CorruptFault,
    DelayFault,
    DesyncFault,
    DesyncKind,
    Duration,
    FailFault,
    Fault,
    HangFault,
    InfFault,
    Intermittent,
    LinkFault,
    NanFault,
    Selector,
    SlowFault,
    Trigger,
)
from prism_debug.scenario.loader import Problem, ScenarioError, lint, load_scenario, parse_scenario
from prism_debug.scenario.model import (
    DEFAULT_TOLERANCE,
    EXPECTATION_TYPES,
    PROFILE_GRAPH,
    Expectation,
    ExpectDigests,
    ExpectException,
    ExpectExitCode,
    ExpectFlightRecord,
    ExpectIterationTime,
    ExpectNanAt,
    Run,
    Scenario,
    World,
)

__all__ = [
    "DEFAULT_TOLERANCE", "EXPECTATION_TYPES", "FAULT_TYPES", "PROFILE_GRAPH", "Action",
    "CorruptFault", "DelayFault", "DesyncFault", "DesyncKind", "Duration", "Example",
    "ExpectDigests", "ExpectException", "ExpectExitCode", "ExpectFlightRecord",
    "ExpectIterationTime", "ExpectNanAt", "Expectation", "FailFault", "Fault", "HangFault",
    "InfFault", "Intermittent", "LinkFault", "NanFault", "Problem", "Run", "Scenario",
    "ScenarioError", "Selector", "SlowFault", "Trigger", "World", "lint", "load_scenario",
    "parse_scenario",
]
