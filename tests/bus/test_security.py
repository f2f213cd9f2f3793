"""The bus against attackers, with real parts: a real run (controller, rank, agent),
real ZeroMQ sockets, another user through ``setpriv``, a real oversized frame.

Each test here failed on the bus before it was authenticated (loopback TCP, a
hello believed from anyone, frames sized after they were received) — see the
notes beside each for how.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zmq

from prism_debug.bus.client import BusClient
from prism_debug.bus.protocol import encode_request
from tests.live_session import finish, start, wait_for_session

PYTHON = sys.executable
pytestmark = pytest.mark.slow


# -- another user ------------------------------------------------------------------------

# Run as nobody: subscribe to the events, ask the rank to continue, count what comes.
INTRUDER = textwrap.dedent("""
    import json, sys, zmq
    commands, events = sys.argv[1:3]
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(events)
    dealer = context.socket(zmq.DEALER)
    dealer.connect(commands)
    dealer.send(json.dumps({"v": 2, "id": "x", "verb": "continue", "args": {}}).encode())
    reply = dealer.recv() if dealer.poll(4000) else None
    seen = 0
    while sub.poll(2000):
        sub.recv_multipart()
        seen += 1
    print(json.dumps({"reply": reply and reply.decode(), "events": seen}))
    context.destroy(0)
""")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to act as another user")
def test_another_user_can_neither_drive_the_rank_nor_read_its_events(tmp_path, session_dir):
    # before: the bus was TCP on 127.0.0.1, so nobody's `continue` was obeyed
    run = start(tmp_path, "--paused", iterations=2)
    info = wait_for_session(run)
    intruder = subprocess.run(
        ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", PYTHON, "-c",
         INTRUDER, info.commands, info.events],
        capture_output=True, text=True, timeout=60, cwd="/")
    assert intruder.returncode == 0, intruder.stderr
    assert json.loads(intruder.stdout) == {"reply": None, "events": 0}
    with BusClient.for_session(info) as client:
        assert client.request("status")["state"] == "paused"  # nobody's continue never came
        client.request("continue")
    finish(run)


# -- a forged agent ----------------------------------------------------------------------

def hello(dealer: zmq.Socket, **args) -> dict:
    dealer.send(encode_request("agent.hello", {"rank": 5, **args}, id="forged"))
    assert dealer.poll(10_000), "the controller did not answer the hello"
    return json.loads(dealer.recv())


def test_a_forged_agent_hello_is_refused_and_takes_nothing_over(tmp_path, session_dir):
    # before: a hello was believed from any connection, which took the identity
    # b"agent" over (ROUTER_HANDOVER) and with it every forwarded command
    run = start(tmp_path, "--paused", iterations=2)
    info = wait_for_session(run)
    with BusClient.for_session(info) as client:
        rank_pid = client.request("status")["pid"]
    config = json.loads((tmp_path / "run" / "agent.json").read_text())
    secret = config.get("bus_secret") or ""
    context = zmq.Context()
    forger = context.socket(zmq.DEALER)
    forger.setsockopt(zmq.LINGER, 0)
    forger.setsockopt(zmq.IDENTITY, b"agent")  # the identity the agent used to have
    forger.connect(info.commands)
    try:
        attempts = [
            {"pid": os.getpid(), "secret": "0" * 43},  # a guessed secret
            {"pid": rank_pid, "secret": "0" * 43},  # the rank's pid, claimed
            {"pid": os.getpid(), "secret": secret},  # the secret, but not the rank
            {"pid": rank_pid, "secret": secret},  # both, from a foreign process
        ]
        replies = [hello(forger, **args) for args in attempts]
        assert [r["error"]["type"] for r in replies] == ["Unauthorized"] * 4
        assert [r["error"]["message"] for r in replies] == [
            "agent.hello refused: wrong session secret"] * 2 + [
            f"agent.hello refused: pid {os.getpid()} is not the rank this controller runs "
            f"(pid {rank_pid})"] * 2
        # the older hello, with no secret at all
        old = hello(forger, pid=os.getpid())
        assert (old["ok"], old["error"]["type"]) == (False, "BadArguments")
        with BusClient.for_session(info) as client:
            status = client.request("status")  # still answered by the real rank
            assert (status["state"], status["pid"]) == ("paused", rank_pid)
            assert not forger.poll(500)  # nothing was forwarded to the forger
            client.request("continue")
            assert client.next_event({"exited"}, timeout_s=120)["data"] == {"exit_code": 0}
    finally:
        forger.close(0)
        context.term()
    finish(run)
    # the secret lives in files only the user reads (and in no environment)
    for name in ("agent.json", "control.json"):
        assert oct((tmp_path / "run" / name).stat().st_mode & 0o777) == "0o600"


# -- an oversized frame ------------------------------------------------------------------

SENDER = textwrap.dedent("""
    import sys, time, zmq
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.connect(sys.argv[1])
    dealer.send(b"x" * (64 << 20))
    time.sleep(3)
    context.destroy(0)
