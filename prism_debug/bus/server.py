"""The controller's end of the bus: a ROUTER for commands and a PUB for events.

Clients (the console, scripts) and the agent inside the rank all talk to the
ROUTER.  A verb the controller owns (``hello``, ``snapshots``, ``restore`` …)
is answered here; every other verb is forwarded to the agent and its reply
relayed back under the client's request id.  Events — from the agent, and
those the controller sees itself (iterations, output, snapshots, exit) — go
out on the PUB socket with one sequence of numbers, so a client can tell it
missed some.

Single-threaded: the controller's main loop calls :meth:`BusServer.poll`
between its other duties, so handlers run with no locks.  Nothing a client
sends can raise out of :meth:`poll`: a malformed frame gets a typed error
reply, a handler's exception becomes an ``Internal`` error reply.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from typing import Any, Callable

import zmq

from prism_debug.bus import keys as curve_keys
from prism_debug.errors import ConfigError
from prism_debug.bus.protocol import (
    PROTOCOL_VERSION,
    VERBS,
    BadMessage,
    BusError,
    BusTimeout,
    RankUnavailable,
    decode_request,
    error_from_type,
    encode_error,
    encode_event,
    encode_reply,
    encode_request,
)

log = logging.getLogger(__name__)

AGENT_IDENTITY = b"agent"
# what the agent sends besides hello and heartbeats: batches of events
# ``[[kind, data], …]``, no reply expected
SERVER_VERBS = {**VERBS, "agent.events": {"events": ((list,), True)}}
FORWARD_TIMEOUT_S = 30.0  # a forwarded request the rank has not answered by then fails
AGENT_SILENT_S = 5.0  # no heartbeat for this long: the agent is reported lost
CLIENT_CHECK_S = 2.0  # how often clients that went away without detaching are noticed
# sent to every client now and then: it drops a reply to no request of its own,
# and the ROUTER raises EHOSTUNREACH for a client whose connection is gone
_PING = encode_reply("~ping", {})


@dataclasses.dataclass(frozen=True)
class Pending:
    """A client's request whose reply comes later (a snapshot being dumped)."""
    client: bytes
    request_id: str


class Deferred(Exception):
    """Raised by a handler whose reply will be sent later through
    :meth:`BusServer.reply` or :meth:`BusServer.fail` with ``pending``."""

    def __init__(self, on_pending: Callable[[Pending], None]) -> None:
        super().__init__("deferred")
        self.on_pending = on_pending


Handler = Callable[[bytes, dict], dict]


