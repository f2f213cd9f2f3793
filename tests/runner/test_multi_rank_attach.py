"""The debugger bus of a run of several real ranks: one session, a console
per rank, what every replica must do alike agreed with every rank, and
stepping back refused without a history."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from prism_debug.bus import sessions
from prism_debug.bus.words import how_to_resume
from tests.live_session import SCRIPTS, wait_for_session

pytestmark = pytest.mark.slow


def attach(rank: int, commands: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", "attach", "--rank",
                           str(rank), "--json", "--command", commands], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def replies(proc: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_a_console_drives_one_rank_of_several(tmp_path, session_dir):
    run = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "64",
         "--ranks", "0-1", "--run-dir", str(tmp_path / "run"), "--", sys.executable,
         str(SCRIPTS / "train_forever.py")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = wait_for_session(run)
        assert info.ranks == (0, 1)
        listed = json.loads(subprocess.run(
            [sys.executable, "-m", "prism_debug.cli", "ps", "--json"], capture_output=True,
            text=True, timeout=60).stdout)
        assert [entry["ranks"] for entry in listed] == [[0, 1]]
        # rank 1 paused: its console says so; rank 0 runs on, held at its
        # next all-reduce with rank 1 (no further iteration ends)
        paused = attach(1, "pause; status")
        assert paused.returncode == 0, paused.stderr
        status = replies(paused)[-1]
        assert (status["rank"], status["state"]) == (1, "paused")
        time.sleep(1.0)
        first = replies(attach(0, "status"))[-1]
        time.sleep(1.0)
        second = replies(attach(0, "status"))[-1]
        assert (first["rank"], first["state"]) == (0, "running")
        assert second["iteration"] == first["iteration"] <= status["iteration"] + 1
        # what every replica must do alike is agreed with both ranks first: in
        # lockstep (no virtual peers to perturb) both refuse, and both let their hold go
        refused = attach(1, "perturb slow 5 2")
        assert ("perturbations need virtual peers replayed from a graph"
                in refused.stdout + refused.stderr)
        refused = attach(1, "back")
        assert replies(refused)[-1]["error"] == {
            "type": "InvalidState",
            "message": "back needs the run's history: run with --history K (e.g. prism-debug "
                       "run --ranks 0-1 --history 8 …) to keep cuts of the last K iterations "
                       "to go back to"}
        elsewhere = attach(7, "status")
        assert elsewhere.returncode != 0
        assert ("no running session holds rank 7: session "
                f"{info.session} holds ranks 0-1") in elsewhere.stderr
        # released, rank 1 runs on, and rank 0 with it
        assert attach(1, "detach").returncode == 0
        time.sleep(1.0)
        assert replies(attach(0, "status"))[-1]["iteration"] > second["iteration"]
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
    assert "stopping" not in out  # told to stop, no rank failed
    assert not sessions.live_sessions()
    # rank 1 stayed paused once its console left: the controller's terminal said so
    told = [line for line in out.splitlines() if line.startswith(
        "prism-debug: no console is attached and rank 1 stays paused ")]
    assert len(told) == 1, out
    assert told[0].endswith(f": {how_to_resume(1)}")
