"""The controller's end of the bus: a ROUTER for commands and a PUB for events.

Clients (the console, scripts) and the agent inside each rank all talk to the
ROUTER.  A verb the controller owns (``hello``, ``snapshots``, ``restore`` …)
is answered here; every other verb is forwarded to the agent of the client's rank
and its reply relayed back under the client's request id.  A controller runs one
rank, or several (one process and one agent each, :mod:`prism_debug.bus.agents`):
a client's ``hello`` may name the rank it drives, else it drives the lowest.
Events — from the agents, and those the controller sees itself (iterations,
output, snapshots, exit) — go out on the PUB socket under their rank's topic,
each rank's with one sequence of numbers, so a client can tell it missed some.

Who may talk to it (see the docs, "Security model"): the sockets are ``ipc://`` files
in a directory only the user can enter (:mod:`prism_debug.bus.socket_dir`); bound to an
address beyond loopback, a TCP endpoint is added and the whole bus requires CURVE
with the user's client key.  A rank's agent is whoever proves it: an ``agent.hello``
carrying the session's secret, sent over the ipc socket by that rank's own process
(its pid, from the kernel's ``SO_PEERCRED``, is the rank's or a descendant's).  Each
agent connection has an identity of its own, so no other connection can take over
an agent's (no ``ROUTER_HANDOVER``).  ZeroMQ drops frames over ``MAX_WIRE_BYTES``
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

import contextlib
import dataclasses
import itertools
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zmq

from prism_debug.bus import keys as curve_keys
from prism_debug.bus import socket_dir
from prism_debug.bus.agents import AgentConnection, AgentTable, Forwarded, Queued, peer_pid
from prism_debug.bus.protocol import (
    AGENT_EVENT_KINDS,
    BASE_VERSION,
    MAX_WIRE_BYTES,
    VERBS,
    BadArguments,
    BadMessage,
    BusError,
    BusTimeout,
    Busy,
    RankUnavailable,
    Unauthorized,
    decode_request,
    encode_error,
    encode_event,
    encode_reply,
    encode_request,
    error_from_type,
)
from prism_debug.bus.sessions import ranks_text
from prism_debug.errors import ConfigError, PrismError

if TYPE_CHECKING:
    from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger(__name__)

# what the agent sends besides hello and heartbeats: batches of events
# ``[[kind, data], …]``, no reply expected
SERVER_VERBS = {**VERBS, "agent.events": {"events": ((list,), True)}}
FORWARD_TIMEOUT_S = 30.0  # a forwarded request the rank has not answered by then fails
AGENT_SILENT_S = 5.0  # no heartbeat for this long: the agent is reported lost
CLIENT_CHECK_S = 2.0  # how often clients that went away without detaching are noticed
# bounds of the tables a peer makes grow: past them a request is refused (Busy)
MAX_CLIENTS = 64
MAX_QUEUED = 256  # requests waiting for an agent to come back, all ranks together
MAX_FORWARDED = 1024  # requests one rank's agent has not answered yet
EVENT_HWM = 20_000  # events queued for one subscriber before it misses some
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
    """The bus of one controller, serving ``ranks`` (one rank, or the local real
    ranks of a multi-rank run).  ``rank`` is the lowest of them: a client that
    names none drives it, and the single-rank spellings below (``rank_pid``,
    ``agent_pid``, ``agent_connected``, ``on_agent_hello`` …) speak of it."""

    def __init__(self, ranks: int | Iterable[int], host: str = "127.0.0.1",
                 directory: Path | None = None) -> None:
        if "://" in host or host.count(":") == 1 or not host:
            raise ConfigError(f"--bind {host!r}: give an address only (127.0.0.1, 0.0.0.0, "
                              "::1, …); the ports are chosen and written to the session file")
        self.agents = AgentTable([ranks] if isinstance(ranks, int) else ranks)
        self.ranks = self.agents.ranks
        self.rank = self.ranks[0]
        # what each rank's agent shows in its hello (from agent.json or the control
        # file, both 0600): the socket's permissions keep others out, this keeps out
        # the user's own other processes that would speak for a rank
        self.secret = secrets.token_urlsafe(32)
        # the rank's pid as the controller knows it (Popen, restore); set by a
        # single-rank session.  A multi-rank one sets agents.pid_of(rank) instead.
        self.rank_pid: Callable[[], int | None] = lambda: None
        self.agents.pid_of = lambda rank: self.rank_pid() if rank == self.rank else None
        server_keys = curve_keys.server_keys_for(host)  # None on loopback: no TCP at all
        # made before anything that must be closed: a refused directory leaves nothing open
        sockets_dir = socket_dir.private_dir(directory)
        name = secrets.token_hex(6)
        commands_ipc = socket_dir.socket_path(sockets_dir, f"{name}.c")
        events_ipc = socket_dir.socket_path(sockets_dir, f"{name}.e")
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
        self._authenticator: ThreadAuthenticator | None = None
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
        # agent request id -> what was sent, to which rank, on which connection, who
        # waits for the reply (the ids are unique across ranks: one count)
        self._forwarded: dict[str, Forwarded] = {}
        self._ids = itertools.count(1)
        # in every id we give the agent: unlike a count, never this session's and another's
        self._nonce = secrets.token_hex(8)
        self.resent = 0  # requests sent again to a later connection of the agent (tests)
        self._seq = {rank: 0 for rank in self.ranks}  # each rank's events numbered apart
        self.clients: dict[bytes, float] = {}  # identity -> last request (wall)
        # identity -> the rank a client's hello named; a client absent here drives the lowest
        self._client_ranks: dict[bytes, int] = {}
        # what peers tried and were refused: counted for status and the tests
        self.refused_hellos = 0
        self.dropped_events = 0
        # requests waiting for their rank's agent to connect
        self._queued: list[Queued] = []
        # a rank's agent proved itself (rank, pid); by default the single-rank spelling
        self.on_agent_hello: Callable[[int], None] = lambda pid: None
        self.on_rank_agent_hello: Callable[[int, int], None] = \
            lambda rank, pid: self.on_agent_hello(pid)
        # every client went away (left, detached or vanished): the ranks stay as they are
        self.on_last_client_gone: Callable[[], None] = lambda: None
        # a rank paused (rank, the event's data): the session tells its terminal when
        # nobody is attached to see it; by default the single-rank spelling
        self.on_rank_paused: Callable[[dict], None] = lambda where: None
        self.on_rank_paused_at: Callable[[int, dict], None] = \
            lambda rank, where: self.on_rank_paused(where)
        self._clients_checked = time.monotonic()
        self._poller = zmq.Poller()
        self._poller.register(self._router, zmq.POLLIN)

    def _require_curve(self, server_keys: tuple[bytes, bytes]) -> None:
        """Encrypted, and only clients holding this user's client key (or the
        session's agent key) get in; on every endpoint, ipc too."""
        from zmq.auth.thread import ThreadAuthenticator

        authenticator = self._authenticator = ThreadAuthenticator(self._context)
        authenticator.start()
        authenticator.configure_curve(
            domain="*", location=str(curve_keys.key_paths().client_public.parent))
        agent_public, agent_secret = zmq.curve_keypair()
        authenticator.certs["*"][agent_public] = True
        public, _ = server_keys
        for socket in (self._router, self._pub):
            curve_keys.apply_server(socket, server_keys)
        self.curve_public = public.decode()
        self.agent_curve = {"server_public": self.curve_public,
                            "public": agent_public.decode(), "secret": agent_secret.decode()}

    @staticmethod
    def _bind(socket: zmq.Socket, endpoint: str) -> str:
        path = socket_dir.ipc_path(endpoint)
        if path is not None and os.path.lexists(path):
            os.unlink(path)  # a socket left by a controller that died; the name is ours
        socket.bind(endpoint)
        return endpoint

    # -- wiring ---------------------------------------------------------------------

    def handle(self, verb: str, handler: Handler) -> None:
        """Answer ``verb`` here: ``handler(client, args) -> result``; it may
        raise a :class:`BusError` (sent as a typed error) or :class:`Deferred`."""
        self._handlers[verb] = handler

    # the lowest rank's agent, in the words of a single-rank session
    @property
    def agent_pid(self) -> int | None:
        return self.agents.lowest.pid

    @property
    def agent_connected(self) -> bool:
        return self.agents.lowest.connected

    @property
    def agent_expected(self) -> bool:
        return self.agents.lowest.expected

    def client_rank(self, client: bytes) -> int:
        """The rank ``client`` drives: the one its hello named, else the lowest."""
        return self._client_ranks.get(client, self.rank)

    def forward(self, client: bytes, request_id: str, verb: str, args: dict) -> None:
        """Send a client's request on to its rank's agent; the reply goes back to
        the client (naming the rank, when the session holds several)."""
        rank = self.client_rank(client)

        def relay(message: dict) -> None:
            message["id"] = request_id
            if self.agents.several and type(message.get("result")) is dict:
                message["result"].setdefault("rank", rank)
            frame = json.dumps(message, separators=(",", ":")).encode()
            if len(frame) > MAX_WIRE_BYTES:  # the client's socket would drop it, and us
                frame = encode_error(request_id, BadMessage(
                    f"{self.agents.name(rank)}'s reply to {verb} is {len(frame)} bytes, "
                    f"over the bus's {MAX_WIRE_BYTES}-byte limit"))
            self._send(client, frame)
        self.ask_agent(verb, args, relay, rank=rank)

    def ask_agent(self, verb: str, args: dict, on_reply: Callable[[dict], None],
                  rank: int | None = None) -> None:
        """Send a request to ``rank``'s agent (default: the lowest rank's);
        ``on_reply`` gets its reply message (``ok`` and ``result`` or ``error``),
        or a made-up error one if the rank goes away or stays silent.  While the
        agent is briefly away (a snapshot, a restore) requests wait for it."""
        agent = self.agents[self.rank if rank is None else rank]
        due = time.monotonic() + FORWARD_TIMEOUT_S
        if not agent.connected or agent.identity is None:
            if not agent.expected:
                raise RankUnavailable(f"{self.agents.name(agent.rank)} is not connected to "
                                      "the bus (it has not started yet, or it exited): status "
                                      "tells which")
            self._queue(Queued(verb, args, on_reply, due, agent.rank))
            return
        owed = sum(1 for f in self._forwarded.values() if f.rank == agent.rank)
        if owed >= MAX_FORWARDED:
            raise Busy(f"{self.agents.name(agent.rank)} has {MAX_FORWARDED} requests "
                       "unanswered already: wait for them (or for their timeout) and ask again")
        agent_id = f"f{self._nonce}.{next(self._ids)}"
        frame = encode_request(verb, args, id=agent_id)
        try:
            self._router.send_multipart([agent.identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            # it has just closed its end (a snapshot) and not said so yet
            agent.away()
            self._queue(Queued(verb, args, on_reply, due, agent.rank))
            return
        # kept until answered: sent again if this connection goes before it answers
        self._forwarded[agent_id] = Forwarded(on_reply, due, frame, agent.identity, agent.rank)

    def _queue(self, queued: Queued) -> None:
        if len(self._queued) >= MAX_QUEUED:
            raise Busy(f"{MAX_QUEUED} requests wait for {self.agents.name(queued.rank)} to "
                       "come back to the bus already: ask again once it is back (status tells)")
        self._queued.append(queued)

    def agent_away(self, rank: int | None = None) -> None:
        """``rank``'s agent (default: the lowest's) closed its end for a while (a
        snapshot): requests wait."""
        self.agents[self.rank if rank is None else rank].away()

    def agent_gone(self, rank: int | None = None) -> None:
        """``rank``'s process (default: the lowest's) exited or is being replaced:
        what it owed fails now."""
        agent = self.agents[self.rank if rank is None else rank]
        agent.gone()
        failed = [f.on_reply for f in self._forwarded.values() if f.rank == agent.rank]
        failed += [q.on_reply for q in self._queued if q.rank == agent.rank]
        self._forwarded = {agent_id: f for agent_id, f in self._forwarded.items()
                           if f.rank != agent.rank}
        self._queued = [q for q in self._queued if q.rank != agent.rank]
        for on_reply in failed:
            on_reply(_error_message(RankUnavailable(
                f"{self.agents.name(agent.rank)} went away before answering (it exited or "
                "was replaced by a restored copy)")))

    # -- sending --------------------------------------------------------------------

    def publish(self, kind: str, data: dict[str, Any], rank: int | None = None) -> None:
        """An event of ``rank`` (default: the lowest), under its topic and in its
        numbering: a console subscribed to its own rank sees no gaps of others'."""
        rank = self.rank if rank is None else rank
        frames = encode_event(self._seq[rank] + 1, rank, kind, data)
        if len(frames[1]) > MAX_WIRE_BYTES:  # every subscriber would drop it (and the link)
            self.dropped_events += 1
            log.warning("dropping a %s event of %d bytes (over %d)", kind, len(frames[1]),
                        MAX_WIRE_BYTES)
            return
        self._seq[rank] += 1
        self._pub.send_multipart(list(frames))

    def reply(self, pending: Pending, result: dict) -> None:
        self._send(pending.client, encode_reply(pending.request_id, result))

    def fail(self, pending: Pending, error: PrismError) -> None:
        self._send(pending.client, encode_error(pending.request_id, error))

    def _send(self, client: bytes, frame: bytes) -> None:
        try:
            self._router.send_multipart([client, frame], zmq.NOBLOCK)
        except zmq.ZMQError:  # the client went away (or cannot take more): its loss only
            self.forget_client(client)

    def forget_client(self, client: bytes) -> None:
        self._client_ranks.pop(client, None)
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
        agent = self.agents.speaking_as(sender)
        if agent is not None and self._relay_agent_reply(agent, frame):
            return
        try:
            request = decode_request(frame, SERVER_VERBS)
        except BusError as exc:
            self._send(sender, encode_error(exc.request_id, exc))
            return
        if request.verb == "agent.hello":
            peer = parts[1].get("Peer-Address")  # (a str: the property's value)
            self._agent_hello(sender, request, peer if isinstance(peer, str) else None)
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
            if request.verb == "hello":
                self._bind_client(sender, request.args)
            if handler is None:
                self.forward(sender, request.id, request.verb, request.args)
                return
            result = handler(sender, request.args)
            if request.verb == "hello" and (self.agents.several or "rank" in request.args):
                result = {**result, "rank": self.client_rank(sender)}  # whom it drives now
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

    def _bind_client(self, client: bytes, args: dict) -> None:
        """A client's hello binds it to the rank it names (else to the lowest): its
        forwarded verbs go to that rank's agent."""
        rank = args.get("rank", self.rank)
        if rank not in self.agents:
            raise BadArguments(f"this session does not hold rank {rank}: it holds "
                               f"{ranks_text(self.ranks)} (prism-debug ps lists the sessions)")
        self._client_ranks[client] = rank

    def _agent_hello(self, sender: bytes, request, peer: str | None) -> None:
        """A connection that says it is a rank's agent: believed only with the
        session's secret, from that rank's own process (or one it started)."""
        pid = peer_pid(peer)
        try:
            agent = self.agents.admit(sender, request.args, self.secret, pid)
        except Unauthorized as exc:
            self.refused_hellos += 1
            # the right secret from another of the user's processes is most often a
            # rank just replaced by a restore, saying hello as it dies
            log.log(logging.INFO if pid is not None and "secret" not in exc.message
                    else logging.WARNING, "%s", exc.message)
            self._send(sender, encode_error(request.id, exc))
            return
        agent.identity = sender
        self._from_agent(sender, request, pid)

    def _from_agent(self, sender: bytes, request, pid: int | None = None) -> None:
        agent = self.agents.speaking_as(sender)
        if agent is None:
            self._send(sender, encode_error(request.id, BadMessage(
                f"{request.verb} is the rank's own verb")))
            return
        agent.seen = time.monotonic()
        if agent.lost_reported:
            agent.lost_reported = False
            self.publish("agent.back", {}, agent.rank)
        if request.verb == "agent.events":
            for event in request.args["events"]:
                if (type(event) is list and len(event) == 2 and event[0] in AGENT_EVENT_KINDS
                        and type(event[1]) is dict):
                    self.publish(event[0], event[1], agent.rank)
                    if event[0] == "paused":
                        self.on_rank_paused_at(agent.rank, event[1])
                else:
                    self.dropped_events += 1
                    if self.dropped_events == 1 or self.dropped_events % 1000 == 0:
                        log.warning("dropped %d events from the agent of no kind it sends",
                                    self.dropped_events)
            return
        self._send(sender, encode_reply(request.id, {}))
        if request.verb == "agent.hello":
            assert pid is not None  # (AgentTable.admit refuses a hello without one)
            agent.connected = True
            agent.expected = True
            agent.pid = pid  # the kernel's word, as this controller sees it
            self._resend(agent, sender)
            queued = [q for q in self._queued if q.rank == agent.rank]
            self._queued = [q for q in self._queued if q.rank != agent.rank]
            for q in queued:
                self.ask_agent(q.verb, q.args, q.on_reply, rank=q.rank)
            self.on_rank_agent_hello(agent.rank, pid)

    def _resend(self, agent: AgentConnection, connection: bytes) -> None:
        """Send the requests an earlier connection of ``agent``'s rank left
        unanswered again, first and in their order, on its new connection
        (``connection``, its identity now).  Only the same process's: a rank
        replaced by a restore failed what it owed (:meth:`agent_gone`).  The
        agent may have done one already and lost only the reply as it closed:
        it answers a known id with that reply."""
        for agent_id, forwarded in self._forwarded.items():
            if forwarded.rank != agent.rank or forwarded.connection == connection:
                continue
            try:
                self._router.send_multipart([connection, forwarded.frame], zmq.NOBLOCK)
            except zmq.ZMQError:
                return  # gone again already: the next hello sends them
            self._forwarded[agent_id] = dataclasses.replace(forwarded, connection=connection)
            self.resent += 1
            log.info("sent %s again to %s's new bus connection", agent_id,
                     self.agents.name(agent.rank))

    def _relay_agent_reply(self, agent: AgentConnection, frame: bytes) -> bool:
        """Pass ``agent``'s reply to a forwarded request on to its client; False
        when the frame is no reply (a request of the agent's own)."""
        try:
            message = json.loads(frame)
        except (ValueError, RecursionError):
            return False
        if type(message) is not dict or "ok" not in message or type(message.get("id")) is not str:
            return False
        agent.seen = time.monotonic()
        forwarded = self._forwarded.get(message["id"])
        # else: late, for a request that already timed out; or another rank's id,
        # which this agent was never sent and cannot answer
        if forwarded is not None and forwarded.rank == agent.rank:
            del self._forwarded[message["id"]]
            forwarded.on_reply(message)
        return True

    def _expire(self) -> None:
        now = time.monotonic()
        if now - self._clients_checked > CLIENT_CHECK_S:
            self._clients_checked = now
            for client in list(self.clients):
                self._send(client, _PING)
        late = [q for q in self._queued if now > q.due]
        if late:
            self._queued = [q for q in self._queued if now <= q.due]
            for q in late:
                q.on_reply(_error_message(BusTimeout(
                    f"{self.agents.name(q.rank)} did not come back to the bus within "
                    f"{FORWARD_TIMEOUT_S:.0f} s")))
        for agent_id, forwarded in list(self._forwarded.items()):
            if now > forwarded.due:
                del self._forwarded[agent_id]
                forwarded.on_reply(_error_message(BusTimeout(
                    f"{self.agents.name(forwarded.rank)} did not answer within "
                    f"{FORWARD_TIMEOUT_S:.0f} s: it may be stuck outside Python (where shows "
                    "its stack)")))
        for agent in self.agents:
            if agent.connected and not agent.lost_reported and now - agent.seen > AGENT_SILENT_S:
                agent.lost_reported = True
                self.publish("agent.lost", {"silent_s": round(now - agent.seen, 1)}, agent.rank)

    def close(self) -> None:
        authenticator = getattr(self, "_authenticator", None)
        if authenticator is not None:
            authenticator.stop()
        self._router.close(0)
        self._pub.close(0)
        self._context.term()
        for path in self._ipc_files:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _error_message(error: BusError) -> dict:
    return {"v": BASE_VERSION, "id": None, "ok": False,
            "error": {"type": error.type, "message": error.message}}


def result_of(message: dict) -> dict:
    """The result of an agent's reply message, or the typed error it carries."""
    if message.get("ok"):
        return message.get("result") or {}
    error = message.get("error") or {}
    raise error_from_type(str(error.get("type")), str(error.get("message")))
