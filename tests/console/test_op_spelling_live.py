"""The console reads a collective in any spelling cost/ops.py lists and
breaks on it in a real rank, over real sockets (issue 15, point 7); a name
that is none of them is refused at once, naming the canonical ones, where
before it was sent on and never matched."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.live_session import finish, start, wait_for_session

pytestmark = pytest.mark.slow


def test_break_coll_takes_every_spelling_and_refuses_a_typo(tmp_path, session_dir):
    run = start(tmp_path, "--paused", iterations=3)
    wait_for_session(run)
    console = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "attach", "--rank", "5"],
        input="break coll All-Reduce seq 2\nc\nbreak coll alreduce\ndelete\nc\n",
        capture_output=True, text=True, timeout=300)
    lines = console.stdout.splitlines()
    assert lines[:3] == [
        "breakpoint 1: all_reduce seq 2",
        "paused before all_reduce on world[0] (seq 2) in iteration 1 (break 1)",
        "*** break coll: unknown collective 'alreduce' (did you mean all_reduce?); use one of "
        "all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce, gather, "
        "scatter, barrier, send, recv (case, '_' and '-' do not matter: allreduce and "
        "all-reduce are all_reduce)"], console.stdout + console.stderr
    finish(run)
