"""The error tree: every family under its subsystem's base, the fields a
caller needs, and the exit codes the CLI uses."""

from __future__ import annotations

import pytest

from prism_debug import errors
from prism_debug.bus.keys import KeysError
from prism_debug.bus.protocol import BadArguments, BusError
from prism_debug.bus.sessions import SessionNotFound
from prism_debug.snapshot.criu import CriuError
from prism_debug.snapshot.store import SnapshotError, Store


@pytest.mark.parametrize("error, base", [
    (errors.CriuError, errors.SnapshotError), (errors.KeysError, errors.BusError),
    (errors.SessionNotFound, errors.BusError), (errors.BadArguments, ValueError),
    (errors.ScenarioError, errors.ConfigError), (errors.InvalidFields, errors.ConfigError),
    (errors.IncidentError, errors.ConfigError),
    (errors.HardwareProfileError, errors.ConfigError), (errors.ConfigError, ValueError),
    (errors.GraphError, errors.PrismError), (errors.DebuggerError, errors.PrismError),
])
def test_each_family_sits_under_its_base(error, base):
    assert issubclass(error, base) and issubclass(error, errors.PrismError)


def test_the_subsystems_raise_the_trees_classes():
    assert (CriuError, SnapshotError, KeysError, SessionNotFound, BusError, BadArguments) == (
        errors.CriuError, errors.SnapshotError, errors.KeysError, errors.SessionNotFound,
        errors.BusError, errors.BadArguments)


def test_exit_codes_are_named_once():
    assert [(c.name, int(c)) for c in errors.ExitCode] == [
        ("OK", 0), ("FAILED", 1), ("ERROR", 2), ("LAUNCH", 3)]
    assert errors.PrismError("x").exit_code == errors.ExitCode.ERROR
    assert errors.LaunchError("x").exit_code == errors.ExitCode.LAUNCH


def test_errors_carry_what_a_caller_needs(tmp_path):
    with pytest.raises(SnapshotError) as info:
        Store(tmp_path).get("r5-it2-abcdef")
    assert info.value.snapshot_id == "r5-it2-abcdef"
    assert errors.GraphError("off the graph", rank=5, iteration=3).iteration == 3
    assert errors.LaunchError("gone", log=tmp_path / "rank.log").log == tmp_path / "rank.log"
    assert str(errors.InvalidFields("Selector", [(("faults", 0, "ranks"), "bad")])) == \
        "Selector: faults[0].ranks: bad"
