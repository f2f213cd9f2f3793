"""BusClient against a small real controller stand-in: ROUTER + XPUB on 127.0.0.1."""

import threading
import time

import pytest
import zmq

from prism_debug.bus import keys
from prism_debug.bus.client import BusClient
from prism_debug.bus.keys import ClientCurve
from prism_debug.bus.protocol import (
    BadArguments,
    BusError,
    BusTimeout,
    RankUnavailable,
    UnknownVerb,
    decode_request,
    encode_error,
    encode_event,
    encode_reply,
)
from prism_debug.bus.sessions import SessionInfo

# The stand-in's own verbs: enough to drive every path of the client.
VERBS = {
    "echo": {"text": ((str,), True)},
    "stale": {},  # replies to another id first, then to this one
    "stale-error": {},  # an error reply to another id first, then the answer
    "fail": {"type": ((str,), True), "message": ((str,), True)},
    "silent": {},  # never answers
    "slow": {"delay_ms": ((int,), True)},  # answers, but only after a while
    "publish": {"events": ((list,), True)},  # [[seq, kind], …] published after replying
}


class Controller:
    """Serves VERBS on real sockets from a thread.  Events go out on an XPUB (a PUB that
    also reports subscriptions), so a test can publish only once the client listens."""

    def __init__(self, curve=None):
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.publisher = self.context.socket(zmq.XPUB)
        for socket in (self.router, self.publisher):
            socket.linger = 0
            if curve is not None:
                keys.apply_server(socket, curve)
            socket.bind("tcp://127.0.0.1:*")
        self.commands = self.router.last_endpoint.decode()
        self.events = self.publisher.last_endpoint.decode()
        self.subscribed = threading.Event()
        self.requests = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.publisher, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self.publisher in ready:
                self.publisher.recv()  # a subscription
                self.subscribed.set()
            if self.router in ready:
                identity, raw = self.router.recv_multipart()
                self._answer(identity, raw)

    def _answer(self, identity, raw):
        try:
            request = decode_request(raw, VERBS)
        except BusError as exc:
            self.router.send_multipart([identity, encode_error(exc.request_id, exc)])
            return
        self.requests.append(request)
        send = lambda frame: self.router.send_multipart([identity, frame])  # noqa: E731
        if request.verb == "echo":
            send(encode_reply(request.id, {"text": request.args["text"]}))
        elif request.verb == "stale":
            send(encode_reply("an-earlier-request", {"text": "stale"}))
            send(encode_reply(request.id, {"text": "fresh"}))
        elif request.verb == "stale-error":
            send(encode_error("an-earlier-request", RankUnavailable("old news")))
            send(encode_reply(request.id, {"text": "fresh"}))
        elif request.verb == "slow":
            time.sleep(request.args["delay_ms"] / 1000)
            send(encode_reply(request.id, {"text": "late"}))
        elif request.verb == "fail":
            send(encode_error(request.id, request.args["type"], request.args["message"]))
        elif request.verb == "publish":
            send(encode_reply(request.id, {}))
            if not self.subscribed.is_set() and self.publisher.poll(5000):
                self.publisher.recv()  # the client's subscription: now it hears us
                self.subscribed.set()
            for seq, kind in request.args["events"]:
                self.publisher.send_multipart(encode_event(seq, 3, kind, {"n": seq}, wall=1.0))

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.router.close()
        self.publisher.close()
        self.context.term()


@pytest.fixture
def controller():
    server = Controller()
    yield server
    server.close()


@pytest.fixture
def client(controller):
    with BusClient(controller.commands, controller.events) as bus:
        yield bus


def publish(client, *events):
    assert client.request("publish", events=[list(e) for e in events]) == {}


def test_a_request_gets_its_result(client, controller):
    assert client.request("echo", text="hello") == {"text": "hello"}
    assert client.request("echo", timeout_s=2, text="again") == {"text": "again"}
    assert [r.args for r in controller.requests] == [{"text": "hello"}, {"text": "again"}]
    assert len({r.id for r in controller.requests}) == 2


def test_replies_to_other_requests_are_dropped(client):
    assert client.request("stale") == {"text": "fresh"}
    assert client.request("stale-error") == {"text": "fresh"}


def test_a_late_reply_to_a_timed_out_request_does_not_answer_the_next(client, controller):
    with pytest.raises(BusTimeout):
        client.request("slow", timeout_s=0.05, delay_ms=300)
    # the slow reply arrives while the client waits for this one, and is skipped
    assert client.request("echo", text="mine") == {"text": "mine"}
    assert [r.verb for r in controller.requests] == ["slow", "echo"]


@pytest.mark.parametrize("wire_type, cls", [("RankUnavailable", RankUnavailable),
                                            ("NewKindOfError", BusError)])
