"""A console's requests while the rank snapshots every iteration (``run
--history``): none is lost, none is done twice.  The agent closes its bus link
for every dump and says hello again after; before issue 16 a request forwarded
in that moment was lost and its client waited out the 30 s forward timeout.
A real rank, real sockets, real CRIU dumps: one client polls ``status`` and
adds a breakpoint in turn, another asks ``status`` the instant each
iteration ends — when the link is closing — to hit the race at every boundary."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from prism_debug.bus.client import BusClient
from prism_debug.bus.protocol import BusTimeout
from tests.live_session import SCRIPTS, start, wait_for_session

pytestmark = pytest.mark.slow

POLL_S = 8.0  # how long the clients ask
GAP_S = 0.02
LOST_S = 10.0  # a reply slower than this (a dump takes well under a second) is lost


class Asker:
    """A client's requests, timed; silence past LOST_S counts as lost."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.lost: list[str] = []

    def ask(self, client: BusClient, verb: str, **args) -> dict | None:
        t0 = time.monotonic()
        try:
            result = client.request(verb, timeout_s=LOST_S, **args)
        except BusTimeout:
            self.lost.append(verb)
            return None
        self.latencies.append(time.monotonic() - t0)
        return result


def iteration(client: BusClient) -> int:
    """The rank's iteration, from the rank (the controller knows none while it dumps)."""
    while (status := client.request("status"))["iteration"] is None:
        time.sleep(GAP_S)
    return status["iteration"]


def test_no_request_is_lost_or_done_twice_while_the_rank_snapshots_every_iteration(
        tmp_path, session_dir):
    run = start(tmp_path, "--history", "2", script=SCRIPTS / "train_forever.py")
    info = wait_for_session(run)
    polling, at_boundary = Asker(), Asker()
    break_ids: list[int] = []
    stop = threading.Event()

    def at_every_boundary() -> None:
        with BusClient.for_session(info) as client:
            while not stop.is_set():
                if client.next_event("iteration.end", timeout_s=0.5) is not None:
                    at_boundary.ask(client, "status")
                    client.events()  # boundaries passed meanwhile: the next one counts

    shooter = threading.Thread(target=at_every_boundary)
    try:
        with BusClient.for_session(info) as client:
            first = iteration(client)
            shooter.start()
            deadline = time.monotonic() + POLL_S
            n = 0
            while time.monotonic() < deadline:
                n += 1
                if n % 2:
                    polling.ask(client, "status")
                else:  # not idempotent: done twice, it would make two breakpoints
                    added = polling.ask(client, "break", kind="iter", iteration=10**6 + n)
                    if added is not None:
                        break_ids.append(added["id"])
                time.sleep(GAP_S)
            stop.set()
            shooter.join()
            last = iteration(client)
            breaks = client.request("breaks")["breakpoints"]
        answers = len(polling.latencies) + len(at_boundary.latencies)
        slowest = max(polling.latencies + at_boundary.latencies)
        print(f"\n{last - first} snapshots; {answers} answers, "
              f"{len(polling.lost) + len(at_boundary.lost)} lost, slowest {slowest:.3f} s")
        assert last - first >= 5  # boundaries crossed while asking
        assert (polling.lost, at_boundary.lost) == ([], [])
        assert len(at_boundary.latencies) >= 5
        # each break done once: numbered without a gap, and as many as were answered
        assert break_ids == list(range(1, len(break_ids) + 1))
        assert [b["id"] for b in breaks] == break_ids
        assert slowest < LOST_S
    finally:
        stop.set()
        if shooter.is_alive():
            shooter.join()
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)
