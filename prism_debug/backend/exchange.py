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
order, blocked in the store's ``get`` (no polling: a TCPStore logs every
wait that times out).  Each thread has a store client of its own: a
TCPStore client serialises its calls.  :meth:`ArrivalExchange.stop` wakes a
receiver by writing the key it waits for, if nobody has, with a value no
event has.
"""

from __future__ import annotations

import datetime
import queue
import struct
import threading
from collections.abc import Callable, Sequence

import torch.distributed as dist

from prism_debug.backend.real_comms import SideStore

ISSUE, END = 0, 1
# kind, iteration, op (its index in the class program), arrival (job seconds)
_EVENT = struct.Struct("<Bqqd")
_STOP = b"stop"  # what stop() writes where a receiver waits: no event is 4 bytes long

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
        self._sender: threading.Thread | None = None
        self._receivers: dict[int, threading.Thread] = {}
        self._next = {rank: 0 for rank in self._others}  # the event each receiver waits for

    @property
    def side(self) -> SideStore:
        """The store (and the run's namespace on it) the events travel by."""
        return self._side

    def _store(self) -> dist.Store:
        return dist.PrefixStore(self._side.prefix + "x/", dist.TCPStore(
            self._side.host, self._side.port, is_master=False, timeout=self._timeout))

    def start(self) -> None:
        self._sender = threading.Thread(target=self._send, name="prism-exchange-send",
                                        daemon=True)
        self._sender.start()
        for rank in self._others:
            thread = self._receivers[rank] = threading.Thread(
                target=self._receive, args=(rank,), name=f"prism-exchange-{rank}", daemon=True)
            thread.start()

    # -- this rank's events (the rank's own thread: a queue put each) ------------------

    def issued(self, iteration: int, op: int, arrival: float) -> None:
        self._outbox.put((ISSUE, iteration, op, arrival))

    def iteration_ended(self, iteration: int) -> None:
        self._outbox.put((END, iteration, 0, 0.0))

    def stop(self) -> None:
        """Send what is queued, then stop the threads."""
        self._stopping.set()
        self._outbox.put(None)
        if self._sender is not None:
            self._sender.join(timeout=5)
        if self._receivers:
            try:
                store = self._store()
                for rank, thread in self._receivers.items():
                    for _ in range(50):  # (it may take the key being written meanwhile)
                        if not thread.is_alive():
                            break
                        # written only where nobody has: an event there is read first
                        # (c10d's stores take bytes too; torch's stubs say str only)
                        store.compare_set(f"{rank}/{self._next[rank]}", "",
                                          _STOP)  # type: ignore[arg-type]
                        thread.join(timeout=0.1)
            except Exception:  # noqa: BLE001 - the store is gone: so are the peers
                pass
        self._receivers.clear()
        self._sender = None

    # -- the threads ------------------------------------------------------------------

    def _send(self) -> None:
        try:
            store = self._store()
            sent = 0
            while (event := self._outbox.get()) is not None:
                # (bytes: see stop())
                store.set(f"{self.me}/{sent}", _EVENT.pack(*event))  # type: ignore[arg-type]
                sent += 1
        except Exception as exc:  # noqa: BLE001 - reported, the thread is gone
            self._failed(exc)

    def _receive(self, rank: int) -> None:
        try:
            store = self._store()
            while not self._stopping.is_set():
                try:
                    value = store.get(f"{rank}/{self._next[rank]}")
                except dist.DistStoreError:
                    continue  # the store's timeout (a peer paused that long): wait on
                if value == _STOP:
                    return
                kind, iteration, op, arrival = _EVENT.unpack(value)
                self._feed(rank, kind, iteration, op, arrival)
                self._next[rank] += 1
        except Exception as exc:  # noqa: BLE001 - reported, the thread is gone
            self._failed(exc)

    def _failed(self, exc: BaseException) -> None:
        if self._on_error is not None and not self._stopping.is_set():
            self._on_error(exc)
