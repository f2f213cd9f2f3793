"""The example scenarios reproduce their production failures, headless, as
``prism-debug scenario run`` judges them; broken scenario files are refused
before anything starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "examples" / "scenarios").glob("*.yaml"))
pytestmark = pytest.mark.slow


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PRISM_DEBUG_GRAPH_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=1200, stdin=subprocess.DEVNULL, env=env)


def test_there_are_five_examples_and_they_lint_clean(tmp_path):
    assert [p.stem for p in SCENARIOS] == ["degraded_link", "desync_peer", "dp_peer_fail_stop",
                                           "nan_peer", "slow_node_other_stage"]
    proc = cli("scenario", "lint", *map(str, SCENARIOS), cache=tmp_path)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines() == [f"{p}: ok" for p in SCENARIOS]


def test_every_example_scenario_passes(tmp_path):
    proc = cli("scenario", "run", *map(str, SCENARIOS), "--report", str(tmp_path / "r.json"),
               "--junit", str(tmp_path / "junit.xml"), "--run-dir", str(tmp_path / "runs"),
               cache=tmp_path / "graphs")
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(("PASS  ", "FAIL  "))]
    assert proc.returncode == 0, "\n".join(verdicts) + proc.stderr[-3000:]
    assert len(verdicts) == 12 and all(v.startswith("PASS") for v in verdicts)
    report = {r["scenario"]: r for r in json.loads((tmp_path / "r.json").read_text())}
    assert all(r["passed"] for r in report.values())
    # what each one showed, beyond passing
    details = {name: [e["detail"] for e in r["expectations"]] for name, r in report.items()}
    assert details["dp-peer-fail-stop"][2] == ("flight record shows missing ranks [13]: got "
                                               "missing [13], mismatches none")
    assert details["desync-peer"][2] == ("flight record shows a size mismatch: got missing [], "
                                         "mismatches ['size']")
    assert details["nan-peer"][1] == ("first NaN/inf the rank sends at iteration 3: got "
                                      "iteration 3")
    assert report["slow-node-other-stage"]["predicted_ratio"] > 1.05
    assert report["degraded-link"]["predicted_ratio"] > 1.05
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("12", "0")
    # the NaN reached the loss the script prints, at that iteration (0-based there)
    log = (tmp_path / "runs" / "4-nan-peer" / "run" / "rank.log").read_text()
    assert "iter 1 loss nan" not in log and "iter 2 loss nan" in log


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
