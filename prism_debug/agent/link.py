"""The rank's end of the bus: a DEALER on a thread of its own.

It answers the commands the controller forwards (through the agent's
``handle``), sends the agent's events and a heartbeat every second.  The
rank's main thread never touches the socket: events go through a bounded
queue that drops the oldest when the bus falls behind, so publishing never
blocks training.

The link proves it is the rank's: its hello carries the session's secret
(from agent.json or the control file, never the environment) and goes over the
controller's ipc socket, whose peer credentials give the controller our pid.
Each start connects under a fresh random identity: nobody else can take over
ours, and we need no ``ROUTER_HANDOVER`` to replace the one we left.

Before a snapshot the link is stopped — socket closed, ZeroMQ context
terminated, its threads gone — because CRIU cannot dump half of a connection
(TCP or Unix); afterwards (in the original and in every restored copy) a new
link starts, to the endpoint the controller then names.  A controller that
stops answering is reported once and the rank runs on.

A command the controller forwarded as the link closed may be unread, or read
and done with its reply lost: the controller sends what is unanswered again on
the next link (under the same id).  So the link keeps the replies it sent last,
by id, across restarts, and answers an id it has seen with the reply it gave —
a ``break`` or ``perturb`` is done once however often it arrives.  Bounded: the
controller holds at most ``MAX_FORWARDED`` requests unanswered, and a reply is
lost only with those sent after it, so the last that many replies are enough
(and a reply over the byte bound is not kept: its id is, and a repeat of it is
refused rather than done again).
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from prism_debug.bus.protocol import (
    AGENT_VERBS,
    MAX_FRAME_BYTES,
    MAX_WIRE_BYTES,
    BusError,
    InternalError,
    Unauthorized,
    decode_reply,
    decode_request,
    encode_error,
    encode_reply,
    encode_request,
)

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
CONTROLLER_SILENT_S = 5.0  # no word from the controller for this long: it is lost
_OUTBOX = 10_000  # events kept while the bus falls behind; older ones are dropped
_POLL_MS = 10
_BATCH = 2000  # events per frame, at most; halved while the frame is over the limit
# replies kept for a repeated request (the controller's MAX_FORWARDED), and their bytes
ANSWERED_KEPT = 1024
ANSWERED_BYTES = 16 << 20


class BusLink:
    def __init__(self, endpoint: str, rank: int, pid: int,
                 handle: Callable[[str, dict], dict],
                 on_lost: Callable[[], None], curve: dict | None = None,
                 secret: str | None = None) -> None:
        self.endpoint = endpoint
        self._rank = rank
        self._pid = pid
        self._handle = handle
        self._on_lost = on_lost
        self.curve = curve  # {"server_public", "public", "secret"} when the bus uses CURVE
        self.secret = secret  # the session's, shown in the hello
        self._refused = False  # the controller refused our hello: say it again
        self._outbox: collections.deque = collections.deque(maxlen=_OUTBOX)
        # request id -> the reply sent (None: too large to keep), oldest first; only
        # the link's thread touches it, and it outlives the thread (a snapshot's restart)
        self._answered: collections.OrderedDict[str, bytes | None] = collections.OrderedDict()
        self._answered_bytes = 0
        self.repeats = 0  # requests answered again from _answered (tests)
        self.dropped = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked copy of the rank (a DataLoader worker): it is not the rank
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="prism-debug-bus", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close the connection and end the thread (before a snapshot, at exit)."""
        if self._thread is not None:
            self._stopping.set()
            self._thread.join()
            self._thread = None

    def publish(self, kind: str, data: dict[str, Any]) -> None:
        """Queue an event; never blocks (from any thread)."""
        if len(self._outbox) == _OUTBOX:
            self.dropped += 1
        self._outbox.append((kind, data))

    # -- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        context = zmq.Context()
        socket = context.socket(zmq.DEALER)
        # ours for this connection only; the controller learns it from the hello
        socket.setsockopt(zmq.IDENTITY, b"agent-" + secrets.token_hex(8).encode())
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_WIRE_BYTES)
        socket.setsockopt(zmq.SNDHWM, _OUTBOX)
        if self.curve:
            socket.curve_serverkey = self.curve["server_public"].encode()
            socket.curve_publickey = self.curve["public"].encode()
            socket.curve_secretkey = self.curve["secret"].encode()
        socket.connect(self.endpoint)
        try:
            hello = encode_request("agent.hello", {"rank": self._rank, "pid": self._pid,
                                                   "secret": self.secret or ""})
            _send(socket, hello)
            heard = next_beat = time.monotonic()
            lost = greeted = False
            while not self._stopping.is_set():
                if socket.poll(_POLL_MS) and self._answer_all(socket):
                    heard = time.monotonic()
                    greeted = not self._refused
                    if lost:
                        lost = False
                        log.warning("prism-debug: the controller answers again")
                self._flush(socket)
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + HEARTBEAT_S
                    # until the controller answers, hello again: it may have missed it
                    _send(socket, encode_request("agent.heartbeat") if greeted else hello)
                if not lost and now - heard > CONTROLLER_SILENT_S:
                    lost = True
                    self._on_lost()
            self._answer_all(socket)  # what came in as the link closes is answered too
            self._flush(socket)
        except zmq.ZMQError as exc:  # the bus is gone; the rank is not
            log.warning("prism-debug: the debugger bus failed (%s); the rank runs on", exc)
            self._on_lost()
        finally:
            socket.close(linger=200)  # let the last reply and events out
            context.term()

    def _answer_all(self, socket) -> bool:
        """Answer every frame waiting; whether there was any."""
        heard = False
        while True:
            try:
                frame = socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return heard
            heard = True
            self._answer(socket, frame)

    def _answer(self, socket, frame: bytes) -> None:
        """A command from the controller (replies to our own heartbeats and
        hello need nothing)."""
        try:
            request = decode_request(frame, AGENT_VERBS)
        except BusError as exc:
            if b'"verb"' not in frame:  # a reply to us, not a request
                refusal = _refusal(frame)
                if refusal is not None and not self._refused:
                    log.warning("prism-debug: the controller refused the rank's bus link: %s",
                                refusal)
                self._refused = refusal is not None
                return
            _send(socket, encode_error(exc.request_id, exc))
            return
        if request.id in self._answered:  # sent again: done already, its reply was lost
            self.repeats += 1
            reply = self._answered[request.id]
            _send(socket, reply if reply is not None else encode_error(request.id, InternalError(
                f"{request.verb} was done already and its reply, too large to keep, was lost "
                "as the rank's bus link closed for a snapshot: ask what it changed")))
            return
        try:
            result = self._handle(request.verb, request.args)
            reply = encode_reply(request.id, result)
        except BusError as exc:
            reply = encode_error(request.id, exc)
        except Exception as exc:  # a bug in a command must not kill the rank
            log.exception("prism-debug: %s failed", request.verb)
            reply = encode_error(request.id, InternalError(f"{type(exc).__name__}: {exc}"))
        self._keep(request.id, reply)
        _send(socket, reply)

    def _keep(self, request_id: str, reply: bytes) -> None:
        """Remember ``reply`` as the answer to ``request_id``, within the bounds."""
        kept = reply if len(reply) <= ANSWERED_BYTES // 64 else None
        self._answered[request_id] = kept
        self._answered_bytes += len(kept or b"")
        while len(self._answered) > ANSWERED_KEPT or self._answered_bytes > ANSWERED_BYTES:
            _, dropped = self._answered.popitem(last=False)
            self._answered_bytes -= len(dropped or b"")

    def _flush(self, socket) -> None:
        """Send what queued up, in batches: one frame (one JSON encoding, one
        send) for many events keeps the GIL away from the rank's main thread."""
        outbox = self._outbox
        while outbox:
            batch = [outbox.popleft() for _ in range(min(len(outbox), _BATCH))]
            frame = encode_request("agent.events", {"events": batch})
            while len(frame) > MAX_FRAME_BYTES and len(batch) > 1:
                # the controller would refuse it: send half, the rest goes next
                half = len(batch) // 2
                outbox.extendleft(reversed(batch[half:]))
                batch = batch[:half]
                frame = encode_request("agent.events", {"events": batch})
            if len(frame) > MAX_FRAME_BYTES or not _send(socket, frame):
                self.dropped += len(batch)


def _refusal(frame: bytes) -> str | None:
    """Why the controller did not believe our hello, if that is what a reply says."""
    try:
        decode_reply(frame)
    except Unauthorized as exc:
        return exc.message
    except BusError:
        pass
    return None


def _send(socket, frame: bytes) -> bool:
    """Send without blocking; False when the bus cannot take it now."""
    try:
        socket.send(frame, zmq.NOBLOCK)
        return True
    except zmq.Again:
        return False
