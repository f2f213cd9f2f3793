"""The debugger bus end to end: a real rank under ``prism-debug run``, real
ZeroMQ sockets, real consoles (``prism-debug attach``) and real CRIU."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from prism_debug.bus import sessions
from prism_debug.bus.client import BusClient
from prism_debug.bus.protocol import MAX_FRAME_BYTES, encode_request
from prism_debug.bus.server import CLIENT_CHECK_S
from tests.live_session import SCRIPTS, finish, start, wait_for_session

pytestmark = pytest.mark.slow


def attach(*options: str, stdin: str | None = None,
           timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", "attach", "--rank", "5",
                           *options], input=stdin, capture_output=True, text=True,
                          timeout=timeout_s)


def iterations(run_dir: Path) -> list[tuple[int, str]]:
    """Every iteration record of the run's event log, in order (a restore
    repeats some)."""
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    events = [json.loads(line) for line in lines]
    return [(e["iteration"], e["digest"]) for e in events if e["kind"] == "iteration"]


def test_a_scripted_console_session_steps_snapshots_and_restores(tmp_path, session_dir):
    run = start(tmp_path, "--paused")
    info = wait_for_session(run)
    # an observer stays attached throughout and sees what the consoles do
    with BusClient.for_session(info) as observer:
        observer.request("hello", client="observer")
        console = attach(stdin="break iter 3; c; s; s; timeline\n"
                               "n; snapshot; break iter 6; c\n")
        assert console.returncode == 0, console.stdout + console.stderr
        lines = console.stdout.splitlines()
        assert lines[:4] == [
            "breakpoint 1: iteration 3",
            "paused at iteration 3 (break 1)",
            "paused before all_reduce on world[0] (seq 1) in iteration 3 (step)",
            "paused before all_reduce on world[0] (seq 2) in iteration 3 (step)",
        ]
        assert lines[4] == "iteration 2: 2 collectives"
        assert lines[6].split()[:5] == ["1", "all_reduce", "world[0]", "1.0", "KiB"]
        assert lines[7].split()[:5] == ["2", "all_reduce", "world[0]", "64", "B"]
        assert lines[9] == "paused at iteration 4 (next)"
        assert lines[10].startswith("snapshot r5-it3-") and "after iteration 3" in lines[10]
        snapshot_id = lines[10].split()[1].rstrip(":")
        assert lines[11:] == [
            "breakpoint 2: iteration 6", "paused at iteration 6 (break 2)",
            "left; rank 5 stays paused at iteration 6 (break 2) — `prism-debug attach --rank 5` "
            "to resume it (continue) or release it (detach)"]
        kinds = [e["kind"] for e in observer.events(timeout_s=1.0)]
        assert "snapshot" in kinds and kinds.count("paused") >= 5
        # a second console restores the snapshot and runs the copy to the end
        console = attach(stdin=f"restore {snapshot_id}; status; c\n")
        assert console.returncode == 0, console.stdout + console.stderr
        lines = console.stdout.splitlines()
        assert lines[0].startswith(f"restored snapshot {snapshot_id}: paused after iteration 3")
        assert "state: paused at iteration 4 (restore)" in lines
        assert lines[-1] == "the rank exited with code 0"
        assert observer.missed == 0
    out, _ = finish(run)
    timeline = iterations(tmp_path / "run")
    original, restored = timeline[:5], timeline[5:]
    assert [i for i, _ in original] == [1, 2, 3, 4, 5]  # replaced as iteration 6 began
    assert [i for i, _ in restored] == [4, 5, 6, 7, 8]
    assert restored[:2] == original[3:]  # the same digests again, bit for bit
    report = json.loads((tmp_path / "report.json").read_text())
    assert [(it["iteration"], it["digest"]) for it in report["iterations"]] == \
        original[:3] + restored


def test_two_clients_receive_every_event(tmp_path, session_dir):
    run = start(tmp_path, "--paused", iterations=4)
    info = wait_for_session(run)
    with BusClient.for_session(info) as first, BusClient.for_session(info) as second:
        for client in (first, second):
            client.request("hello", client="test")
        time.sleep(0.3)  # SUB sockets join asynchronously: let both subscriptions land
        first.request("events", on=True)
        first.request("continue")
        assert first.next_event({"exited"}, timeout_s=120)["data"] == {"exit_code": 0}
        assert second.next_event({"exited"}, timeout_s=10) is not None
        seen = [[(e["seq"], e["kind"]) for e in client.events(timeout_s=0.5)]
                for client in (first, second)]
    finish(run)
    assert seen[0] == seen[1]
    kinds = [kind for _, kind in seen[0]]
    assert kinds.count("iteration.end") == 4
    assert kinds.count("coll.enter") == kinds.count("coll.exit") == 8
    assert first.missed == second.missed == 0


def test_malformed_frames_never_stop_the_controller(tmp_path, session_dir):
    run = start(tmp_path, "--paused", iterations=3)
    info = wait_for_session(run)
    rng = random.Random(0)
    frames = [b"", b"\x00\xff", b"{", b"[]", b'{"v": 3, "id": "x", "verb": "status"}',
              b'{"v": 2, "id": "x", "verb": "nope"}',
              b'{"v": 2, "id": "x", "verb": "break", "args": {"kind": "iter"}}',
              b'{"v": 2, "id": "x", "verb": "agent.hello", "args": {"rank": 5, "pid": 1}}',
              b'{"v": 2, "id": "x", "verb": "agent.events", "args": {"events": [["x", {}]]}}',
              b"x" * (MAX_FRAME_BYTES + 1)]
    frames += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
               for _ in range(200)]
    context = zmq.Context()
    fuzzer = context.socket(zmq.DEALER)
    fuzzer.setsockopt(zmq.LINGER, 0)
    fuzzer.connect(info.commands)
    try:
        replies = []
        for frame in frames:
            fuzzer.send(frame)
        fuzzer.send_multipart([b"two", b"frames"])
        for _ in range(len(frames) + 1):
            assert fuzzer.poll(10_000), "the controller stopped answering"
            replies.append(json.loads(fuzzer.recv()))
        assert all(reply["ok"] is False for reply in replies)
        types = {reply["error"]["type"] for reply in replies}
        assert types == {"BadMessage", "UnknownVerb", "BadArguments"}
        by_frame = {frames[i]: replies[i]["error"] for i in range(7)}
        assert by_frame[b'{"v": 2, "id": "x", "verb": "nope"}']["type"] == "UnknownVerb"
        # a client that vanishes mid-command loses nothing for the others
        fuzzer.send(encode_request("status"))
        fuzzer.close(0)
        with BusClient.for_session(info) as client:
            assert client.request("status")["state"] == "paused"
            client.request("continue")
            assert client.next_event({"exited"}, timeout_s=120) is not None
    finally:
        context.term()
    finish(run)
    assert [i for i, _ in iterations(tmp_path / "run")] == [1, 2, 3]


def test_ps_lists_live_sessions_and_removes_stale_ones(tmp_path, session_dir):
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = sessions.SessionInfo(session="stale", pid=dead.pid, commands="tcp://127.0.0.1:1",
                                 events="tcp://127.0.0.1:2", world_size=8, ranks=(1,),
                                 started="2026-01-01T00:00:00+0000", curve_public=None)
    sessions.publish(stale)
    run = start(tmp_path, "--paused", iterations=1)
    info = wait_for_session(run)
    listing = subprocess.run([sys.executable, "-m", "prism_debug.cli", "ps"],
                             capture_output=True, text=True, timeout=60)
    rows = listing.stdout.splitlines()
    assert rows[0].split() == ["session", "pid", "world", "ranks", "started", "commands"]
    assert [row.split()[0] for row in rows[1:]] == [info.session]
    assert rows[1].split()[1:4] == [str(run.pid), "64", "5"]
    assert sorted(p.name for p in session_dir.iterdir()) == [f"{info.session}.json"]
    assert attach("--command", "c").returncode == 0
    finish(run)
    assert list(session_dir.iterdir()) == []  # withdrawn at the end of the run
    assert subprocess.run([sys.executable, "-m", "prism_debug.cli", "ps"], capture_output=True,
                          text=True).stdout == "no prism-debug session is running\n"


def test_the_rank_runs_on_when_its_controller_stops_answering(tmp_path, session_dir):
    run = start(tmp_path, script=SCRIPTS / "train_forever.py")
    wait_for_session(run)
    log = tmp_path / "run" / "rank.log"
    try:
        while len(iterations(tmp_path / "run")) < 2:
            time.sleep(0.05)
        os.kill(run.pid, signal.SIGSTOP)  # the controller freezes; the rank must not
        try:
            before = len(iterations(tmp_path / "run"))
            deadline = time.monotonic() + 60
            while "stopped answering" not in log.read_text():
                assert time.monotonic() < deadline
                time.sleep(0.1)
            time.sleep(1.0)
            assert len(iterations(tmp_path / "run")) > before + 2
        finally:
            os.kill(run.pid, signal.SIGCONT)
        assert ("prism-debug: the controller stopped answering the rank's bus; the rank runs on "
                "(breakpoints cleared)") in log.read_text().splitlines()
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)


def test_a_bus_beyond_loopback_needs_curve_keys(tmp_path, session_dir, monkeypatch):
    monkeypatch.setenv("PRISM_DEBUG_KEYS", str(tmp_path / "keys"))
    refused = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "64",
         "--rank", "5", "--bind", "0.0.0.0", "--", sys.executable, str(SCRIPTS / "train_steps.py")],
        capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert refused.stderr == (
        "prism-debug: error: binding the bus to 0.0.0.0 (not loopback) needs CURVE keys and "
        f"{tmp_path / 'keys'} has none: run prism-debug keys to create them\n")
    made = subprocess.run([sys.executable, "-m", "prism_debug.cli", "keys"],
                          capture_output=True, text=True, timeout=60)
    assert made.stdout.startswith(f"CURVE keys in {tmp_path / 'keys'}")
    run = start(tmp_path, "--paused", "--bind", "0.0.0.0", iterations=2)
    info = wait_for_session(run)
    assert info.curve_public is not None
    # a client with keys of its own knows the server's key, yet is not let in
    from prism_debug.bus.keys import ClientCurve
    from prism_debug.bus.protocol import BusTimeout

    public, secret = zmq.curve_keypair()
    stranger = ClientCurve(public=public, secret=secret,
                           server_public=info.curve_public.encode())
    with BusClient(info.commands, info.events, stranger) as client, pytest.raises(BusTimeout):
        client.request("status", timeout_s=2.0)
    console = attach("--json", "--command", "status; c")
    assert console.returncode == 0, console.stderr
    status = json.loads(console.stdout.splitlines()[0])
    assert (status["state"], status["rank"]) == ("paused", 5)
    finish(run)


def test_a_console_that_vanishes_leaves_the_rank_as_it_was(tmp_path, session_dir):
    # before issue 15 its breakpoints were dropped: a console that leaves in
    # any way (quit, the end of its input, killed) changes nothing for the rank
    run = start(tmp_path, "--paused", iterations=4)
    info = wait_for_session(run)
    gone = BusClient.for_session(info)
    gone.request("hello", client="test")
    gone.request("break", kind="iter", iteration=3)
    gone.close()  # killed, never detached
    time.sleep(3 * CLIENT_CHECK_S)  # the controller notices within a check or two
    with BusClient.for_session(info) as client:
        assert [bp["description"] for bp in client.request("breaks")["breakpoints"]] == \
            ["iteration 3"]
        assert client.request("status")["state"] == "paused"  # the pause it held stays
        client.request("continue")
        stop = client.next_event({"paused", "exited"}, timeout_s=120)
        assert (stop["kind"], stop["data"]["iteration"]) == ("paused", 3)
        client.request("continue")
        stop = client.next_event({"paused", "exited"}, timeout_s=120)
        assert (stop["kind"], stop["data"]) == ("exited", {"exit_code": 0})
    finish(run)


def test_bind_takes_an_address_only(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "64",
         "--rank", "5", "--bind", "127.0.0.1:5555", "--", sys.executable,
         str(SCRIPTS / "train_steps.py")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == ("prism-debug: error: --bind '127.0.0.1:5555': give an address only "
                           "(127.0.0.1, 0.0.0.0, ::1, …); the ports are chosen and written to "
                           "the session file\n")
