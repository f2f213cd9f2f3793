"""The agent's part in a run of several real ranks (``--ranks``): one
timeline shared by every real rank's replay engine, and consistent cuts.

Each real rank's process replays the whole world itself, so the replicas
must agree: every real rank's arrivals are published as it issues its ops
(backend/exchange.py) and fed into every other replica, which holds the
classes of real ranks at an op until all their arrivals are known (the
engine's own rule).  Three things make the replicas bit-identical and the
times the job's:

* one origin: the real ranks meet (a barrier of their real world group) in
  ``init_process_group`` and every clock reads 0 from there, as the engine's
  virtual peers do;
* one lock: the rank's threads and the exchange's receivers call the engine
  only under it, never waiting while they hold it;
* no exchange latency in the job's time: a rank that waits for another real
  rank's arrival caps its clock where its wait began, and once the answer is
  known sets it to the op's completion (or where it stopped, if later); the
  wall time between is the harness's (engine/clock.py's cap and uncap).

A snapshot is a cut of them all at one iteration boundary (:meth:`OneTimeline.cut`):
each rank waits there until every other rank's end of that iteration is in
its replica, so the replicas CRIU dumps are equal; then the exchange stops
(its connections close) and after the dump starts again under the store
namespace the run goes on in (:meth:`OneTimeline.resume`).

Each iteration event carries ``real_ops``: every real rank's completions in
the iteration before it, as this replica computed them (``float.hex``), and
this rank's own arrivals there, so the replicas can be compared to the last
bit, and with an offline replay of everyone's arrivals.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import cast

import torch.distributed as dist

from prism_debug.backend.exchange import ISSUE, ArrivalExchange
from prism_debug.backend.real_comms import SideStore
from prism_debug.backend.work import off_clock
from prism_debug.engine.graph_engine import GraphEngine
from prism_debug.engine.replay import ReplayEngine
from prism_debug.errors import PrismError
from prism_debug.snapshot.control import RestoreControl


class LockedReplay:
    """The replay engine behind a lock: every method call takes it."""

    def __init__(self, replay, lock: threading.RLock) -> None:
        self._replay = replay
        self._lock = lock

    def __getattr__(self, name: str):
        value = getattr(self._replay, name)
        if not callable(value):
            return value
        lock = self._lock

        def locked(*args, **kwargs):
            with lock:
                return value(*args, **kwargs)
        return locked

    def __setattr__(self, name: str, value) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._replay, name, value)


# how long a rank at a cut waits for the others' ends of the iteration (they
# may still be computing it: a slow rank's iteration, a paused console's)
CUT_TIMEOUT = datetime.timedelta(minutes=10)


class OneTimeline:
    """Publishes this rank's arrivals and feeds the others' into its engine."""

    def __init__(self, engine: GraphEngine, runtime, on_error) -> None:
        self._lock = threading.RLock()
        self._replay = engine.replay
        self._engine = engine
        self._runtime = runtime
        self._on_error = on_error
        # (a proxy with every attribute of the engine it wraps, through __getattr__)
        engine.replay = cast(ReplayEngine, LockedReplay(engine.replay, self._lock))
        # the last iteration each other real rank ended, as fed (a cut waits on it)
        self._ended = {rank: 0 for rank in runtime.real_ranks if rank != runtime.rank}
        self._fed = threading.Condition(self._lock)
        self.exchange = self._exchange(runtime.side_store)

    def _exchange(self, side: SideStore) -> ArrivalExchange:
        runtime = self._runtime
        exchange = ArrivalExchange(side, runtime.rank, runtime.real_ranks, self._feed,
                                   on_error=self._on_error)
        self._engine.exchange = exchange
        return exchange

    def start(self) -> None:
        """At init_process_group, once the real ranks have met and the clock
        reads 0: from here on every arrival is job time."""
        self.exchange.start()

    def _feed(self, rank: int, kind: int, iteration: int, op: int, arrival: float) -> None:
        off_clock.thread = True  # (a receiver thread: its work is not the rank's time)
        with self._lock:
            if kind == ISSUE:
                self._replay.peer_issue(rank, iteration, op, arrival)
            else:
                self._replay.peer_iteration_end(rank, iteration)
                self._ended[rank] = iteration
                self._fed.notify_all()
            self._runtime.completer.engine_advanced()

    def real_ops(self, iteration: int) -> dict:
        """Every real rank's completions in ``iteration``, in program order,
        as ``float.hex`` ("inf" where this replica does not know one yet),
        and this rank's own arrivals ([op, arrival hex]): what an offline
        replay needs to check them."""
        graph, replay = self._engine.graph, self._replay
        done = {}
        with self._lock:
            for rank in replay.real_ranks:
                program = graph.programs[graph.class_of(rank)]
                done[str(rank)] = [replay.completion(rank, iteration, event.op).hex()
                                   for event in program.events(iteration)
                                   if event.action == "issue"]
        arrivals = self._engine.arrivals.pop(iteration, [])
        return {"iteration": iteration, "done": done,
                "arrivals": [[op, arrival.hex()] for op, arrival in arrivals]}

    def cut(self, iteration: int) -> None:
        """At the boundary that ended ``iteration``, for a snapshot of every
        real rank: wait until every other rank's events up to its end of
        ``iteration`` are in this replica (at a cut none has any past it),
        then stop the exchange, its connections closed.  :class:`TimeoutError`
        if some rank never gets there."""
        self._drain(iteration, "no consistent cut")
        self.exchange.stop()

    def _drain(self, iteration: int, why: str = "no agreed change") -> None:
        """Wait until every other rank's end of ``iteration`` is in this replica."""
        with self._fed:
            if not self._fed.wait_for(lambda: min(self._ended.values(), default=iteration)
                                      >= iteration, CUT_TIMEOUT.total_seconds()):
                late = sorted(r for r, ended in self._ended.items() if ended < iteration)
                raise TimeoutError(f"ranks {late} did not end iteration {iteration} within "
                                   f"{CUT_TIMEOUT}: {why}")

    def agree(self, iteration: int, apply: Callable[[], object]) -> None:
        """At the boundary that ended ``iteration``, a change every replica
        makes at the same point (agent/agreed.py): drain (every other rank's
        events up to its end of ``iteration`` in this replica), ``apply``,
        then a barrier, so that no replica hears an op of the next iteration
        before each has applied it.  :class:`TimeoutError` if some rank never
        gets there."""
        self._drain(iteration)
        with self._lock:  # (no receiver feeds meanwhile: nobody is past the barrier)
            apply()
        side = self.exchange.side
        store = dist.PrefixStore(f"{side.prefix}agreed/{iteration}/", dist.TCPStore(
            side.host, side.port, is_master=False, timeout=CUT_TIMEOUT))
        store.set(str(self._runtime.rank), "1")
        store.wait([str(rank) for rank in self._ended], CUT_TIMEOUT)
        del store  # (its connection closed: a snapshot may follow)

    def resume(self, side: SideStore) -> None:
        """After a cut: a new exchange on ``side``, its event numbers from 0."""
        self.exchange = self._exchange(side)
        self.exchange.start()

    def stop(self) -> None:
        self.exchange.stop()


