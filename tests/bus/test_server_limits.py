"""The controller's bus server in this process, with real sockets: the private
directory its sockets live in, the agent's event kinds it believes, the bounds of
its tables, and ZMQ_MAXMSGSIZE on every socket of the bus."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
import zmq

from prism_debug.bus import server as bus_server
from prism_debug.bus import socket_dir
from prism_debug.bus.client import BusClient
from prism_debug.bus.protocol import MAX_WIRE_BYTES, decode_event, encode_request
from prism_debug.errors import ConfigError


@pytest.fixture
def server(short_dir):
    made = bus_server.BusServer(5, directory=short_dir / "bus")
    made.rank_pid = os.getpid  # this test process plays the rank
    made.handle("hello", lambda client, args: {"hi": args["client"]})
    yield made
    made.close()


class Peer:
    """A DEALER polled from this thread, with the server polled in between."""

    def __init__(self, server, context: zmq.Context, identity: bytes | None = None) -> None:
        self.server = server
        self.socket = context.socket(zmq.DEALER)
        self.socket.setsockopt(zmq.LINGER, 0)
        if identity is not None:
            self.socket.setsockopt(zmq.IDENTITY, identity)
        self.socket.connect(server.commands)

    def ask(self, verb: str, **args) -> dict:
        self.socket.send(encode_request(verb, args, id="q"))
        for _ in range(200):
            self.server.poll(0.01)
            if self.socket.poll(0):
                return json.loads(self.socket.recv())
        raise AssertionError(f"no reply to {verb}")


# -- the private directory -------------------------------------------------------------------

def test_the_socket_directory_is_made_private_and_the_sockets_live_in_it(short_dir, server):
    directory = short_dir / "bus"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for endpoint in (server.commands, server.events):
        assert endpoint.startswith(f"ipc://{directory}/")
        assert stat.S_ISSOCK(os.stat(endpoint[len("ipc://"):]).st_mode)
    assert server.remote_commands is None  # no TCP at all on a local bus


def test_the_sockets_go_when_the_server_closes(short_dir):
    made = bus_server.BusServer(5, directory=short_dir / "bus")
    files = [made.commands[len("ipc://"):], made.events[len("ipc://"):]]
    made.close()
    assert [os.path.exists(f) for f in files] == [False, False]


def test_a_directory_others_can_enter_is_refused(short_dir):
    directory = short_dir / "open"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    with pytest.raises(ConfigError) as raised:
        bus_server.BusServer(5, directory=directory)
    assert str(raised.value) == (f"the bus directory {directory} is mode 0755: others could "
                                 f"reach the bus; chmod 700 {directory}")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")
def test_a_directory_another_user_made_first_is_refused(short_dir):
    directory = short_dir / "squatted"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with pytest.raises(ConfigError) as raised:
        bus_server.BusServer(5, directory=directory)
    assert str(raised.value) == (
        f"the bus directory {directory} belongs to uid 65534, not to you (uid 0): refusing it; "
        "set $PRISM_DEBUG_RUNTIME to a directory of your own")


def test_a_link_in_place_of_the_directory_is_refused(short_dir):
    target = short_dir / "elsewhere"
    target.mkdir(mode=0o700)
    link = short_dir / "link"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="is not a directory \\(a link or a file took its name"):
        bus_server.BusServer(5, directory=link)


def test_a_socket_path_too_long_for_unix_is_refused_with_the_way_out(short_dir):
    deep = short_dir / ("d" * 100)
    with pytest.raises(ConfigError) as raised:
        bus_server.BusServer(5, directory=deep)
    message = str(raised.value)
    assert message.startswith(f"the bus socket {deep}/") and message.endswith(
        "bytes long, over the 107 a Unix socket allows: set $PRISM_DEBUG_RUNTIME to a shorter "
        "private directory")
    assert socket_dir.socket_path(short_dir, "x.c") == f"ipc://{short_dir}/x.c"


def test_the_runtime_directory_follows_the_environment(monkeypatch):
    monkeypatch.delenv(socket_dir.ENV_VAR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert socket_dir.runtime_dir() == Path("/run/user/1000/prism-debug")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert socket_dir.runtime_dir() == Path(f"/tmp/prism-debug-{os.geteuid()}")
    monkeypatch.setenv(socket_dir.ENV_VAR, "/x/y")
    assert socket_dir.runtime_dir() == Path("/x/y")


# -- the agent, once it proved itself ---------------------------------------------------------

def test_only_the_kinds_the_agent_sends_are_published(server):
    context = zmq.Context()
    try:
        subscriber = context.socket(zmq.SUB)
        subscriber.setsockopt(zmq.SUBSCRIBE, b"")
        subscriber.connect(server.events)
        agent = Peer(server, context)
        assert agent.ask("agent.hello", rank=5, pid=os.getpid(),
                         secret=server.secret)["ok"] is True
        assert server.agent_pid == os.getpid()
        server.poll(0.3)  # the subscription lands
        events = [["exited", {"exit_code": 0}], ["snapshot", {"id": "forged"}],
                  ["iteration.end", {"iteration": 1}], ["no.such.kind", {}], ["paused", "x"]]
        agent.socket.send(encode_request("agent.events", {"events": events}))
        for _ in range(50):
            server.poll(0.01)
        seen = []
        while subscriber.poll(100):
            seen.append(decode_event(*subscriber.recv_multipart())["kind"])
        assert seen == ["iteration.end"]
        assert server.dropped_events == 4
    finally:
        context.destroy(0)


def test_a_second_hello_from_another_pid_leaves_the_agent_in_place(server):
    context = zmq.Context()
    try:
        agent = Peer(server, context)
        assert agent.ask("agent.hello", rank=5, pid=os.getpid(),
                         secret=server.secret)["ok"] is True
        rank = subprocess.Popen(["sleep", "60"])  # from now on the rank is another process
        server.rank_pid = lambda: rank.pid
        other = Peer(server, context, identity=b"agent")
        refused = other.ask("agent.hello", rank=5, pid=rank.pid, secret=server.secret)
        rank.kill()
        rank.wait()
        assert refused["error"]["type"] == "Unauthorized"
        assert server.refused_hellos == 1 and server.agent_pid == os.getpid()
        # events from the refused connection are not the agent's
        assert other.ask("agent.heartbeat")["error"] == {
            "type": "BadMessage", "message": "agent.heartbeat is the rank's own verb"}
    finally:
        context.destroy(0)


# -- bounded tables -------------------------------------------------------------------------

def test_the_client_table_is_bounded(server, monkeypatch):
    monkeypatch.setattr(bus_server, "MAX_CLIENTS", 3)
    context = zmq.Context()
    try:
        replies = [Peer(server, context).ask("hello", client=str(i)) for i in range(4)]
        assert [r["ok"] for r in replies] == [True, True, True, False]
        assert replies[3]["error"] == {"type": "Busy", "message":
                                       "3 clients are attached already: detach one first"}
        assert len(server.clients) == 3
    finally:
        context.destroy(0)


def test_requests_waiting_for_the_rank_are_bounded(server, monkeypatch):
    monkeypatch.setattr(bus_server, "MAX_QUEUED", 2)
    context = zmq.Context()
    try:
        client = Peer(server, context)
        for _ in range(2):  # the rank has not said hello: these wait for it
            client.socket.send(encode_request("where"))
        server.poll(0.2)
        assert client.ask("where")["error"]["type"] == "Busy"
        assert len(server._queued) == 2
    finally:
        context.destroy(0)


def test_requests_the_agent_has_not_answered_are_bounded(server, monkeypatch):
    monkeypatch.setattr(bus_server, "MAX_FORWARDED", 2)
    context = zmq.Context()
    try:
        agent = Peer(server, context)
        agent.ask("agent.hello", rank=5, pid=os.getpid(), secret=server.secret)
        client = Peer(server, context)
        for _ in range(2):  # forwarded, never answered
            client.socket.send(encode_request("where"))
        server.poll(0.2)
        refused = client.ask("where")
        assert refused["error"]["message"] == ("the rank has 2 requests unanswered already: "
                                               "wait for them (or for their timeout) and ask "
                                               "again")
    finally:
        context.destroy(0)


# -- ZMQ_MAXMSGSIZE everywhere ----------------------------------------------------------------

def test_every_socket_of_the_bus_drops_oversized_frames(server):
    assert server._router.getsockopt(zmq.MAXMSGSIZE) == MAX_WIRE_BYTES
    assert server._pub.getsockopt(zmq.MAXMSGSIZE) == MAX_WIRE_BYTES
    with BusClient(server.commands, server.events) as client:
        assert client._commands.getsockopt(zmq.MAXMSGSIZE) == MAX_WIRE_BYTES
        assert client._events.getsockopt(zmq.MAXMSGSIZE) == MAX_WIRE_BYTES
