"""The agent closes its bus connection for every snapshot and says hello on a new
one after: a request forwarded as it closed is not lost.  The controller sends
what is unanswered again on the new connection, under the same id, and the
agent's link answers an id it has answered before with its first reply, so a
``break`` sent twice is still one breakpoint.  Real sockets both ways: the
controller's server with a connection playing the agent, and the agent's link
with a ROUTER playing the controller, each racing exactly where it can."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import zmq

from prism_debug.agent.link import BusLink
from prism_debug.bus import server as bus_server
from prism_debug.bus.protocol import encode_reply, encode_request


@pytest.fixture
def server(short_dir):
    made = bus_server.BusServer(5, directory=short_dir / "bus")
    made.rank_pid = os.getpid  # this test process plays the rank
    yield made
    made.close()


@pytest.fixture
def context():
    made = zmq.Context()
    yield made
    made.destroy(0)


def dealer(context: zmq.Context, endpoint: str, identity: bytes | None = None) -> zmq.Socket:
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    if identity is not None:
        socket.setsockopt(zmq.IDENTITY, identity)
    socket.connect(endpoint)
    return socket


def serve_until(server, socket: zmq.Socket, timeout_s: float = 5.0) -> dict:
    """Poll the server until ``socket`` receives a frame; that frame."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        server.poll(0.01)
        if socket.poll(0):
            return json.loads(socket.recv())
    raise AssertionError("nothing came")


def hello(server, agent: zmq.Socket) -> None:
    agent.send(encode_request("agent.hello", {"rank": 5, "pid": os.getpid(),
                                              "secret": server.secret}, id="h"))
    assert serve_until(server, agent)["ok"] is True


def test_a_request_the_agent_read_as_it_closed_is_sent_again_to_its_next_connection(
        server, context):
    first = dealer(context, server.commands, b"agent-1")
    hello(server, first)
    client = dealer(context, server.commands)
    client.send(encode_request("break", {"kind": "iter", "iteration": 9}, id="c1"))
    forwarded = serve_until(server, first)
    assert forwarded["verb"] == "break" and forwarded["id"] != "c1"
    first.close()  # the snapshot: the link closes with the request read, unanswered
    second = dealer(context, server.commands, b"agent-2")
    hello(server, second)
    again = serve_until(server, second)
    # the same request under the same id: the agent tells a repeat by it
    assert (again["verb"], again["args"], again["id"]) == ("break", forwarded["args"],
                                                           forwarded["id"])
    assert server.resent == 1
    second.send(encode_reply(again["id"], {"id": 1, "description": "iteration 9"}))
    assert serve_until(server, client) == {"v": 2, "id": "c1", "ok": True,
                                           "result": {"id": 1, "description": "iteration 9"}}
    assert server._forwarded == {}


def test_requests_are_sent_again_in_their_order_and_never_to_the_connection_they_went_to(
        server, context):
    first = dealer(context, server.commands, b"agent-1")
    hello(server, first)
    client = dealer(context, server.commands)
    for n in range(3):
        client.send(encode_request("status", {}, id=f"c{n}"))
    sent = [serve_until(server, first)["id"] for _ in range(3)]
    hello(server, first)  # a hello repeated on the same connection sends nothing again
    assert not first.poll(100) and server.resent == 0
    first.close()
    second = dealer(context, server.commands, b"agent-2")
    hello(server, second)
    assert [serve_until(server, second)["id"] for _ in range(3)] == sent


def test_a_rank_replaced_by_a_restore_fails_what_it_owed_and_its_copy_gets_nothing(
        server, context):
    first = dealer(context, server.commands, b"agent-1")
    hello(server, first)
    client = dealer(context, server.commands)
    client.send(encode_request("status", {}, id="c1"))
    serve_until(server, first)
    server.agent_gone()  # a restored copy replaces the rank: another process
    assert serve_until(server, client)["error"]["type"] == "RankUnavailable"
    server.agent_away()
    copy = dealer(context, server.commands, b"agent-2")
    hello(server, copy)
    assert not copy.poll(100) and server.resent == 0


def test_the_ids_given_to_the_agent_are_this_servers_alone(short_dir):
    ids = []
    for name in ("a", "b"):
        made = bus_server.BusServer(5, directory=short_dir / name)
        try:
            ids.append(made._nonce)
        finally:
            made.close()
    assert ids[0] != ids[1] and len(ids[0]) == 16


# -- the agent's side ------------------------------------------------------------------------

class Controller:
    """A ROUTER in the controller's place, to send the link a request twice."""

    def __init__(self, context: zmq.Context, directory: Path) -> None:
        self.socket = context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"ipc://{directory}/c"
        self.socket.bind(self.endpoint)

    def receive(self, verb: str) -> tuple[bytes, dict]:
        """The next frame of ``verb`` (answering hellos, passing heartbeats)."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if not self.socket.poll(50):
                continue
            identity, frame = self.socket.recv_multipart()
            message = json.loads(frame)
            if message.get("verb") == "agent.hello":
                self.socket.send_multipart([identity, encode_reply(message["id"], {})])
            if message.get("verb", "reply") == verb:
                return identity, message
        raise AssertionError(f"no {verb} from the link")


def test_the_link_does_a_request_sent_again_once_and_repeats_its_reply(short_dir, context):
    controller = Controller(context, short_dir)
    done = []

    def handle(verb: str, args: dict) -> dict:
        done.append((verb, args))
        return {"id": len(done), "description": "iteration 9"}

    link = BusLink(controller.endpoint, 5, os.getpid(), handle, lambda: None, secret="s")
    link.start()
    try:
        first, _ = controller.receive("agent.hello")
        request = encode_request("break", {"kind": "iter", "iteration": 9}, id="fab.7")
        controller.socket.send_multipart([first, request])
        _, reply = controller.receive("reply")
        assert reply == {"v": 2, "id": "fab.7", "ok": True,
                         "result": {"id": 1, "description": "iteration 9"}}
        # the link closes for a snapshot and opens again: its reply may not have got
        # out, so the controller sends the request again on the new connection
        link.stop()
        link.start()
        second, _ = controller.receive("agent.hello")
        assert second != first
        controller.socket.send_multipart([second, request])
        _, repeated = controller.receive("reply")
        assert repeated == reply and link.repeats == 1
        assert done == [("break", {"kind": "iter", "iteration": 9})]  # done once
        # another id is another request
        controller.socket.send_multipart([second, encode_request(
            "break", {"kind": "iter", "iteration": 9}, id="fab.8")])
        assert controller.receive("reply")[1]["result"]["id"] == 2
    finally:
        link.stop()


def test_the_replies_kept_are_bounded(short_dir, context, monkeypatch):
    from prism_debug.agent import link as link_module
    monkeypatch.setattr(link_module, "ANSWERED_KEPT", 3)
    controller = Controller(context, short_dir)
    done = []
    link = BusLink(controller.endpoint, 5, os.getpid(),
                   lambda verb, args: done.append(verb) or {}, lambda: None, secret="s")
    link.start()
    try:
        identity, _ = controller.receive("agent.hello")
        for n in range(5):
            controller.socket.send_multipart([identity, encode_request("status", {}, id=f"f{n}")])
            controller.receive("reply")
        assert list(link._answered) == ["f2", "f3", "f4"]
        controller.socket.send_multipart([identity, encode_request("status", {}, id="f0")])
        controller.receive("reply")
        assert len(done) == 6  # forgotten: done again (the controller never repeats one so old)
    finally:
        link.stop()