class BusServer:
    def __init__(self, rank: int, host: str = "127.0.0.1") -> None:
        if "://" in host or host.count(":") == 1 or not host:
            raise ConfigError(f"--bind {host!r}: give an address only (127.0.0.1, 0.0.0.0, "
                              "::1, …); the ports are chosen and written to the session file")
        self.rank = rank
        self._context = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._pub = self._context.socket(zmq.PUB)
        for socket in (self._router, self._pub):
            socket.setsockopt(zmq.LINGER, 0)
        # a reconnecting agent (after a snapshot, in a restored copy) takes its
        # identity over from the connection it left behind
        self._router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        # a reply to a client that has gone raises EHOSTUNREACH instead of
        # vanishing silently; it is dropped either way, but we know
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.curve_public: str | None = None
        # what the agent needs to connect when the bus is encrypted: the
        # user's client keys (the rank runs as the same user)
        self.agent_curve: dict | None = None
        server_keys = curve_keys.server_keys_for(host)  # None on loopback
        self._authenticator = None
        if server_keys is not None:
            # encrypted, and only clients holding this user's client key get in
            from zmq.auth.thread import ThreadAuthenticator

            self._authenticator = ThreadAuthenticator(self._context)
            self._authenticator.start()
            self._authenticator.configure_curve(
                domain="*", location=str(curve_keys.key_paths().client_public.parent))
            public, secret = server_keys
            for socket in (self._router, self._pub):
                curve_keys.apply_server(socket, (public, secret))
            self.curve_public = public.decode()
            client_public, client_secret = curve_keys.load_client()
            self.agent_curve = {"server_public": self.curve_public,
                                "public": client_public.decode(),
                                "secret": client_secret.decode()}
        url = f"tcp://{'[' + host + ']' if ':' in host else host}"
        if ":" in host:
            for socket in (self._router, self._pub):
                socket.setsockopt(zmq.IPV6, 1)
        try:
            self.commands = f"{url}:{self._router.bind_to_random_port(url)}"
            self.events = f"{url}:{self._pub.bind_to_random_port(url)}"
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(f"cannot bind the debugger bus to {host}: {exc}") from None
        self._handlers: dict[str, Handler] = {}
        # agent request id -> (what to do with the reply, when to give up)
        self._forwarded: dict[str, tuple[Callable[[dict], None], float]] = {}
        self._ids = itertools.count(1)
        self._seq = 0
        self.clients: dict[bytes, float] = {}  # identity -> last request (wall)
        self.agent_pid: int | None = None
        self.agent_connected = False
        self.agent_expected = True  # the rank is starting, or briefly away: requests wait
        # requests waiting for the agent to connect: (verb, args, on_reply, due)
        self._queued: list[tuple[str, dict, Callable[[dict], None], float]] = []
        self._agent_seen = 0.0
        self._agent_lost_reported = False
        self.on_agent_hello: Callable[[int], None] = lambda pid: None
        # every client went away (detached, or vanished): nobody can resume the rank
        self.on_last_client_gone: Callable[[], None] = lambda: None
        self._clients_checked = time.monotonic()
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)

    # -- wiring ---------------------------------------------------------------------

    def handle(self, verb: str, handler: Handler) -> None:
        """Answer ``verb`` here: ``handler(client, args) -> result``; it may
        raise a :class:`BusError` (sent as a typed error) or :class:`Deferred`."""
        self._handlers[verb] = handler

    def forward(self, client: bytes, request_id: str, verb: str, args: dict) -> None:
        """Send a client's request on to the agent; its reply goes back to the client."""
        def relay(message: dict) -> None:
            message["id"] = request_id
            self._send(client, json.dumps(message, separators=(",", ":")).encode())
        self.ask_agent(verb, args, relay)

    def ask_agent(self, verb: str, args: dict, on_reply: Callable[[dict], None]) -> None:
        """Send a request to the agent; ``on_reply`` gets its reply message
        (``ok`` and ``result`` or ``error``), or a made-up error one if the
        rank goes away or stays silent.  While the agent is briefly away (a
        snapshot, a restore) requests wait for it to come back."""
        due = time.monotonic() + FORWARD_TIMEOUT_S
        if not self.agent_connected:
            if not self.agent_expected:
                raise RankUnavailable("the rank is not connected to the bus (it has not started "
                                      "yet, or it exited): status tells which")
            self._queued.append((verb, args, on_reply, due))
            return
        agent_id = f"f{next(self._ids)}"
        try:
            self._router.send_multipart([AGENT_IDENTITY, encode_request(verb, args, id=agent_id)],
                                        zmq.NOBLOCK)
        except zmq.ZMQError:
            # it has just closed its end (a snapshot) and not said so yet
            self.agent_away()
            self._queued.append((verb, args, on_reply, due))
            return
        self._forwarded[agent_id] = (on_reply, due)

    def agent_away(self) -> None:
        """The agent closed its end for a while (a snapshot): requests wait."""
        self.agent_connected = False
        self.agent_expected = True

    def agent_gone(self) -> None:
        """The rank exited or is being replaced: what it owed fails now."""
        self.agent_connected = False
        self.agent_expected = False
        failed = [on_reply for on_reply, _ in self._forwarded.values()]
        failed += [on_reply for _, _, on_reply, _ in self._queued]
        self._forwarded.clear()
        self._queued.clear()
        for on_reply in failed:
            on_reply(_error_message(RankUnavailable(
                "the rank went away before answering (it exited or was replaced by a "
                "restored copy)")))

    # -- sending --------------------------------------------------------------------

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        self._seq += 1
        self._pub.send_multipart(list(encode_event(self._seq, self.rank, kind, data)))

    def reply(self, pending: Pending, result: dict) -> None:
        self._send(pending.client, encode_reply(pending.request_id, result))

    def fail(self, pending: Pending, error: BusError) -> None:
        self._send(pending.client, encode_error(pending.request_id, error))

    def _send(self, client: bytes, frame: bytes) -> None:
        try:
            self._router.send_multipart([client, frame], zmq.NOBLOCK)
        except zmq.ZMQError:  # the client went away (or cannot take more): its loss only
            self.forget_client(client)

    def forget_client(self, client: bytes) -> None:
        if self.clients.pop(client, None) is not None and not self.clients:
            self.on_last_client_gone()

    # -- the loop -------------------------------------------------------------------

    def poll(self, timeout_s: float) -> None:
        """Serve what arrives within ``timeout_s`` (returns early once idle)."""
        if self._poller.poll(int(timeout_s * 1000)):
            while True:
                try:
                    frames = self._router.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    self._serve(frames)
                except Exception:  # whatever arrives, the session goes on
                    log.exception("serving a bus message failed")
        self._expire()

    def _serve(self, frames: list[bytes]) -> None:
        if len(frames) != 2:  # identity + one frame is all the protocol sends
            if frames:
                self._send(frames[0], encode_error(None, BadMessage(
                    f"a message is one frame; got {len(frames) - 1}")))
            return
        sender, frame = frames
        if sender == AGENT_IDENTITY and self._relay_agent_reply(frame):
            return
        try:
            request = decode_request(frame, SERVER_VERBS)
        except BusError as exc:
            self._send(sender, encode_error(exc.request_id, exc))
            return
        if request.verb.startswith("agent."):
            self._from_agent(sender, request)
            return
        self.clients[sender] = time.time()
        handler = self._handlers.get(request.verb)
        try:
            if handler is None:
                self.forward(sender, request.id, request.verb, request.args)
                return
            result = handler(sender, request.args)
        except Deferred as deferred:
            try:
                deferred.on_pending(Pending(sender, request.id))
            except BusError as exc:
                self._send(sender, encode_error(request.id, exc))
            return
        except BusError as exc:
            self._send(sender, encode_error(request.id, exc))
            return
        except Exception as exc:  # a bug here must not end the session
            log.exception("handler for %s failed", request.verb)
            self._send(sender, encode_error(request.id, exc))
            return
        self._send(sender, encode_reply(request.id, result))

    def _from_agent(self, sender: bytes, request) -> None:
        if sender != AGENT_IDENTITY:
            self._send(sender, encode_error(request.id, BadMessage(
                f"{request.verb} is the rank's own verb")))
            return
        self._agent_seen = time.monotonic()
        if self._agent_lost_reported:
            self._agent_lost_reported = False
            self.publish("agent.back", {})
        if request.verb == "agent.events":
            for event in request.args["events"]:
                if (type(event) is list and len(event) == 2 and type(event[0]) is str
                        and type(event[1]) is dict):
                    self.publish(event[0], event[1])
            return
        self._send(sender, encode_reply(request.id, {}))
        if request.verb == "agent.hello":
            self.agent_connected = True
            self.agent_expected = True
            self.agent_pid = request.args["pid"]
            queued, self._queued = self._queued, []
            for verb, args, on_reply, _ in queued:
                self.ask_agent(verb, args, on_reply)
            self.on_agent_hello(request.args["pid"])

    def _relay_agent_reply(self, frame: bytes) -> bool:
        """Pass the agent's reply to a forwarded request on to its client;
        False when the frame is no reply (a request of the agent's own)."""
        try:
            message = json.loads(frame)
        except (ValueError, RecursionError):
            return False
        if type(message) is not dict or "ok" not in message or type(message.get("id")) is not str:
            return False
        self._agent_seen = time.monotonic()
        forwarded = self._forwarded.pop(message.get("id"), None)
        if forwarded is not None:  # else: late, for a request that already timed out
            forwarded[0](message)
        return True

    def _expire(self) -> None:
        now = time.monotonic()
        if now - self._clients_checked > CLIENT_CHECK_S:
            self._clients_checked = now
            for client in list(self.clients):
                self._send(client, _PING)
        late = [q for q in self._queued if now > q[3]]
        if late:
            self._queued = [q for q in self._queued if now <= q[3]]
            for _, _, on_reply, _ in late:
                on_reply(_error_message(BusTimeout(
                    f"the rank did not come back to the bus within {FORWARD_TIMEOUT_S:.0f} s")))
        for agent_id, (on_reply, due) in list(self._forwarded.items()):
            if now > due:
                del self._forwarded[agent_id]
                on_reply(_error_message(BusTimeout(
                    f"the rank did not answer within {FORWARD_TIMEOUT_S:.0f} s: it may be "
                    "stuck outside Python (where shows its stack)")))
        if (self.agent_connected and not self._agent_lost_reported
                and now - self._agent_seen > AGENT_SILENT_S):
            self._agent_lost_reported = True
            self.publish("agent.lost", {"silent_s": round(now - self._agent_seen, 1)})

    def close(self) -> None:
        if getattr(self, "_authenticator", None) is not None:
            self._authenticator.stop()
        self._router.close(0)
        self._pub.close(0)
        self._context.term()


def _error_message(error: BusError) -> dict:
    return {"v": PROTOCOL_VERSION, "id": None, "ok": False,
            "error": {"type": error.type, "message": error.message}}


def result_of(message: dict) -> dict:
    """The result of an agent's reply message, or the typed error it carries."""
    if message.get("ok"):
        return message.get("result") or {}
    error = message.get("error") or {}
    raise error_from_type(str(error.get("type")), str(error.get("message")))
