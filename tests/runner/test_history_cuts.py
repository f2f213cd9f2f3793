"""Stepping back in a session of two real ranks: ``run --ranks 0-1 --history
3`` keeps a cut of both ranks after every iteration (the last three), and
``back`` (then ``reverse-continue``) from rank 0's console restores both
ranks from the nearest earlier cut, runs rank 0 on to where it was asked to
stop and pauses it there.
What both ranks compute again is checked against what they computed the
first time, digest for digest, from their own event logs."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prism_debug.bus import sessions
from prism_debug.bus.client import BusClient
from prism_debug.bus.words import how_to_resume
from tests.live_session import SCRIPTS, wait_for_session

pytestmark = pytest.mark.slow


def attach(rank: int, commands: str) -> list[str]:
    console = subprocess.run([sys.executable, "-m", "prism_debug.cli", "attach", "--rank",
                              str(rank), "--command", commands], capture_output=True,
                             text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert console.returncode == 0, console.stdout + console.stderr
    return console.stdout.splitlines()


def iterations(run_dir: Path, rank: int) -> list[tuple[int, str]]:
    """Every iteration the rank (and the copies that replaced it) finished, in order."""
    path = run_dir / f"rank-{rank}" / "events.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines()]
    return [(e["iteration"], e["digest"]) for e in events if e["kind"] == "iteration"]


def wait_for_iteration(info: sessions.SessionInfo, at_least: int) -> None:
    with BusClient.for_session(info) as client:
        deadline = time.monotonic() + 120
        while (client.request("status")["iteration"] or 0) < at_least:
            assert time.monotonic() < deadline
            time.sleep(0.2)


def test_back_restores_both_ranks_from_a_cut_of_the_history(tmp_path, session_dir):
    run_dir = tmp_path / "run"
    run = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "64",
         "--ranks", "0-1", "--history", "3", "--run-dir", str(run_dir), "--store",
         str(tmp_path / "store"), "--", sys.executable, str(SCRIPTS / "train_forever.py")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        info = wait_for_session(run)
        wait_for_iteration(info, 5)
        lines = attach(0, "pause; back 2")
        # (where a history's dump was under way, the pause is where the next iteration starts)
        where = re.fullmatch(r"paused (?:before .* in|at) iteration (\d+) \(pause\)", lines[0])
        assert where is not None, lines
        paused = int(where.group(1))
        # the ring's cuts are of the last 3 iterations: the one after paused - 3
        # is the newest from which a run gets to where paused - 2 starts
        (cut,) = re.findall(r"cut (c[0-9a-f]+-it\d+) of ranks 0-1", lines[1])
        assert lines[1:] == [
            f"back: restored cut {cut} of ranks 0-1 (after iteration {paused - 3})",
            f"paused at iteration {paused - 2} (back)",
            f"left; rank 0 stays paused at iteration {paused - 2} (back) — {how_to_resume(0)}"]
        assert cut.endswith(f"-it{paused - 3}")
        # on to two breakpoints, then back to the first of them
        lines = attach(0, f"break iter {paused - 1}; break iter {paused}; c; c; rc; detach")
        (earlier,) = re.findall(r"cut (c[0-9a-f]+-it\d+) of ranks 0-1", lines[4])
        assert lines[:6] == [
            f"breakpoint 1: iteration {paused - 1}", f"breakpoint 2: iteration {paused}",
            f"paused at iteration {paused - 1} (break 1)",
            f"paused at iteration {paused} (break 2)",
            f"reverse-continue, break 1: restored cut {earlier} of ranks 0-1 (after iteration "
            f"{paused - 2})",
            f"paused at iteration {paused - 1} (reverse-continue, break 1)"], lines
        # both ranks run on, through the iterations again
        wait_for_iteration(info, paused + 1)
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    assert "stopping" not in out, out + err  # told to stop, no rank failed
    assert not sessions.live_sessions()
    for rank in (0, 1):
        timeline = iterations(run_dir, rank)
        numbers = [i for i, _ in timeline]
        # the copies took up where the cuts were taken
        again = numbers.index(paused - 2, numbers.index(paused - 1))
        assert numbers[:again] == list(range(1, len(numbers[:again]) + 1))
        # back to where paused - 2 starts, on to paused; reverse-continue to
        # where paused - 1 starts, and on
        assert numbers[again:again + 4] == [paused - 2, paused - 1, paused - 1, paused]
        first: dict[int, str] = {}
        for iteration, digest in timeline:
            first.setdefault(iteration, digest)
        # every iteration run again computed what it computed the first time
        assert all(digest == first[iteration] for iteration, digest in timeline), rank
    # the rings after the run: each rank's parts of the same last 3 cuts, whole
    parts = [json.loads(path.read_text()) for path in (tmp_path / "store").glob(
        "*/manifest.json")]
    kept = {rank: sorted(m["iteration"] for m in parts if m["rank"] == rank) for rank in (0, 1)}
    assert kept[0] == kept[1] and len(kept[0]) == 3, kept
    assert kept[0] == list(range(kept[0][0], kept[0][0] + 3))
    assert all(m["history"] and m["cut"].endswith(f"-it{m['iteration']}") for m in parts)