def test_an_error_reply_raises_its_type(client, wire_type, cls):
    with pytest.raises(BusError) as raised:
        client.request("fail", type=wire_type, message="rank 3 exited: restore a snapshot")
    assert (type(raised.value), raised.value.type, str(raised.value)) == (
        cls, wire_type, "rank 3 exited: restore a snapshot")


def test_the_controller_s_checks_come_back_as_typed_errors(client):
    with pytest.raises(UnknownVerb) as raised:
        client.request("status")
    assert str(raised.value) == ("unknown verb 'status'; known verbs: echo, fail, publish, "
                                 "silent, slow, stale, stale-error")
    with pytest.raises(BadArguments) as raised:
        client.request("echo", text=3)
    assert str(raised.value) == "argument 'text' of 'echo' must be a str, got int"


def test_silence_is_a_timeout_that_says_what_to_check(client, controller):
    with pytest.raises(BusTimeout) as raised:
        client.request("silent", timeout_s=0.2)
    assert str(raised.value) == (f"the controller at {controller.commands} did not answer "
                                 "within 0.2s: is the session still running? prism-debug ps")
    assert raised.value.type == "Timeout"


def test_nobody_listening_is_a_timeout_too():
    context = zmq.Context()
    unused = context.socket(zmq.ROUTER)
    port = unused.bind_to_random_port("tcp://127.0.0.1")
    unused.close()  # a port that was just free: nothing answers there
    context.term()
    with BusClient(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}") as bus, \
            pytest.raises(BusTimeout) as raised:
        bus.request("status", timeout_s=0.1)
    assert str(raised.value).startswith(f"the controller at tcp://127.0.0.1:{port} did not "
                                        "answer within 0.1s")


def test_events_arrive_in_order_and_gaps_are_counted(client):
    publish(client, (7, "iteration.start"), (8, "coll.enter"), (10, "coll.exit"),
            (14, "iteration.end"))
    received = []
    while len(received) < 4:
        batch = client.events(timeout_s=2)
        assert batch, "the events never arrived"
        received += batch
    assert [(e["seq"], e["kind"], e["rank"], e["data"]) for e in received] == [
        (7, "iteration.start", 3, {"n": 7}), (8, "coll.enter", 3, {"n": 8}),
        (10, "coll.exit", 3, {"n": 10}), (14, "iteration.end", 3, {"n": 14})]
    assert client.missed == 4  # 9, 11, 12 and 13; the first seq seen (7) is the base
    assert client.events() == []


def test_next_event_waits_for_a_kind_and_keeps_the_others(client):
    publish(client, (1, "output"), (2, "coll.enter"), (3, "paused"))
    paused = client.next_event({"paused", "exited"}, timeout_s=2)
    assert (paused["seq"], paused["kind"]) == (3, "paused")
    assert [(e["seq"], e["kind"]) for e in client.events()] == [(1, "output"), (2, "coll.enter")]
    assert client.missed == 0
    assert client.next_event("paused", timeout_s=0.05) is None


def test_next_event_finds_an_event_already_buffered(client):
    publish(client, (1, "output"), (2, "paused"), (3, "output"))
    assert client.next_event("exited", timeout_s=0.5) is None  # buffers all three meanwhile
    assert client.next_event("paused", timeout_s=0)["seq"] == 2
    assert [e["seq"] for e in client.events()] == [1, 3]


def test_a_session_with_curve_is_reached_with_the_client_keys(tmp_path, monkeypatch):
    monkeypatch.setenv(keys.ENV_VAR, str(tmp_path / "curve"))
    keys.ensure_keys()
    server = Controller(curve=keys.load_server())
    try:
        info = SessionInfo(session="c1", pid=1, commands=server.commands,
                           events=server.events, world_size=8, ranks=(3,), started="t",
                           curve_public=keys.load_server()[0].decode())
        with BusClient.for_session(info) as bus:
            assert bus.request("echo", timeout_s=5, text="sealed") == {"text": "sealed"}
            publish(bus, (1, "paused"))
            assert bus.next_event("paused", timeout_s=2)["data"] == {"n": 1}
        # a client without keys gets nowhere: the handshake never completes
        with BusClient(server.commands, server.events) as plain, pytest.raises(BusTimeout):
            plain.request("echo", timeout_s=0.2, text="clear")
        # nor does one with keys but the wrong server key
        public, secret = keys.load_client()
        wrong = ClientCurve(public=public, secret=secret, server_public=public)
        with BusClient(server.commands, server.events, wrong) as bus, pytest.raises(BusTimeout):
            bus.request("echo", timeout_s=0.2, text="clear")
    finally:
        server.close()
