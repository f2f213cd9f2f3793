"""Stepping back end to end: a real rank under ``prism-debug run --history``,
real sockets, a real console (``prism-debug attach``) and real CRIU; what the
rank computes after going back is checked against what it computed the first
time, digest for digest."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live_session import finish, start, wait_for_session

pytestmark = pytest.mark.slow


def attach(commands: str) -> list[str]:
    console = subprocess.run([sys.executable, "-m", "prism_debug.cli", "attach", "--rank", "5",
                              "--command", commands], capture_output=True, text=True,
                             timeout=300)
    assert console.returncode in (0, 1), console.stdout + console.stderr
    return console.stdout.splitlines()


def iterations(run_dir: Path) -> list[tuple[int, str]]:
    """Every iteration the rank (and the copies that replaced it) finished, in order."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    return [(e["iteration"], e["digest"]) for e in events if e["kind"] == "iteration"]


def listed(store: Path) -> list[tuple[int, str]]:
    """``snapshot ls``: (iteration, kind) of each snapshot in the store."""
    out = subprocess.run([sys.executable, "-m", "prism_debug.cli", "snapshot", "ls", "--store",
                          str(store)], capture_output=True, text=True, timeout=60).stdout
    return sorted((int(row.split()[1]), row.split()[6]) for row in out.splitlines()[1:])


def test_back_and_reverse_continue_replay_the_same_run(tmp_path, session_dir):
    run = start(tmp_path, "--paused", "--history", "3", "--snapshot-at", "2", iterations=8)
    wait_for_session(run)
    lines = attach("break iter 3; break iter 8; c; c; snapshots; back 9; break iter 6; back 4; "
                   "snapshots; rc; c; c; c")
    ids = dict(re.findall(r"(r5-it(\d+)-[0-9a-f]{6})", "\n".join(lines)))
    by_iteration = {int(it): snapshot_id for snapshot_id, it in ids.items()}
    user = by_iteration[2]
    assert lines[:2] == ["breakpoint 1: iteration 3", "breakpoint 2: iteration 8"]
    # news: the user's, once recorded (off the loop: the rank may have
    # paused at iteration 3 meanwhile)
    (news,) = [at for at in (2, 3) if lines[at].startswith(f"snapshot {user} taken after "
                                                            "iteration 2 (")]
    del lines[news]
    assert lines[2:4] == ["paused at iteration 3 (break 1)", "paused at iteration 8 (break 2)"]
    # the ring holds the last 3 iterations; the user's snapshot at 2 stays
    assert [(row.split()[1], row.split()[5]) for row in lines[5:9]] == [
        ("2", "user"), ("5", "history"), ("6", "history"), ("7", "history")]
    assert lines[9] == ("*** cannot go back 9 iterations from iteration 8: the oldest iteration "
                        "reachable is 3 (--history 3 keeps the last 3 iterations)")
    assert lines[10] == "breakpoint 3: iteration 6"
    del lines[10]
    # iteration 3's snapshot left the ring: back from the user's at 2, running 3 again
    # (its breakpoint passed) and pausing where 4 starts
    assert lines[10:12] == [
        f"back: restored snapshot {user} (after iteration 2), running 1 iteration again",
        "paused at iteration 4 (back)"]
    # the future beyond went with it; the replay took iteration 3's again
    assert [(row.split()[1], row.split()[5]) for row in lines[13:15]] == [
        ("2", "user"), ("3", "history")]
    assert lines[15:] == [
        f"reverse-continue, break 1: restored snapshot {user} (after iteration 2)",
        "paused at iteration 3 (reverse-continue, break 1)",
        # the snapshot at 2 predates breakpoint 3: the copies got the rank's own
        "paused at iteration 6 (break 3)",
        "paused at iteration 8 (break 2)",
        "the rank exited with code 0"]
    finish(run)
    timeline = iterations(tmp_path / "run")
    first = {}
    for iteration, digest in timeline:
        first.setdefault(iteration, digest)
    # every iteration run again computed what it computed the first time
    assert all(digest == first[iteration] for iteration, digest in timeline)
    assert [i for i, _ in timeline] == [1, 2, 3, 4, 5, 6, 7, 3, 3, 4, 5, 6, 7, 8]
    # the ring after the run: exactly the last 3 iterations, beside the user's
    assert listed(tmp_path / "store") == [(2, "user"), (6, "history"), (7, "history"),
                                          (8, "history")]


def test_back_without_history_says_how_to_keep_one(tmp_path, session_dir):
    run = start(tmp_path, "--paused", iterations=2)
    wait_for_session(run)
    lines = attach("back; reverse-continue; back 0; c")
    assert lines == [
        "*** back needs the run's history: run with --history K (e.g. prism-debug run "
        "--history 8 …) to keep snapshots of the last K iterations to go back to",
        "*** reverse-continue needs the run's history: run with --history K (e.g. prism-debug "
        "run --history 8 …) to keep snapshots of the last K iterations to go back to",
        "*** usage: back [N]",
        "the rank exited with code 0"]
    finish(run)


def test_an_incremental_ring_keeps_its_chains_whole(tmp_path, session_dir):
    # K = 2: 5 whole, 6 on it; 7 whole (the chain was K long), 8 on it; 5 and 6 go together
    run = start(tmp_path, "--history", "2", "--incremental", iterations=8)
    finish(run)
    manifests = sorted((json.loads(path.read_text()) for path in
                        (tmp_path / "store").glob("r5-*/manifest.json")),
                       key=lambda m: m["iteration"])
    assert [(m["iteration"], m["history"]) for m in manifests] == [(7, True), (8, True)]
    assert [m["parent"] for m in manifests] == [None, manifests[0]["id"]]
    assert manifests[1]["image_bytes"] < manifests[0]["image_bytes"] / 10
