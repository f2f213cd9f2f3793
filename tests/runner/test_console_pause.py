"""A pause belongs to the user, not to the console that made it (issue 15):
leaving keeps the rank as it is, only continue or detach resume it, and a
command that cannot be answered yet answers at once.  A real rank, real
sockets, real consoles (``prism-debug attach``), real CRIU."""

from __future__ import annotations

import signal
import time

import pytest

from prism_debug.bus.client import BusClient
from tests.live_session import SCRIPTS, start, wait_for_session
from tests.runner.test_debug_session import attach

pytestmark = pytest.mark.slow

# train_forever.py steps every 0.2 s: a rank that runs moves on within this
HELD_S = 1.5
RESUME = "`prism-debug attach --rank 5` to resume it (continue) or release it (detach)"


def alone(client: BusClient) -> dict:
    """The rank's status once ``client`` is the controller's only client (a
    client that vanished is noticed within a check or two): what a console
    does next is then the doing of the only console."""
    deadline = time.monotonic() + 30
    while (status := client.request("status"))["clients"] > 1:
        assert time.monotonic() < deadline, status
        time.sleep(0.1)
    return status


def held(info, iteration: int, reason: str, run) -> None:
    """The rank stays paused at ``iteration`` across HELD_S (five steps' worth),
    and the run goes on; the client that asks leaves, the only one."""
    with BusClient.for_session(info) as client:
        before = alone(client)
        time.sleep(HELD_S)
        after = client.request("status")
        client.request("leave")
    for status in (before, after):
        assert (status["state"], status["iteration"], (status["paused_at"] or {}).get("reason")) \
            == ("paused", iteration, reason)
    assert run.poll() is None


@pytest.mark.serial  # a snapshot answered within seconds of wall time
def test_a_pause_outlives_the_console_that_made_it(tmp_path, session_dir):
    due = None
    run = start(tmp_path, "--paused", script=SCRIPTS / "train_forever.py")
    info = wait_for_session(run)
    try:
        with BusClient.for_session(info) as client:
            alone(client)
            client.request("leave")
        # a read-only one-shot console leaves a --paused rank paused (it ran to
        # its end as the console left)
        console = attach("--command", "status")
        assert console.returncode == 0, console.stdout + console.stderr
        lines = console.stdout.splitlines()
        assert lines[1] == "state: paused at iteration 1 (start)"
        assert lines[-1] == f"left; rank 5 stays paused at iteration 1 (start) — {RESUME}"
        held(info, 1, "start", run)

        # break iter 3; c: paused at 3, and still at 3 once the console has left
        console = attach("--command", "break iter 3; c")
        assert console.stdout.splitlines() == [
            "breakpoint 1: iteration 3",
            "paused at iteration 3 (break 1)",
            f"left; rank 5 stays paused at iteration 3 (break 1) — {RESUME}"]
        held(info, 3, "break 1", run)

        # a snapshot asked mid-iteration (paused before a collective) is
        # answered at once; the rank gets to the boundary once continued
        # (pause on a paused rank is answered by the pause in progress, whose
        # event this console never saw)
        started = time.monotonic()
        console = attach("--command", "pause; s; snapshot; where", timeout_s=60)
        took = time.monotonic() - started
        lines = console.stdout.splitlines()
        assert lines.pop(0) == "paused at iteration 3 (break 1)"
        assert lines[:2] == [
            "paused before all_reduce on world[0] (seq 1) in iteration 3 (step)",
            "snapshot scheduled for the end of iteration 3: taken once continued (continue, "
            "next or step), as the rank is paused mid-iteration; announced when taken, and "
            "snapshots lists it"]
        assert lines[2].startswith('  File "') and "train_forever.py" in lines[2]  # no (running)
        assert took < 20, took
        held(info, 3, "step", run)  # scheduled, not taken: the rank waits for the user
        # ... and announced to whoever is attached when it is taken
        console = attach("--command", "info breaks; n; snapshots")
        lines = console.stdout.splitlines()
        assert lines[:2] == ["Num Type Disp Hits Where", "1   iter keep 1    iteration 3"]
        # the snapshot is announced once recorded (off the controller's loop):
        # before or after the rank's next pause, or the listing that waits for it
        news = next(line for line in lines[2:] if line.startswith("snapshot "))
        assert news.startswith("snapshot r5-it3-") and \
            news.endswith("taken after iteration 3 (" + news.split(" (")[-1])
        snapshot_id = news.split()[1]
        lines.remove(news)
        assert lines[2] == "paused at iteration 4 (next)"
        assert lines[4].split()[:2] == [snapshot_id, "3"]
        assert lines[-1] == f"left; rank 5 stays paused at iteration 4 (next) — {RESUME}"
        held(info, 4, "next", run)

        with BusClient.for_session(info) as client:
            assert alone(client)["breakpoints"] == 1  # hit, and kept for the user
            client.request("leave")
        # detach releases the rank: breakpoints deleted, the pause resumed
        console = attach("--command", "detach")
        assert console.stdout.splitlines() == [
            "detached; rank 5 runs free to its end (resumed, 1 breakpoint deleted)"]
        # where and timeline say that a running rank's answers are one instant of it
        console = attach("--command", "where; timeline; status")
        lines = console.stdout.splitlines()
        assert lines[0] == "(running: the stack at the instant asked; pause holds the rank still)"
        timeline = next(line for line in lines if line.startswith("iteration "))
        assert timeline.endswith("collectives (running: the last finished iteration; the rank "
                                 "is past it)")
        assert "state: running" in lines
        assert lines[-1] == "left; rank 5 keeps running"
        with BusClient.for_session(info) as client:
            first = client.request("status")["iteration"]
            deadline = time.monotonic() + 60
            while client.request("status")["iteration"] <= first + 1:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            client.request("leave")

        # a breakpoint a one-shot console leaves behind stops the rank later,
        # with nobody attached (two seconds ahead: the console is long gone)
        with BusClient.for_session(info) as client:
            due = alone(client)["iteration"] + 10
            client.request("leave")
        console = attach("--command", f"break iter {due}")
        assert console.stdout.splitlines() == [
            f"breakpoint 2: iteration {due}",
            f"left; rank 5 keeps running, and its 1 breakpoint stays armed — {RESUME} where "
            "it pauses"]
        with BusClient.for_session(info) as client:
            deadline = time.monotonic() + 60
            while client.request("status")["state"] != "paused":
                assert time.monotonic() < deadline
                time.sleep(0.1)
            client.request("leave")
        held(info, due, "break 2", run)
    finally:
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=120)
    said = out.splitlines()
    # the controller's own terminal says who the rank waits for
    assert ("prism-debug: rank 5 waits at init_process_group for a console (--paused): "
            "prism-debug attach --rank 5, then continue") in said, out + err
    assert (f"prism-debug: no console is attached and rank 5 stays paused at iteration 3 "
            f"(break 1): {RESUME}") in said
    assert (f"prism-debug: no console is attached and rank 5 stays paused at iteration {due} "
            f"(break 2): {RESUME}") in said
