"""A console in a session of two real ranks: ``snapshot`` takes a cut of
both, ``restore`` of it replays with the original value digests on both,
and ``perturb`` changes both replicas' virtual peers at one agreed boundary.

Two real ranks of an 8,192-rank job (the bundled example, tp 2 x dp
4,096, its other ranks virtual peers replayed from the job's graph):
rank 0's console pauses it, asks for a snapshot (a cut of both ranks at
the next boundary both reach) and lets it run to a breakpoint three
iterations on; then restores the cut, delays virtual rank 2 (in rank 0's
data-parallel group) by 0.5 s a collective from the next agreed boundary,
and runs the same iterations again.  What is compared comes from the
ranks' own event logs: their value digests (which differ between ranks and
iterations, so the comparison can fail), and each replica's completions
of every real rank's ops (``real_ops``), equal to the last bit only if both
replicas changed their peers at the same point of the job.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from prism_debug.bus import sessions
from tests.live_session import wait_for_session
from tests.runner.test_cuts import ARGS
from tests.runner.test_multi_rank import EXAMPLE
from tests.runner.test_multi_rank_attach import attach, replies

pytestmark = pytest.mark.slow

DELAY_S = 0.5  # (against iterations of tens of ms: a loaded machine's noise is far below)


def records(run_dir: Path, rank: int) -> list[dict]:
    path = run_dir / f"rank-{rank}" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def split_at_restore(events: list[dict]) -> tuple[dict[int, dict], dict[int, dict]]:
    """A rank's iteration records before the restore, and its copy's after."""
    resumed = next(i for i, e in enumerate(events) if e["kind"] == "resumed")
    def iterations(part):
        return {e["iteration"]: e for e in part if e["kind"] == "iteration"}
    return iterations(events[:resumed]), iterations(events[resumed:])


def ok(proc: subprocess.CompletedProcess) -> list[dict]:
    """The console's answers (its --json lines but the events it heard)."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [reply for reply in replies(proc) if "kind" not in reply]


@pytest.fixture
def session(tmp_path, session_dir):
    run = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--world-size", "8192", "--ranks",
         "0-1", "--run-dir", str(tmp_path / "run"), "--store", str(tmp_path / "store"), "--",
         sys.executable, str(EXAMPLE), *ARGS, "--tp", "2", "--iterations", "100"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield run, wait_for_session(run, timeout_s=300)
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
        print(out[-4000:], err[-4000:])
    assert not sessions.live_sessions()


def test_a_console_cuts_restores_and_perturbs_both_ranks_alike(tmp_path, session):
    run, info = session
    # the cut: at the next boundary both ranks reach (rank 0 paused before it)
    scheduled = ok(attach(0, "pause; snapshot"))[-1]
    cut, boundary = scheduled["cut"], scheduled["iteration"]
    assert scheduled["when"] == "scheduled" and scheduled["ranks"] == [0, 1]
    assert cut.endswith(f"-it{boundary}")
    # run on to three iterations past it; the cut is announced once both parts are recorded
    ok(attach(0, f"break iter {boundary + 4}; c"))
    listed = ok(attach(0, "snapshots"))[-1]["snapshots"]
    assert sorted((s["rank"], s["cut"]) for s in listed) == [(0, cut), (1, cut)]

    # restore: both ranks replaced, rank 0 paused where the cut was taken
    restored = ok(attach(0, f"restore {cut}"))[-1]
    assert (restored["id"], restored["iteration"], restored["ranks"]) == (cut, boundary, [0, 1])
    status = ok(attach(0, "status"))[-1]
    assert (status["state"], status["iteration"]) == ("paused", boundary + 1)
    # a delay of virtual rank 2 (rank 0's dp group) from one agreed boundary
    perturbed = ok(attach(0, f"perturb delay 2 {DELAY_S}"))[-1]
    assert perturbed["when"] == (f"at the end of iteration {boundary + 1} on every real rank "
                                 "(0-1)")
    # (the copy keeps the breakpoint set before the cut was taken: deleted, then one further)
    ok(attach(0, f"delete; break iter {boundary + 5}; c"))
    held = ok(attach(0, "status"))[-1]
    assert (held["state"], held["iteration"]) == ("paused", boundary + 5)

    views = {rank: split_at_restore(records(tmp_path / "run", rank)) for rank in (0, 1)}
    replayed = range(boundary + 1, boundary + 4)
    for rank, (original, copy) in views.items():
        # the restored copy replays the original's values, bit for bit
        assert [copy[i]["digest"] for i in replayed] == \
            [original[i]["digest"] for i in replayed], rank
    digests = {views[rank][1][i]["digest"] for rank in (0, 1) for i in replayed}
    assert len(digests) == 6  # (every rank's and iteration's own: the check can fail)

    # both replicas agree on every real rank's completions, before the delay and after it
    copies = {rank: views[rank][1] for rank in (0, 1)}
    for iteration in range(boundary + 1, boundary + 4):
        done = [copies[rank][iteration + 1]["real_ops"] for rank in (0, 1)]
        assert done[0]["iteration"] == iteration
        assert done[0]["done"] == done[1]["done"], f"replicas differ in iteration {iteration}"
    # ... and the delay is there, on both ranks, from the iteration after the agreed boundary
    for rank in (0, 1):
        before = copies[rank][boundary + 1]["time_s"]
        after = [copies[rank][i]["time_s"] for i in (boundary + 2, boundary + 3)]
        assert all(t - before > DELAY_S / 2 for t in after), (rank, before, after)
