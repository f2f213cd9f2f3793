"""The example scenarios lint clean, and broken scenario files are refused
before anything starts.  That every example reproduces its production
failure is tested once, as ``pytest examples/scenarios/`` runs them
(tests/testing/test_scenario_items.py): the same scenario runner
``prism-debug scenario run`` calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "examples" / "scenarios").glob("*.yaml"))
pytestmark = pytest.mark.slow


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PRISM_DEBUG_GRAPH_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=1200, stdin=subprocess.DEVNULL, env=env)


def test_there_are_seven_examples_and_they_lint_clean(tmp_path):
    assert [p.stem for p in SCENARIOS] == ["degraded_link", "desync_peer", "dp_peer_fail_stop",
                                           "late_peer_of_a_pair", "nan_peer",
                                           "slow_node_other_stage", "stochastic_stragglers"]
    proc = cli("scenario", "lint", *map(str, SCENARIOS), cache=tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines() == [f"{p}: ok" for p in SCENARIOS]


BROKEN = """\
name: broken
world: {size: 64, rank: 5}
run:
  example: {iterations: 4, tp: 3}
  graph: profile
faults:
  - action: slow
    select: {ranks: "70"}
    factor: 0
expect:
  - exit_code: 0
"""


def test_a_broken_scenario_names_its_lines_and_starts_nothing(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    expected = [
        f"{path}:4:32: run.example.tp: heads 8 is not divisible by tp 3",
        f"{path}:8:21: faults[0].select.ranks: rank 70 is outside the world of 64 ranks",
        f"{path}:9:13: faults[0].factor: must be > 0, got 0.0",
    ]
    lint = cli("scenario", "lint", str(path), cache=tmp_path)
    assert lint.returncode == 1 and lint.stdout.splitlines() == expected
    run = cli("scenario", "run", str(path), "--run-dir", str(tmp_path / "runs"), cache=tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"prism-debug: error: {expected[0]}", *expected[1:]]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "graphs").exists()
    assert run.stdout == ""