""")


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def test_an_oversized_frame_is_dropped_before_it_is_allocated(session_dir):
    # before: ZeroMQ took in all 64 MiB, and the size check came after
    from prism_debug.bus.server import BusServer

    server = BusServer(5)
    server.handle("hello", lambda client, args: {"hi": args["client"]})
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak RSS starts from here
        before = _status_kib("VmHWM")
        sender = subprocess.Popen([PYTHON, "-c", SENDER, server.commands])
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            server.poll(0.05)
        sender.wait(timeout=30)
        grown = _status_kib("VmHWM") - before
        assert grown < 16 << 10, f"the server's peak RSS grew by {grown} KiB"
        context = zmq.Context()
        client = context.socket(zmq.DEALER)  # and it serves on (polled from this thread)
        client.connect(server.commands)
        client.send(encode_request("hello", {"client": "after"}, id="h"))
        for _ in range(100):
            server.poll(0.05)
            if client.poll(0):
                break
        assert json.loads(client.recv())["result"] == {"hi": "after"}
        client.close(0)
        context.term()
    finally:
        server.close()


# -- attach --connect with the wrong server key --------------------------------------------

def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=120, env=env, stdin=subprocess.DEVNULL)


def test_attach_connect_refuses_a_server_with_another_key(tmp_path, session_dir, monkeypatch):
    # before: --connect spoke in the clear and waited out its timeout on a CURVE server
    keys_a = tmp_path / "keys-a"
    monkeypatch.setenv("PRISM_DEBUG_KEYS", str(keys_a))
    assert cli("keys").returncode == 0
    run = start(tmp_path, "--paused", "--bind", "0.0.0.0", iterations=2)
    info = wait_for_session(run)
    endpoint = (getattr(info, "remote_commands", None) or info.commands).replace(
        "0.0.0.0", "127.0.0.1")
    # the same client pair, another server key: what a spoofed server would hold
    keys_b = tmp_path / "keys-b"
    assert cli("keys", env={**os.environ, "PRISM_DEBUG_KEYS": str(keys_b)}).returncode == 0
    for name in ("client.key", "client.key_secret"):
        shutil.copy(keys_a / name, keys_b / name)
    wrong = (keys_b / "server.key")
    started = time.monotonic()
    refused = cli("attach", "--connect", endpoint, "--command", "status",
                  env={**os.environ, "PRISM_DEBUG_KEYS": str(keys_b)})
    assert time.monotonic() - started < 10  # told at the handshake, not by a timeout
    import zmq.auth

    wrong_key = zmq.auth.load_certificate(wrong)[0].decode()
    assert refused.returncode != 0
    assert refused.stderr == (
        f"prism-debug: error: the controller at {endpoint} failed the CURVE handshake: its "
        f"server key is not {wrong_key} (the key you expect); refusing to attach to a server "
        "that may not be yours\n")
    # the wrong key named on the command line: refused alike
    refused = cli("attach", "--connect", endpoint, "--server-key", wrong_key, "--command",
                  "status")
    assert refused.returncode != 0 and "failed the CURVE handshake" in refused.stderr
    # a stranger's client key with the right server key: refused as a stranger
    public, secret = zmq.curve_keypair()
    stranger = tmp_path / "keys-c"
    shutil.copytree(keys_a, stranger)
    for name in ("client.key", "client.key_secret"):
        (stranger / name).unlink()
    zmq.auth.create_certificates(stranger, "client")
    refused = cli("attach", "--connect", endpoint, "--command", "status",
                  env={**os.environ, "PRISM_DEBUG_KEYS": str(stranger)})
    assert refused.returncode != 0 and "refused your CURVE client key" in refused.stderr
    # the right keys: attached
    console = cli("attach", "--connect", endpoint, "--json", "--command", "status; c")
    assert console.returncode == 0, console.stderr
    assert json.loads(console.stdout.splitlines()[0])["state"] == "paused"
    finish(run)


# -- a torch subprocess of the rank --------------------------------------------------------

RANK_SCRIPT = textwrap.dedent("""
    import subprocess, sys
    import torch
    import torch.distributed as dist

    CHILD = '''
    import os, time
    import torch
    from prism_debug.agent.agent import active_agent
    time.sleep(2)  # a link, if one started, has connected by now
    sockets = sum(os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
                  for fd in os.listdir("/proc/self/fd") if fd.isdigit()
                  and os.path.exists(f"/proc/self/fd/{fd}"))
    agent = active_agent()
    print(f"child pid={os.getpid()} sockets={sockets} "
          f"link={agent is not None and agent.link is not None}", flush=True)
    '''
    dist.init_process_group(backend="nccl")
    subprocess.run([sys.executable, "-c", CHILD], check=True)
    grad = torch.ones(4)
    for step in range(2):
        dist.all_reduce(grad)
        print(f"step {step + 1}", flush=True)
""")


def test_a_torch_subprocess_of_the_rank_opens_no_bus_link(tmp_path, session_dir):
    # before: every process that imported torch loaded the agent and linked as "agent"
    script = tmp_path / "spawns.py"
    script.write_text(RANK_SCRIPT)
    run = start(tmp_path, script=script)
    info = wait_for_session(run)
    with BusClient.for_session(info) as client:
        client.request("hello", client="test")
        rank_pid = client.request("status")["pid"]
    finish(run)
    lines = (tmp_path / "run" / "rank.log").read_text().splitlines()
    child = next(line for line in lines if line.startswith("child pid="))
    assert child.split()[2:] == ["sockets=0", "link=False"]
    assert int(child.split()[1].split("=")[1]) != rank_pid
