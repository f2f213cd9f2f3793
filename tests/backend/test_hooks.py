"""The objects production hangs on the runtime have what their protocols name."""

import inspect

import pytest

from prism_debug.agent.agent import Agent
from prism_debug.agent.program import ProgramRecorder
from prism_debug.backend.fr_recorder import FlightLog
from prism_debug.backend.hooks import (
    FlightHook,
    PeerFaultsHook,
    RecorderHook,
    WatchdogHook,
    WatchHook,
)
from prism_debug.backend.peer_faults import PeerFaults
from prism_debug.backend.watchdog import ErrorHandling, Watchdog
from prism_debug.engine import EmulatedClock

# an instance where one is cheap to make (its data members are checked too);
# the agent's class otherwise (it needs a run's files)
HOOKS = [
    (RecorderHook, ProgramRecorder(0.0)),
    (WatchHook, Agent),
    (WatchdogHook, Watchdog(ErrorHandling())),
    (PeerFaultsHook, PeerFaults(rank=3)),
    (FlightHook, FlightLog(3, 16, "/nonexistent/trace_rank_", EmulatedClock())),
]


def _parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


@pytest.mark.parametrize("protocol, hook", HOOKS, ids=[p.__name__ for p, _ in HOOKS])
def test_each_hook_has_its_protocols_members_with_their_parameters(protocol, hook):
    for name, member in vars(protocol).items():
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            assert hasattr(hook, name), name
        else:
            assert _parameters(getattr(hook, name)) == _parameters(member), name
