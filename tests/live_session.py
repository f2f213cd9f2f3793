"""A real rank under ``prism-debug run`` in the background, and its session on
the bus: what the tests that drive a rank over the bus share."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from prism_debug.bus import sessions
from prism_debug.bus.client import BusClient

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.fixture
def session_dir(tmp_path, monkeypatch):
    """Sessions (and the bus's sockets) of this test's runs alone."""
    directory = tmp_path / "sessions"
    monkeypatch.setenv(sessions.ENV_VAR, str(directory))
    # a short private folder for the sockets (tmp_path may pass a socket path's 107 bytes)
    runtime = Path(tempfile.mkdtemp(prefix="pd-"))
    monkeypatch.setenv("PRISM_DEBUG_RUNTIME", str(runtime / "bus"))
    yield directory
    shutil.rmtree(runtime, ignore_errors=True)


def start(tmp_path: Path, *options: str, iterations: int = 8,
          script: Path = SCRIPTS / "train_steps.py") -> subprocess.Popen:
    """``prism-debug run`` in the background, rank 5 of 64 (lockstep peers: these
    tests are about the bus, not timing)."""
    command = [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size",
               "64", "--rank", "5", "--run-dir", str(tmp_path / "run"), "--store",
               str(tmp_path / "store"), "--report", str(tmp_path / "report.json"), *options, "--",
               sys.executable, str(script)]
    if script.name == "train_steps.py":
        command += ["--iterations", str(iterations)]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_session(run: subprocess.Popen, timeout_s: float = 120) -> sessions.SessionInfo:
    """The run's session, once its rank has reached the bus."""
    deadline = time.monotonic() + timeout_s
    while not (live := sessions.live_sessions()):
        assert run.poll() is None, run.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with BusClient.for_session(live[0]) as client:
        while client.request("status")["state"] == "starting":
            assert time.monotonic() < deadline
            time.sleep(0.05)
    return live[0]


def finish(run: subprocess.Popen) -> tuple[str, str]:
    """The run's output, once it has ended well."""
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    return out, err