class SeveralRanks:
    """This rank among the other real ranks: the timeline its engine shares
    with theirs (where virtual peers are replayed from a graph), and its
    part of each cut — the communicators among them (``runtime.real_comms``,
    made at init_process_group) dropped before the dump and made again
    after.  ``fatal`` ends the rank with one error."""

    def __init__(self, engine: GraphEngine | None, runtime, fatal) -> None:
        self._runtime = runtime
        self._fatal = fatal
        self.timeline = OneTimeline(engine, runtime, fatal) if engine is not None else None

    def start(self) -> None:
        if self.timeline is not None:
            self.timeline.start()

    def cut(self, iteration: int) -> None:
        """At the boundary that ended ``iteration``, before the dump: the other
        replicas' events up to it in this one, then every connection to the
        other ranks closed (CRIU cannot dump half of a TCP connection)."""
        if self.timeline is not None:
            try:
                self.timeline.cut(iteration)
            except TimeoutError as exc:
                self._fatal(PrismError(str(exc)))
        if self._runtime.real_comms is not None:
            self._runtime.real_comms.disconnect()

    def agree(self, iteration: int, apply: Callable[[], object]) -> None:
        """A change to the virtual peers at the boundary that ended
        ``iteration``, made by every replica at the same point of the job."""
        if self.timeline is None:  # (peers in lockstep: nothing to agree on)
            apply()
            return
        try:
            self.timeline.agree(iteration, apply)
        except (TimeoutError, RuntimeError) as exc:  # (torch's store errors are RuntimeErrors)
            self._fatal(PrismError(f"at the end of iteration {iteration} the other real "
                                   f"ranks did not meet to change their peers: {exc}"))

    def after_cut(self, iteration: int, control: RestoreControl | None) -> None:
        """Connect to the other real ranks again: the original under its run's
        namespace for after this cut, a restored copy on the store of the
        controller that restored it (its control file says which)."""
        comms = self._runtime.real_comms
        if comms is None:
            return
        restored_on = control.side_store if control is not None else None
        side = SideStore.from_dict(restored_on) if restored_on else comms.side.after_cut(iteration)
        try:
            comms.reconnect(side)
        except (RuntimeError, ValueError) as exc:  # torch's store and gloo errors
            self._fatal(PrismError(f"after the snapshot of iteration {iteration} the other "
                                   f"real ranks could not be reached again: {exc}"))
        if self.timeline is not None:
            self.timeline.resume(side)

    def close(self) -> None:
        """At the rank's exit: the exchange stopped, every connection closed."""
        if self.timeline is not None:
            self.timeline.stop()
        if self._runtime.real_comms is not None:
            self._runtime.real_comms.close()
