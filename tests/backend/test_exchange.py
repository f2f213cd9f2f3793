"""The arrival exchange among real ranks, over a real TCPStore."""

from __future__ import annotations

import datetime
import threading
import time

import torch.distributed as dist

from prism_debug.backend.exchange import END, ISSUE, ArrivalExchange
from prism_debug.backend.real_comms import SideStore


def _store():
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=30))
    return master, SideStore("127.0.0.1", master.port, "prism/test/")


class Fed:
    def __init__(self, expected: int) -> None:
        self.events: list[tuple] = []
        self.done = threading.Event()
        self._expected = expected

    def __call__(self, *event) -> None:
        self.events.append(event)
        if len(self.events) == self._expected:
            self.done.set()


def test_each_rank_gets_every_other_ranks_events_in_order():
    master, side = _store()
    fed = {rank: Fed(2 * 5) for rank in (0, 1, 2)}
    exchanges = {rank: ArrivalExchange(side, rank, (0, 1, 2), fed[rank]) for rank in fed}
    for exchange in exchanges.values():
        exchange.start()
    for rank, exchange in exchanges.items():
        for op in range(4):
            exchange.issued(1, op, rank + op / 8)  # exact in binary: compared with ==
        exchange.iteration_ended(1)
    for rank in fed:
        assert fed[rank].done.wait(10)
        for other in set(fed) - {rank}:
            got = [e[1:] for e in fed[rank].events if e[0] == other]
            assert got == [(ISSUE, 1, op, other + op / 8) for op in range(4)] + [(END, 1, 0, 0.0)]
    started = time.perf_counter()
    for exchange in exchanges.values():
        exchange.stop()
    assert time.perf_counter() - started < 3  # receivers see the stop within a poll
    del master


def test_a_receiver_waits_for_events_still_to_come():
    master, side = _store()
    fed = Fed(1)
    waiting = ArrivalExchange(side, 0, (0, 1), fed)
    waiting.start()
    time.sleep(0.3)  # several polls with nothing there
    assert fed.events == []
    late = ArrivalExchange(side, 1, (0, 1), lambda *e: None)
    late.start()
    late.issued(7, 3, 2.5)
    assert fed.done.wait(10)
    assert fed.events == [(1, ISSUE, 7, 3, 2.5)]
    waiting.stop()
    late.stop()
    del master
