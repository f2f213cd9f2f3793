"""The controller's end of the bus: a ROUTER for commands and a PUB for events.

Clients (the console, scripts) and the agent inside the rank all talk to the
ROUTER.  A verb the controller owns (``hello``, ``snapshots``, ``restore`` …)
is answered here; every other verb is forwarded to the agent and its reply
relayed back under the client's request id.  Events — from the agent, and
those the controller sees itself (iterations, output, snapshots, exit) — go
out on the PUB socket with one sequence of numbers, so a client can tell it
missed some.

Who may talk to it (see README, "Security model"): the sockets are ``ipc://`` files
in a directory only the user can enter (:mod:`prism_debug.bus.runtime`); bound to an
address beyond loopback, a TCP endpoint is added and the whole bus requires CURVE
with the user's client key.  The agent is whoever proves it: an ``agent.hello``
carrying the session's secret, sent over the ipc socket by the rank's own process
(its pid, from the kernel's ``SO_PEERCRED``, is the rank's or a descendant's).  Each
agent connection has an identity of its own, so no other connection can take over
the agent's (no ``ROUTER_HANDOVER``).  ZeroMQ drops frames over ``MAX_WIRE_BYTES``
before allocating them, and every table is bounded.

The agent closes its connection for every snapshot (CRIU cannot dump a live
socket) and says hello again on a new one after: a request forwarded as it
closed may never have been read, or its reply not sent.  Nothing is lost for
that: a request the agent has not answered when a new connection of the same
rank says hello is sent again on it, under the same id, and the agent answers
an id it has answered before with its first reply, without doing it twice
(:mod:`prism_debug.agent.link`), so re-sending is right for every verb, ``break``
and ``perturb`` too.  The ids carry this server's nonce: a copy restored from a
snapshot another session took has seen none of them.

Single-threaded: the controller's main loop calls :meth:`BusServer.poll`
between its other duties, so handlers run with no locks.  Nothing a client
sends can raise out of :meth:`poll`: a malformed frame gets a typed error
reply, a handler's exception becomes an ``Internal`` error reply.
"""

from __future__ import annotations

import dataclasses
import hmac
import itertools
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import zmq

from prism_debug.bus import keys as curve_keys
from prism_debug.bus import runtime
from prism_debug.errors import ConfigError
from prism_debug.bus.protocol import (
    AGENT_EVENT_KINDS,
    MAX_WIRE_BYTES,
    PROTOCOL_VERSION,
    VERBS,
    BadMessage,
    BusError,
    BusTimeout,
    Busy,
    RankUnavailable,
    Unauthorized,
    decode_request,
    error_from_type,
    encode_error,
    encode_event,
    encode_reply,
    encode_request,
)

log = logging.getLogger(__name__)

# what the agent sends besides hello and heartbeats: batches of events
# ``[[kind, data], …]``, no reply expected
SERVER_VERBS = {**VERBS, "agent.events": {"events": ((list,), True)}}
FORWARD_TIMEOUT_S = 30.0  # a forwarded request the rank has not answered by then fails
AGENT_SILENT_S = 5.0  # no heartbeat for this long: the agent is reported lost
CLIENT_CHECK_S = 2.0  # how often clients that went away without detaching are noticed
# bounds of the tables a peer makes grow: past them a request is refused (Busy)
MAX_CLIENTS = 64
MAX_QUEUED = 256  # requests waiting for the agent to come back
MAX_FORWARDED = 1024  # requests the agent has not answered yet
EVENT_HWM = 20_000  # events queued for one subscriber before it misses some
# sent to every client now and then: it drops a reply to no request of its own,
# and the ROUTER raises EHOSTUNREACH for a client whose connection is gone
_PING = encode_reply("~ping", {})


@dataclasses.dataclass(frozen=True)
class Pending:
    """A client's request whose reply comes later (a snapshot being dumped)."""
    client: bytes
    request_id: str


@dataclasses.dataclass(frozen=True)
class _Forwarded:
    """A request sent to the agent and not answered yet."""
    on_reply: Callable[[dict], None]
    due: float  # monotonic: it fails then
    frame: bytes  # as sent, id included: sent again as is
    connection: bytes  # the agent connection it was last sent on


