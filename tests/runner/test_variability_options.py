"""--variability in a run's options, the agent's configuration and a
snapshot's environment digest (nothing here starts a rank)."""

from __future__ import annotations

import hashlib
import json

import pytest

from prism_debug.agent.config import AgentConfig
from prism_debug.capture.snapshots import _environment_digest
from prism_debug.cost import load_profile
from prism_debug.errors import ConfigError
from prism_debug.process.options import RunOptions
from prism_debug.variability import Variability, parse_variability

VARIABILITY = parse_variability(["cv=0.05 dist=gamma", "class=1 rank-cv=0.02"])


def options(**changes) -> RunOptions:
    return RunOptions(command=["python", "train.py"], rank=1, world_size=8,
                      profile=load_profile("h100-ib400"), seed=4, **changes)


def test_variability_under_lockstep_is_refused_saying_to_use_a_graph():
    with pytest.raises(ConfigError, match=r"^--variability needs a graph, not --lockstep: "):
        options(variability=VARIABILITY, lockstep=True)
    assert options(variability=VARIABILITY).variability == VARIABILITY


def test_the_agent_reads_back_the_variability_it_was_given(tmp_path):
    config = AgentConfig(rank=1, world_size=8, gpus_per_node=8, hardware={}, seed=4,
                         values="mirror", events_path="e", variability=VARIABILITY.to_dict())
    config.write(tmp_path / "agent.json")
    read = AgentConfig.read(tmp_path / "agent.json")
    assert Variability.from_dict(read.variability) == VARIABILITY
    assert AgentConfig.read(tmp_path / "agent.json").seed == 4


def test_the_environment_digest_holds_the_variability_and_no_other_run_changes():
    plain = options()
    facts = {"hardware": plain.profile.to_dict(), "seed": 4, "values": "mirror",
             "digests": True, "world_size": 8, "rank": 1}
    # a run without variability keeps the digest runs had before it existed
    assert _environment_digest(plain) == hashlib.sha256(
        json.dumps(facts, sort_keys=True).encode()).hexdigest()
    stochastic = _environment_digest(options(variability=VARIABILITY))
    assert stochastic == hashlib.sha256(json.dumps(
        {**facts, "variability": VARIABILITY.to_dict()}, sort_keys=True).encode()).hexdigest()
    other = parse_variability(["cv=0.06 dist=gamma", "class=1 rank-cv=0.02"])
    assert _environment_digest(options(variability=other)) != stochastic
