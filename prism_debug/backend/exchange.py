"""Every real rank's arrivals, told to every other real rank.

Each real rank's process replays the virtual peers itself, and the peers'
times depend on every real rank's (a late real rank delays the groups it is
in, and through them ranks it never meets).  So that all the replicas agree
on one timeline, each real rank publishes, in order, when it issued each op
of its class program and when it ended each iteration; every other real
rank's replica is fed them as they come.

The events of rank r are keys ``x/<r>/<n>`` (n = 0, 1, ...) on the run's
side store: a sender thread writes them off the rank's path (the op only
queues a tuple), one receiver thread per other real rank waits for them in
order.  Each thread has a store client of its own: a TCPStore client
serialises its calls, and a receiver blocks in ``wait``.
"""

from __future__ import annotations

import datetime
import queue
import struct
import threading
from typing import Callable, Sequence

import torch.distributed as dist

from prism_debug.backend.real_comms import SideStore

ISSUE, END = 0, 1
# kind, iteration, op (its index in the class program), arrival (job seconds)
_EVENT = struct.Struct("<Bqqd")
_POLL = datetime.timedelta(milliseconds=100)  # how often a waiting receiver checks for stop

# (rank, kind, iteration, op, arrival): a receiver hands the events it reads to this
Feed = Callable[[int, int, int, int, float], None]


class ArrivalExchange:
    def __init__(self, side: SideStore, me: int, real_ranks: Sequence[int], feed: Feed,
                 timeout: datetime.timedelta = datetime.timedelta(minutes=10),
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self._side = side
        self.me = me
        self._others = [r for r in real_ranks if r != me]
        self._feed = feed
        self._timeout = timeout
        self._on_error = on_error
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    def _store(self) -> dist.Store:
        return dist.PrefixStore(self._side.prefix + "x/", dist.TCPStore(
            self._side.host, self._side.port, is_master=False, timeout=self._timeout))

    def start(self) -> None:
        sender = threading.Thread(target=self._send, name="prism-exchange-send", daemon=True)
        self._threads.append(sender)
        for rank in self._others:
            self._threads.append(threading.Thread(
                target=self._receive, args=(rank,), name=f"prism-exchange-{rank}", daemon=True))
        for thread in self._threads:
            thread.start()

    # -- this rank's events (the rank's own thread: a queue put each) ------------------

    def issued(self, iteration: int, op: int, arrival: float) -> None:
        self._outbox.put((ISSUE, iteration, op, arrival))

    def iteration_ended(self, iteration: int) -> None:
        self._outbox.put((END, iteration, 0, 0.0))

    def stop(self) -> None:
        """Send what is queued, stop the threads (receivers within a poll)."""
        self._outbox.put(None)
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    # -- the threads ------------------------------------------------------------------

    def _send(self) -> None:
        try:
            store = self._store()
            sent = 0
            while (event := self._outbox.get()) is not None:
                store.set(f"{self.me}/{sent}", _EVENT.pack(*event))
                sent += 1
        except Exception as exc:  # noqa: BLE001 - reported, the thread is gone
            self._failed(exc)

    def _receive(self, rank: int) -> None:
        try:
            store = self._store()
            received = 0
            while not self._stopping.is_set():
                key = f"{rank}/{received}"
                try:
                    store.wait([key], _POLL)
                except dist.DistStoreError:
                    continue  # not yet: look at the stop flag, wait again
                kind, iteration, op, arrival = _EVENT.unpack(store.get(key))
                self._feed(rank, kind, iteration, op, arrival)
                received += 1
        except Exception as exc:  # noqa: BLE001 - reported, the thread is gone
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if self._on_error is not None and not self._stopping.is_set():
            self._on_error(exc)
