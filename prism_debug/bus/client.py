"""The client end of the bus: requests over a DEALER, events from a SUB.

A client is what the console (and scripts, and tests) drive: one request at a
time, answered by the reply that carries its id, with replies to requests that
already timed out dropped on the floor.  Events are buffered as they arrive so
that waiting for one kind (``paused``) loses none of the others.  A client of a
controller running several ranks subscribes to one rank's events (its topic
prefix): each rank's are numbered apart, so it counts only its own rank's gaps.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Iterable
from typing import Any

import zmq

from prism_debug.bus import keys as curve_keys
from prism_debug.bus.protocol import (
    MAX_WIRE_BYTES,
    BadMessage,
    BusError,
    BusTimeout,
    decode_event,
    decode_reply,
    encode_request,
    event_topic,
    new_request_id,
)
from prism_debug.bus.sessions import SessionInfo
from prism_debug.errors import KeysError

log = logging.getLogger(__name__)

_DRAIN_MAX = 10_000  # events moved into the buffer per call, at most


class BusClient:
    def __init__(self, commands_endpoint: str, events_endpoint: str,
                 curve: curve_keys.ClientCurve | None = None, *,
                 context: zmq.Context | None = None, rank: int | None = None) -> None:
        """``rank``: receive that rank's events only (None: every rank's)."""
        self.commands_endpoint = commands_endpoint
        self.events_endpoint = events_endpoint
        #: events the controller published that this client never saw (gaps in seq)
        self.missed = 0
        self._last_seq: dict[int, int] = {}  # per rank: each rank's events numbered apart
        self._buffer: collections.deque[dict[str, Any]] = collections.deque()
        context = context or zmq.Context.instance()
        self._commands = context.socket(zmq.DEALER)
        self._events = context.socket(zmq.SUB)
        self._curve = curve
        for socket in (self._commands, self._events):
            socket.linger = 0  # closing never waits on a controller that went away
            # a larger frame is dropped unallocated (and the connection with it)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_WIRE_BYTES)
            if curve is not None:
                curve_keys.apply_client(socket, (curve.public, curve.secret),
                                        curve.server_public)
        self._events.setsockopt(zmq.RCVHWM, 20_000)  # the controller's PUB queues as many
        self._events.setsockopt(zmq.SUBSCRIBE, b"" if rank is None else event_topic(rank))
        # watched until the CURVE handshake is done: a server with another key
        # fails it, which check_server tells apart from a silent controller
        self._monitor = (self._commands.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
            | zmq.EVENT_DISCONNECTED) if curve is not None else None)
        self._commands.connect(commands_endpoint)
        self._events.connect(events_endpoint)
        self._closed = False

    @classmethod
    def for_session(cls, info: SessionInfo, *, context: zmq.Context | None = None,
                    rank: int | None = None) -> BusClient:
        """A client of a published session, with CURVE when the session uses it.  Of a
        session of several ranks it receives ``rank``'s events (default: the lowest's,
        the rank a hello naming none drives); of one rank's, every event."""
        curve = None
        if info.curve_public is not None:
            public, secret = curve_keys.load_client()
            curve = curve_keys.ClientCurve(public=public, secret=secret,
                                           server_public=info.curve_public.encode("ascii"))
        if rank is None and len(info.ranks) > 1:
            rank = min(info.ranks)
        return cls(info.commands, info.events, curve, context=context, rank=rank)

    def check_server(self, timeout_s: float = 10.0) -> None:
        """With CURVE: wait for the handshake with the controller; :class:`KeysError`
        when it fails (the server holds another key than the one we expect, or does not
        know our client key).  Silence is left to the request that follows."""
        if self._monitor is None or self._curve is None:  # (both or neither: CURVE is watched)
            return
        from zmq.utils.monitor import recv_monitor_message

        deadline = time.monotonic() + timeout_s
        try:
            while True:
                remaining_ms = max(0, round((deadline - time.monotonic()) * 1000))
                if not self._monitor.poll(remaining_ms):
                    return
                event = recv_monitor_message(self._monitor)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    return
                if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    raise KeysError(f"the controller at {self.commands_endpoint} refused your "
                                    "CURVE client key: it is not the key of the user who "
                                    "started the session (prism-debug keys, $PRISM_DEBUG_KEYS)")
                raise KeysError(
                    f"the controller at {self.commands_endpoint} failed the CURVE handshake: "
                    f"its server key is not {self._curve.server_public.decode()} (the key you "
                    "expect); refusing to attach to a server that may not be yours")
        finally:
            self._commands.disable_monitor()
            self._monitor.close(0)
            self._monitor = None

    # --- requests -------------------------------------------------------------------------

    def request(self, verb: str, timeout_s: float = 10.0, **args: Any) -> dict[str, Any]:
        """Send one request and return its result; an error reply raises its
        :class:`BusError`, silence :class:`BusTimeout`."""
        request_id = new_request_id()
        self._commands.send(encode_request(verb, args, id=request_id))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = max(0, round((deadline - time.monotonic()) * 1000))
            if not self._commands.poll(remaining_ms, zmq.POLLIN):
                raise BusTimeout(f"the controller at {self.commands_endpoint} did not answer "
                                 f"within {timeout_s:g}s: is the session still running? "
                                 "prism-debug ps", request_id=request_id)
            # the last frame is the reply, whether or not a REQ-style delimiter precedes it
            frame = self._commands.recv_multipart(copy=True)[-1]
            try:
                reply_id, result = decode_reply(frame)
            except BusError as exc:
                # An error with no id answers a frame the controller could not read: ours,
                # since a client has one request in flight.
                if exc.request_id in (request_id, None):
                    raise
                log.debug("dropping a stale error reply to request %s", exc.request_id)
                continue
            if reply_id == request_id:
                return result
            log.debug("dropping a stale reply to request %s", reply_id)

    # --- events ---------------------------------------------------------------------------

    def _receive(self, timeout_ms: int) -> bool:
        """Move one event from the socket into the buffer; False when none came in time."""
        if not self._events.poll(timeout_ms, zmq.POLLIN):
            return False
        frames = self._events.recv_multipart(copy=True)
        try:
            if len(frames) != 2:
                raise BadMessage(f"an event has 2 frames (topic, body), got {len(frames)}")
            event = decode_event(frames[0], frames[1])
        except BadMessage as exc:
            log.warning("ignoring a malformed event: %s", exc)
            return True
        seq, last = event["seq"], self._last_seq.get(event["rank"])
        if last is not None and seq > last + 1:
            self.missed += seq - last - 1
        # a lower seq means a new numbering (a controller restarted): it becomes the base
        self._last_seq[event["rank"]] = seq
        self._buffer.append(event)
        return True

    def _drain(self) -> None:
        """Buffer what has arrived, up to a bound: a publisher faster than we decode must
        not keep the caller here forever."""
        for _ in range(_DRAIN_MAX):
            if not self._receive(0):
                return

    def events(self, timeout_s: float = 0.0) -> list[dict[str, Any]]:
        """Every event received so far, oldest first.  With nothing buffered, waits up to
        ``timeout_s`` for the first one."""
        if not self._buffer:
            self._receive(round(timeout_s * 1000))
        self._drain()
        drained = list(self._buffer)
        self._buffer.clear()
        return drained

    def next_event(self, kinds: Iterable[str] | str,
                   timeout_s: float) -> dict[str, Any] | None:
        """The first event (buffered or arriving within ``timeout_s``) whose kind is in
        ``kinds``; the others stay buffered for :meth:`events`.  None on timeout."""
        wanted = {kinds} if isinstance(kinds, str) else set(kinds)
        self._drain()
        for i, event in enumerate(self._buffer):
            if event["kind"] in wanted:
                del self._buffer[i]
                return event
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = max(0, round((deadline - time.monotonic()) * 1000))
            before = len(self._buffer)
            if not self._receive(remaining_ms):
                return None
            if len(self._buffer) > before and self._buffer[-1]["kind"] in wanted:
                return self._buffer.pop()
            if remaining_ms == 0:  # a steady stream of other kinds must not hold us past it
                return None

    # --- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._monitor is not None:
                self._commands.disable_monitor()
                self._monitor.close(0)
            self._commands.close()
            self._events.close()

    def __enter__(self) -> BusClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
