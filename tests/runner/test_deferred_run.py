"""End to end: a future the engine answers only after a later op (a world
all-reduce issued before the send the other stage needs to reach it)
completes, with no false watchdog timeout under a short
--collective-timeout; a failed peer still times out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import cli

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "p2p_deferred.py"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graph(profiled_graph) -> Path:
    return profiled_graph("--world-size", "16", "--", sys.executable, SCRIPT)


def run(graph: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("run", "--world-size", "16", "--rank", "0", "--graph", str(graph),
               "--collective-timeout", "0.2", "--report", str(tmp_path / "report.json"),
               "--run-dir", str(tmp_path / "run"), *extra, "--", sys.executable, str(SCRIPT))


def test_a_future_answered_by_a_later_send_completes_without_a_timeout(graph, tmp_path):
    proc = run(graph, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Watchdog caught" not in proc.stderr
    times = [it["time_s"] for it in json.loads((tmp_path / "report.json").read_text())
             ["iterations"]]
    assert len(times) == 4
    # 20 ms of its own compute, then the gradient: stage 1's 20 ms after the
    # activation arrives (ops of 1 KiB cost microseconds)
    assert all(0.039 < t < 0.060 for t in times[1:]), times


def test_a_failed_peer_still_times_out(graph, tmp_path):
    proc = run(graph, tmp_path, "--perturb", "fail 8 at 2")
    assert proc.returncode != 0
    # iteration 2's world all-reduce (the world group's second op) never completes
    assert ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE"
            in proc.stdout + proc.stderr)
