"""Only the rank's own process links to the bus: not a process it starts that
imports torch too (it inherits the claim), not a forked copy (a DataLoader worker)."""

from __future__ import annotations

import os

import pytest

from prism_debug.agent.config import OWNER_ENV_VAR, AgentConfig, claim_bus
from prism_debug.agent.link import BusLink

agent = pytest.importorskip("prism_debug.agent.agent")


def config(**fields) -> AgentConfig:
    return AgentConfig(rank=3, world_size=8, gpus_per_node=8, hardware={}, seed=0,
                       values="random", events_path="/dev/null", bus="ipc:///nowhere",
                       bus_curve=None, bus_secret="s3cret", start_paused=True, **fields)


def test_the_first_process_claims_the_bus_and_keeps_it(monkeypatch):
    monkeypatch.delenv(OWNER_ENV_VAR, raising=False)
    assert claim_bus(config()) == config()
    assert os.environ[OWNER_ENV_VAR] == str(os.getpid())
    assert claim_bus(config()) == config()  # the same process again (an exec)


def test_a_process_the_rank_started_loads_the_agent_without_a_link(monkeypatch):
    monkeypatch.setenv(OWNER_ENV_VAR, str(os.getpid() + 1))  # the rank is our parent
    claimed = claim_bus(config())
    assert (claimed.bus, claimed.bus_curve, claimed.bus_secret, claimed.start_paused) == (
        None, None, None, False)
    assert os.environ[OWNER_ENV_VAR] == str(os.getpid() + 1)


def test_a_forked_copy_of_the_rank_never_starts_the_link():
    link = BusLink("ipc:///nowhere", 3, os.getpid(), lambda verb, args: {}, lambda: None,
                   secret="s3cret")
    child = os.fork()
    if child == 0:  # the worker: its start is a no-op, so no thread, no socket
        link.start()
        os._exit(0 if link._thread is None else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
