"""The console's timeline under --graph names who arrived last at each op, as
the run table does: a real rank, a real bus, a slowed virtual peer."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from prism_debug.bus.client import BusClient
from tests.live_session import SCRIPTS, wait_for_session

pytestmark = pytest.mark.slow


def test_the_timeline_names_the_slowed_peer_as_the_last_arrival(tmp_path, session_dir):
    script = [sys.executable, str(SCRIPTS / "train_steps.py"), "--iterations", "4"]
    cli = [sys.executable, "-m", "prism_debug.cli"]
    graph = tmp_path / "g.prism"
    proc = subprocess.run([*cli, "profile", "--world-size", "4", "--out", str(graph), "--",
                           *script], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # rank 2 computes 3x slower: it is last at every all-reduce of the world group
    run = subprocess.Popen([*cli, "run", "--world-size", "4", "--rank", "0", "--graph",
                            str(graph), "--perturb", "slow 2 3", "--paused", "--run-dir",
                            str(tmp_path / "run"), "--", *script],
                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    info = wait_for_session(run)
    with BusClient.for_session(info) as client:
        client.request("break", kind="iter", iteration=3)
        client.request("continue")
        deadline = time.monotonic() + 120
        while client.request("status")["state"] != "paused":
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        timeline = client.request("timeline")
        client.request("delete")
        client.request("continue")
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, out + err
    assert timeline["iteration"] == 2
    ops = timeline["ops"]
    assert [op["op"] for op in ops] == ["all_reduce"] * 2
    # each op was reached last by the slowed rank 2 or by the real rank (0)
    # itself, as the emulated clock had it (was None: the column showed "-")
    assert all(op["last_rank"] in (0, 2) for op in ops), ops
    longest = max(ops, key=lambda op: op["wait_ms"])
    # and the run table names the same rank for iteration 2's longest wait
    row = next(line for line in out.splitlines() if line.split()[:1] == ["2"])
    assert row.endswith(f"last in: rank {longest['last_rank']}"), row