class Deferred(Exception):
    """Raised by a handler whose reply will be sent later through
    :meth:`BusServer.reply` or :meth:`BusServer.fail` with ``pending``."""

    def __init__(self, on_pending: Callable[[Pending], None]) -> None:
        super().__init__("deferred")
        self.on_pending = on_pending


Handler = Callable[[bytes, dict], dict]


class BusServer:
    def __init__(self, rank: int, host: str = "127.0.0.1",
                 directory: Path | None = None) -> None:
        if "://" in host or host.count(":") == 1 or not host:
            raise ConfigError(f"--bind {host!r}: give an address only (127.0.0.1, 0.0.0.0, "
                              "::1, …); the ports are chosen and written to the session file")
        self.rank = rank
        # what the rank's agent shows in its hello (from agent.json or the control
        # file, both 0600): the socket's permissions keep others out, this keeps out
        # the user's own other processes that would speak for the rank
        self.secret = secrets.token_urlsafe(32)
        # the rank's pid as the controller knows it (Popen, restore); set by the session
        self.rank_pid: Callable[[], int | None] = lambda: None
        server_keys = curve_keys.server_keys_for(host)  # None on loopback: no TCP at all
        # made before anything that must be closed: a refused directory leaves nothing open
        sockets_dir = runtime.private_dir(directory)
        name = secrets.token_hex(6)
        commands_ipc = runtime.socket_path(sockets_dir, f"{name}.c")
        events_ipc = runtime.socket_path(sockets_dir, f"{name}.e")
        self._context = zmq.Context()
        self._router = self._context.socket(zmq.ROUTER)
        self._pub = self._context.socket(zmq.PUB)
        for socket in (self._router, self._pub):
            socket.setsockopt(zmq.LINGER, 0)
            # a larger frame is dropped by ZeroMQ as its header arrives, unallocated
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_WIRE_BYTES)
        # a Unix socket buffers far less than loopback TCP did: let ZeroMQ queue what
        # a subscriber has not read yet, so a burst of events is not dropped (bounded:
        # ~200 bytes an event, per subscriber)
        self._pub.setsockopt(zmq.SNDHWM, EVENT_HWM)
        # a reply to a client that has gone raises EHOSTUNREACH instead of
        # vanishing silently; it is dropped either way, but we know
        self._router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.curve_public: str | None = None
        # what the agent needs to connect when the bus is encrypted: a key pair made
        # for this session alone (the user's own client secret never leaves its file)
        self.agent_curve: dict | None = None
        self._authenticator = None
        self._ipc_files: list[str] = []
        try:
            if server_keys is not None:
                self._require_curve(server_keys)
            self.commands = self._bind(self._router, commands_ipc)
            self.events = self._bind(self._pub, events_ipc)
            self._ipc_files = [commands_ipc[len("ipc://"):], events_ipc[len("ipc://"):]]
            #: the TCP endpoints remote clients use (``attach --connect``), CURVE only
            self.remote_commands: str | None = None
            self.remote_events: str | None = None
            if server_keys is not None:
                url = f"tcp://{'[' + host + ']' if ':' in host else host}"
                if ":" in host:
                    for socket in (self._router, self._pub):
                        socket.setsockopt(zmq.IPV6, 1)
                self.remote_commands = f"{url}:{self._router.bind_to_random_port(url)}"
                self.remote_events = f"{url}:{self._pub.bind_to_random_port(url)}"
        except zmq.ZMQError as exc:
            self.close()
            raise ConfigError(f"cannot bind the debugger bus to {host}: {exc}") from None
        except BaseException:
            self.close()
            raise
        self._handlers: dict[str, Handler] = {}
        # agent request id -> what was sent, on which connection, who waits for the reply
        self._forwarded: dict[str, _Forwarded] = {}
        self._ids = itertools.count(1)
        # in every id we give the agent: unlike a count, never this session's and another's
        self._nonce = secrets.token_hex(8)
        self.resent = 0  # requests sent again to a later connection of the agent (tests)
        self._seq = 0
        self.clients: dict[bytes, float] = {}  # identity -> last request (wall)
        # the connection that proved itself the agent (None: none yet, or it left)
        self._agent: bytes | None = None
        self.agent_pid: int | None = None
        # what peers tried and were refused: counted for status and the tests
        self.refused_hellos = 0
        self.dropped_events = 0
        self.agent_connected = False
        self.agent_expected = True  # the rank is starting, or briefly away: requests wait
        # requests waiting for the agent to connect: (verb, args, on_reply, due)
        self._queued: list[tuple[str, dict, Callable[[dict], None], float]] = []
        self._agent_seen = 0.0
        self._agent_lost_reported = False
        self.on_agent_hello: Callable[[int], None] = lambda pid: None
        # every client went away (left, detached or vanished): the rank stays as it is
        self.on_last_client_gone: Callable[[], None] = lambda: None
        # the rank paused (the event's data): the session tells its terminal when
        # nobody is attached to see it
        self.on_rank_paused: Callable[[dict], None] = lambda where: None
        self._clients_checked = time.monotonic()
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)

    def _require_curve(self, server_keys: tuple[bytes, bytes]) -> None:
        """Encrypted, and only clients holding this user's client key (or the
        session's agent key) get in; on every endpoint, ipc too."""
        from zmq.auth.thread import ThreadAuthenticator

        self._authenticator = ThreadAuthenticator(self._context)
        self._authenticator.start()
        self._authenticator.configure_curve(
            domain="*", location=str(curve_keys.key_paths().client_public.parent))
        agent_public, agent_secret = zmq.curve_keypair()
        self._authenticator.certs["*"][agent_public] = True
        public, _ = server_keys
        for socket in (self._router, self._pub):
            curve_keys.apply_server(socket, server_keys)
        self.curve_public = public.decode()
        self.agent_curve = {"server_public": self.curve_public,
                            "public": agent_public.decode(), "secret": agent_secret.decode()}

    @staticmethod
    def _bind(socket: zmq.Socket, endpoint: str) -> str:
        path = runtime.ipc_path(endpoint)
        if path is not None and os.path.lexists(path):
            os.unlink(path)  # a socket left by a controller that died; the name is ours
        socket.bind(endpoint)
        return endpoint

    # -- wiring ---------------------------------------------------------------------

    def handle(self, verb: str, handler: Handler) -> None:
        """Answer ``verb`` here: ``handler(client, args) -> result``; it may
        raise a :class:`BusError` (sent as a typed error) or :class:`Deferred`."""
        self._handlers[verb] = handler

    def forward(self, client: bytes, request_id: str, verb: str, args: dict) -> None:
        """Send a client's request on to the agent; its reply goes back to the client."""
        def relay(message: dict) -> None:
            message["id"] = request_id
            frame = json.dumps(message, separators=(",", ":")).encode()
            if len(frame) > MAX_WIRE_BYTES:  # the client's socket would drop it, and us
                frame = encode_error(request_id, BadMessage(
                    f"the rank's reply to {verb} is {len(frame)} bytes, over the bus's "
                    f"{MAX_WIRE_BYTES}-byte limit"))
            self._send(client, frame)
        self.ask_agent(verb, args, relay)

    def ask_agent(self, verb: str, args: dict, on_reply: Callable[[dict], None]) -> None:
        """Send a request to the agent; ``on_reply`` gets its reply message
        (``ok`` and ``result`` or ``error``), or a made-up error one if the
        rank goes away or stays silent.  While the agent is briefly away (a
        snapshot, a restore) requests wait for it to come back."""
        due = time.monotonic() + FORWARD_TIMEOUT_S
        if not self.agent_connected or self._agent is None:
            if not self.agent_expected:
                raise RankUnavailable("the rank is not connected to the bus (it has not started "
                                      "yet, or it exited): status tells which")
            self._queue(verb, args, on_reply, due)
            return
        if len(self._forwarded) >= MAX_FORWARDED:
            raise Busy(f"the rank has {MAX_FORWARDED} requests unanswered already: wait for "
                       "them (or for their timeout) and ask again")
        agent_id = f"f{self._nonce}.{next(self._ids)}"
        frame = encode_request(verb, args, id=agent_id)
        try:
            self._router.send_multipart([self._agent, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            # it has just closed its end (a snapshot) and not said so yet
            self.agent_away()
            self._queue(verb, args, on_reply, due)
            return
        # kept until answered: sent again if this connection goes before it answers
        self._forwarded[agent_id] = _Forwarded(on_reply, due, frame, self._agent)

    def _queue(self, verb: str, args: dict, on_reply: Callable[[dict], None],
               due: float) -> None:
        if len(self._queued) >= MAX_QUEUED:
            raise Busy(f"{MAX_QUEUED} requests wait for the rank to come back to the bus "
                       "already: ask again once it is back (status tells)")
        self._queued.append((verb, args, on_reply, due))

    def agent_away(self) -> None:
        """The agent closed its end for a while (a snapshot): requests wait."""
        self.agent_connected = False
        self._agent = None
        self.agent_expected = True

    def agent_gone(self) -> None:
        """The rank exited or is being replaced: what it owed fails now."""
        self.agent_connected = False
        self._agent = None
        self.agent_expected = False
        failed = [forwarded.on_reply for forwarded in self._forwarded.values()]
        failed += [on_reply for _, _, on_reply, _ in self._queued]
        self._forwarded.clear()
        self._queued.clear()
        for on_reply in failed:
            on_reply(_error_message(RankUnavailable(
                "the rank went away before answering (it exited or was replaced by a "
                "restored copy)")))

    # -- sending --------------------------------------------------------------------

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        frames = encode_event(self._seq + 1, self.rank, kind, data)
        if len(frames[1]) > MAX_WIRE_BYTES:  # every subscriber would drop it (and the link)
            self.dropped_events += 1
            log.warning("dropping a %s event of %d bytes (over %d)", kind, len(frames[1]),
                        MAX_WIRE_BYTES)
            return
        self._seq += 1
        self._pub.send_multipart(list(frames))

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
                    # frames, not bytes: the last one tells who sent it (SO_PEERCRED)
                    frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    self._serve(frames)
                except Exception:  # whatever arrives, the session goes on
                    log.exception("serving a bus message failed")
        self._expire()

    def _serve(self, parts: list[zmq.Frame]) -> None:
        if len(parts) != 2:  # identity + one frame is all the protocol sends
            if parts:
                self._send(parts[0].bytes, encode_error(None, BadMessage(
                    f"a message is one frame; got {len(parts) - 1}")))
            return
        sender, frame = parts[0].bytes, parts[1].bytes
        if sender == self._agent and self._relay_agent_reply(frame):
            return
        try:
            request = decode_request(frame, SERVER_VERBS)
        except BusError as exc:
            self._send(sender, encode_error(exc.request_id, exc))
            return
        if request.verb == "agent.hello":
            self._agent_hello(sender, request, parts[1].get("Peer-Address"))
            return
        if request.verb.startswith("agent."):
            self._from_agent(sender, request)
            return
        if sender not in self.clients and len(self.clients) >= MAX_CLIENTS:
            self._send(sender, encode_error(request.id, Busy(
                f"{MAX_CLIENTS} clients are attached already: detach one first")))
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

    def _agent_hello(self, sender: bytes, request, peer: str | None) -> None:
        """A connection that says it is the rank's agent: believed only with the
        session's secret, from the rank's own process (or one it started)."""
        pid = _peer_pid(peer)
        try:
            if not hmac.compare_digest(request.args["secret"].encode(), self.secret.encode()):
                raise Unauthorized("agent.hello refused: wrong session secret")
            if pid is None:
                raise Unauthorized("agent.hello refused: the rank says hello over the "
                                   "controller's local socket only")
            expected = self.rank_pid()
            if expected is None or not _descends(pid, expected):
                raise Unauthorized(f"agent.hello refused: pid {pid} is not the rank this "
                                   f"controller runs (pid {expected})")
        except Unauthorized as exc:
            self.refused_hellos += 1
            # the right secret from another of the user's processes is most often a
            # rank just replaced by a restore, saying hello as it dies
            log.log(logging.INFO if pid is not None and "secret" not in exc.message
                    else logging.WARNING, "%s", exc.message)
            self._send(sender, encode_error(request.id, exc))
            return
        self._agent = sender
        self._from_agent(sender, request, pid)

    def _from_agent(self, sender: bytes, request, pid: int | None = None) -> None:
        if sender != self._agent:
            self._send(sender, encode_error(request.id, BadMessage(
                f"{request.verb} is the rank's own verb")))
            return
        self._agent_seen = time.monotonic()
        if self._agent_lost_reported:
            self._agent_lost_reported = False
            self.publish("agent.back", {})
        if request.verb == "agent.events":
            for event in request.args["events"]:
                if (type(event) is list and len(event) == 2 and event[0] in AGENT_EVENT_KINDS
                        and type(event[1]) is dict):
                    self.publish(event[0], event[1])
                    if event[0] == "paused":
                        self.on_rank_paused(event[1])
                else:
                    self.dropped_events += 1
                    if self.dropped_events == 1 or self.dropped_events % 1000 == 0:
                        log.warning("dropped %d events from the agent of no kind it sends",
                                    self.dropped_events)
            return
        self._send(sender, encode_reply(request.id, {}))
        if request.verb == "agent.hello":
            self.agent_connected = True
            self.agent_expected = True
            self.agent_pid = pid  # the kernel's word, as this controller sees it
            self._resend(sender)
            queued, self._queued = self._queued, []
            for verb, args, on_reply, _ in queued:
                self.ask_agent(verb, args, on_reply)
            self.on_agent_hello(pid)

    def _resend(self, connection: bytes) -> None:
        """Send the requests an earlier connection of the agent left unanswered
        again, first and in their order, on ``connection``.  Only the same
        process's: a rank replaced by a restore failed what it owed
        (:meth:`agent_gone`).  The agent may have done one already and lost
        only the reply as it closed: it answers a known id with that reply."""
        for agent_id, forwarded in self._forwarded.items():
            if forwarded.connection == connection:
                continue
            try:
                self._router.send_multipart([connection, forwarded.frame], zmq.NOBLOCK)
            except zmq.ZMQError:
                return  # gone again already: the next hello sends them
            self._forwarded[agent_id] = dataclasses.replace(forwarded, connection=connection)
            self.resent += 1
            log.info("sent %s again to the rank's new bus connection", agent_id)

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
            forwarded.on_reply(message)
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
        for agent_id, forwarded in list(self._forwarded.items()):
            if now > forwarded.due:
                del self._forwarded[agent_id]
                forwarded.on_reply(_error_message(BusTimeout(
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
        for path in self._ipc_files:
            try:
                os.unlink(path)
            except OSError:
                pass


def _peer_pid(peer: str | None) -> int | None:
    """The sender's pid from ZeroMQ's ``Peer-Address`` of an ipc connection
    (``host:uid:gid:pid``, from SO_PEERCRED); None for TCP or another user's process."""
    if not peer:
        return None
    fields = peer.rsplit(":", 3)
    if len(fields) != 4 or not all(f.isdigit() for f in fields[1:]):
        return None
    uid, pid = int(fields[1]), int(fields[3])
    return pid if uid == os.geteuid() and pid > 0 else None


def _descends(pid: int, ancestor: int, depth: int = 64) -> bool:
    """Whether ``pid`` is ``ancestor`` or one of its descendants (the rank may be
    started by a shell the command names).  Init adopts every orphan: it is no
    rank's ancestor here."""
    if ancestor <= 1:
        return pid == ancestor
    for _ in range(depth):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        try:
            stat_line = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat_line.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _error_message(error: BusError) -> dict:
    return {"v": PROTOCOL_VERSION, "id": None, "ok": False,
            "error": {"type": error.type, "message": error.message}}


def result_of(message: dict) -> dict:
    """The result of an agent's reply message, or the typed error it carries."""
    if message.get("ok"):
        return message.get("result") or {}
    error = message.get("error") or {}
    raise error_from_type(str(error.get("type")), str(error.get("message")))
