"""The agent: prism-debug's presence inside the real rank's process.

Installed when the script imports torch (see ``hooks/sitecustomize.py``), it
seeds the random generators, puts the prism backend behind
``init_process_group``, counts iterations with torch's global optimizer-step
hooks (or the script's own ``prism_debug.iteration()`` marks), and appends one
JSON line per event to the run's event log, which the controller reads.
Append-only, line by line: a crash loses nothing already written.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import os
import random
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from prism_debug.agent import no_gpu
from prism_debug.agent.agreed import AgreedBoundaries, Change
from prism_debug.agent.config import ENV_VAR, AgentConfig, claim_bus
from prism_debug.agent.debugger import Debugger
from prism_debug.agent.handshake import Handshake
from prism_debug.agent.program import MESSAGES_ENV, ProgramRecorder, slice_book
from prism_debug.agent.real import SeveralRanks
from prism_debug.agent.reload import Sources
from prism_debug.agent.reload import apply as apply_reload
from prism_debug.agent.shutdown import spare_the_collector_at_exit
from prism_debug.backend.fr_recorder import FlightLog
from prism_debug.backend.install import Messages, install
from prism_debug.backend.real_comms import SideStore
from prism_debug.backend.runtime import Runtime
from prism_debug.backend.tracker import IterationTracker
from prism_debug.backend.values import Values
from prism_debug.backend.watchdog import ErrorHandling, Watchdog
from prism_debug.cost import CostModel, HardwareProfile
from prism_debug.engine import ComputeModel, EmulatedClock, Engine, LockstepEngine, ReplayEngine
from prism_debug.engine.graph_engine import GraphEngine
from prism_debug.engine.injection import apply_fault
from prism_debug.errors import ConfigError, PrismError
from prism_debug.faults import Fault, Injection, fault_from_dict, fault_text, resolve
from prism_debug.graph import ExecutionGraph, FamilyRecorder
from prism_debug.graph.messages import NEEDS_MESSAGES_EXIT, MessageBook, MissingMessage, PeerMessage
from prism_debug.snapshot.control import RestoreControl
from prism_debug.variability import Variability
from prism_debug.variability.model import StochasticCompute

if TYPE_CHECKING:
    from prism_debug.agent.link import BusLink

log = logging.getLogger(__name__)

_active: Agent | None = None


def active_agent() -> Agent | None:
    return _active


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.clock = EmulatedClock()
        # (open for the rank's life: _on_exit closes it)
        self._events = open(config.events_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self.handshake = Handshake(config.control_path)  # a snapshot's wait
        self._backend: str | None = None
        profile = HardwareProfile.from_dict(config.hardware)
        self.families = FamilyRecorder(config.world_size)
        self.tracker = IterationTracker(self.clock.now(), self._emit, config.record_ops)
        self.graph_engine: GraphEngine | None = None
        graph = None
        engine: Engine
        if config.graph_path:
            graph = ExecutionGraph.load(Path(config.graph_path))
            model = CostModel(profile)
            # --variability: every virtual peer's compute drawn from the engine's generator
            # (cast: its gaps_s may answer one array, which ComputeModel allows in words only)
            compute = None if config.variability is None else cast(ComputeModel, StochasticCompute(
                graph, Variability.from_dict(config.variability)))
            replay = ReplayEngine(graph, model.op_time_s, real_rank=config.rank,
                                  record=bool(config.trace_ranks), compute=compute,
                                  seed=config.seed, real_ranks=config.real_ranks or None)
            engine = self.graph_engine = GraphEngine(graph, replay, self._fatal)
        else:
            engine = LockstepEngine(CostModel(profile), profile.gpus_per_node)
        self.runtime = Runtime(
            rank=config.rank, world_size=config.world_size, clock=self.clock,
            engine=engine,
            values=Values(config.values, config.seed), tracker=self.tracker,
            families=self.families, digests=config.digests, stop_check=self._maybe_stop,
            collective_timeout_s=config.collective_timeout_s,
            watchdog=Watchdog(ErrorHandling.from_env(), on_fatal=self._watchdog_fired,
                              dump_flight_record=self._dump_flight_record),
            flight=FlightLog.from_env(config.rank, self.clock),
            on_nonfinite=self._first_nonfinite if config.watch_nonfinite else None,
            side_store=SideStore.from_dict(config.side_store) if config.side_store else None,
            real_ranks=config.real_ranks,
        )
        # several real ranks: one timeline, cuts (agent/real.py)
        self.several = SeveralRanks(self.graph_engine, self.runtime, self._fatal) \
            if len(config.real_ranks) > 1 else None
        # faults in force: each as written, whom it hits, and the replay
        # engine's handle; changes asked while the rank runs wait for the next
        # boundary (the engine is the main thread's)
        self.faults: list[InForce] = []
        self.faults_due: list[Callable[[], object]] = []
        # a console's changes that every real rank makes at one boundary (agreed.py)
        self.agreed = AgreedBoundaries(lambda: self.tracker.iteration)
        if self.graph_engine is not None:
            self._inject_all(config.faults)
        if config.record_program:
            self.runtime.recorder = ProgramRecorder(self.clock.now())
        self.messages = self._peer_messages(graph)
        self.initialised = False
        self.marker_mode = False  # the script marks iterations itself
        self._lead_optimizer: int | None = None
        self._families_version = -1
        self._stop_pending = False
        self.sources = Sources()  # the user's files, hashed when first seen (a reload's diff)
        # the debugger bus: commands answered on the link's thread, the
        # debugger blocking the main thread while paused
        self.link: BusLink | None = None
        self.debugger: Debugger | None = None
        if config.bus:
            self._open_bus(config.bus)

    def _open_bus(self, endpoint: str) -> None:
        from prism_debug.agent.commands import Commands
        from prism_debug.agent.link import BusLink

        config = self.config
        self.debugger = Debugger(self.clock, self._publish, self._watch)
        self.link = BusLink(endpoint, config.rank, os.getpid(), Commands(self).handle,
                            self._controller_lost, config.bus_curve, config.bus_secret)
        self.tracker.keep_last_ops = True
        self._tokens, self._tokens_at, self._skipped, self._sampled = 0.0, 0.0, 0, False
        self._snapshots_asked: set[int] = set()  # iterations the console asked snapshots of

    def install(self) -> None:
        global _active
        _active = self
        seed = self.config.seed
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy
            numpy.random.seed(seed % 2**32)
        except ImportError:
            pass
        install(self.runtime, self._on_init, self.messages)
        self.sources.scan()
        self._emit({"kind": "loaded", "pid": os.getpid()})
        register_optimizer_step_pre_hook(self._before_step)
        register_optimizer_step_post_hook(self._after_step)
        atexit.register(self._on_exit)
        spare_the_collector_at_exit()
        no_gpu.watch(self._emit)  # a CUDA call on a machine without a GPU, named
        if self.link is not None:
            self.link.start()

    # -- events ---------------------------------------------------------------------

    def _emit(self, record: dict) -> None:
        self._events.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _publish(self, kind: str, data: dict) -> None:
        """An event on the bus (never blocks; dropped when there is no bus)."""
        if self.link is not None:
            self.link.publish(kind, data)

    # -- the debugger's seams ----------------------------------------------------------

    def _watch(self, on: bool) -> None:
        # collectives pay for the debugger only while it watches them
        self.runtime.watch = self if on else None

    def enter(self, op: str, ref, seq: int, nbytes: int) -> float:
        debugger = self.debugger
        assert debugger is not None  # (only the debugger turns the watch on)
        if debugger.events_on:
            self._sampled = self._sample()
            if self._sampled:
                self._publish("coll.enter", {
                    "iteration": self.tracker.iteration, "op": op, "family": ref.family,
                    "index": ref.index, "seq": seq, "bytes": nbytes,
                    "time_s": self.clock.now(), "skipped": self._skipped})
                self._skipped = 0
        return debugger.at_collective(op, ref.family, ref.index, seq, nbytes)

    def exit(self, op: str, ref, seq: int, done) -> None:
        debugger = self.debugger
        assert debugger is not None  # (only the debugger turns the watch on)
        if debugger.events_on and self._sampled:
            self._publish("coll.exit", {"iteration": self.tracker.iteration, "op": op,
                                        "family": ref.family, "index": ref.index, "seq": seq,
                                        "done_s": done if isinstance(done, float) else None})

    def _sample(self) -> bool:
        """Collective events are sampled: at most ``COLL_EVENTS_PER_S`` a
        second, so a rank issuing thousands of small collectives pays for
        few of them (``skipped`` in the next one says how many were not sent)."""
        now = time.perf_counter()
        tokens = min(COLL_EVENTS_PER_S / 10,
                     self._tokens + (now - self._tokens_at) * COLL_EVENTS_PER_S)
        self._tokens_at = now
        if tokens >= 1.0:
            self._tokens = tokens - 1.0
            return True
        self._tokens = tokens
        self._skipped += 1
        return False

    def emulated_s(self) -> float:
        """Emulated seconds since init_process_group."""
        return self.clock.now() - self._started if self.initialised else 0.0

    def _controller_lost(self) -> None:
        """The controller stopped answering: run on, never wait for it."""
        print("prism-debug: the controller stopped answering the rank's bus; the rank runs on "
              "(breakpoints cleared)", file=sys.stderr, flush=True)
        assert self.debugger is not None  # (made with the link that calls this)
        self.debugger.release()

    def _on_init(self, requested_backend: str) -> None:
        if self.several is not None:  # the real ranks have met: the clocks read job time
            self.several.start()
        self.initialised = True
        self._backend = requested_backend
        self.sources.scan()  # modules imported since torch (before the clock starts)
        now = self._started = self.clock.now()
        self.tracker.start = now
        if self.runtime.recorder is not None:
            self.runtime.recorder = ProgramRecorder(now)
        self._emit({"kind": "init", "backend": requested_backend, "rank": self.config.rank,
                    "world_size": self.config.world_size, "time_s": now,
                    "variability": self.config.variability})
        if self.debugger is not None:
            self._publish("iteration.start", {"iteration": 1, "time_s": now})
            if self.config.start_paused:
                self.debugger.pause("start")
            self.debugger.at_iteration_start(1)

    def _on_exit(self) -> None:
        self.runtime.completer.close()
        if self.several is not None:
            self.several.close()
        if self.link is not None:
            self.link.stop()
        if self.initialised:
            self._emit({"kind": "exit", "families": self._families(),
                        "peak_rss_bytes": _peak_rss(),
                        "harness_excluded_s": self.clock.excluded_s})
        self._events.close()

    # -- what virtual peers send (graph/messages.py) ------------------------------------

    def _peer_messages(self, graph: ExecutionGraph | None) -> Messages | None:
        if graph is not None:
            # (a dict of its own: the book takes a dict of any iterables, and dicts are invariant)
            messages: dict[int, Iterable[PeerMessage]] = dict(graph.messages)
            return Messages(MessageBook(graph.class_of, graph.message_iterations,
                                        messages, range(len(graph.programs)))) \
                if graph.messages else None
        if not self.config.record_program:
            return None  # lockstep: peers mirror the real rank
        path = os.environ.get(MESSAGES_ENV)
        book = slice_book(path)

        def sent(message: PeerMessage) -> None:
            self._emit({"kind": "message", "message": message.to_list()})
            if path is not None:  # (the first slice cannot tell its own class yet)
                book.add(book.class_of(self.config.rank), message)

        return Messages(book, sent, self._message_missing)

    def _message_missing(self, missing: MissingMessage, family: str):
        """A profiled slice needs what a class not yet profiled sends: it ends
        here, and profiling runs it again once that class has run."""
        assert self.runtime.recorder is not None  # (only a profiled slice misses one)
        self._emit({"kind": "message_missing", "missing": missing.to_dict(),
                    "family": family, "families": self._families(),
                    "program": self.runtime.recorder.end(self.clock.now())})
        self._events.flush()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(NEEDS_MESSAGES_EXIT)

    # -- faults ------------------------------------------------------------------------

    def resolve(self, fault: Fault) -> Injection:
        """Whom ``fault`` hits in this rank's world and graph (:class:`ConfigError` if
        nobody can be: a rank outside the world, a family the graph lacks)."""
        if self.graph_engine is None:
            raise ConfigError("faults act on virtual peers replayed from a graph: run without "
                              "--lockstep (the job's graph is profiled and cached) or with "
                              "--graph")
        config = self.config
        return resolve(fault, config.world_size, config.gpus_per_node, self.graph_engine.graph)

    def inject(self, fault: Fault, text: str | None = None,
               injection: Injection | None = None) -> None:
        """Put ``fault`` in force (on the main thread, or while it is paused);
        ``text`` is how it was written, for ``perturb list``."""
        injection = injection or self.resolve(fault)
        assert self.graph_engine is not None  # (resolve refuses faults without one)
        handle = apply_fault(self.graph_engine.replay, injection)
        self.faults.append(InForce(text or fault_text(fault), injection, handle))
        self.runtime.peer_faults.set(self.faults_in_force())

    def withdraw(self, entries: list[InForce] | None = None) -> list[str]:
        """Take back ``entries`` (of :attr:`faults`, chosen when asked), or every
        fault; how those still in force were written.  By identity, and
        idempotent: a clear asked twice before the boundary takes one back once."""
        chosen = [e for e in (self.faults if entries is None else entries)
                  if any(e is f for f in self.faults)]
        for entry in chosen:
            if entry.handle is not None:
                assert self.graph_engine is not None  # (a handle is the graph engine's)
                self.graph_engine.replay.remove(entry.handle)
        self.faults = [e for e in self.faults if not any(e is taken for taken in chosen)]
        self.runtime.peer_faults.set(self.faults_in_force())
        return [entry.text for entry in chosen]

    def faults_in_force(self) -> list[Injection]:
        return [entry.injection for entry in self.faults]

    def _inject_all(self, dicts) -> int:
        """Put the faults the controller sent (their dict forms) in force; how
        many.  One it cannot take (a family the graph lacks) ends the rank with
        that one error, which the controller reports."""
        for data in dicts:
            try:
                self.inject(fault_from_dict(data))
            except PrismError as exc:
                self._fatal(exc)
        return len(dicts)

    def _dump_flight_record(self, op) -> str | None:
        """The watchdog's flight-record dump: the real rank's and its group's peers'."""
        flight = self.runtime.flight
        if flight is None:
            return None
        written = flight.dump(op.pg_id, op.seq, self.faults_in_force())
        if written is None:
            return None
        path, absent = written
        folder = path.parent
        flag = " --allow-incomplete-ranks" if absent else ""
        print(f"prism-debug: flight record of the timed-out group written to {path} (virtual "
              f"peers' beside it in {folder / 'peers'}"
              + (f"; no dump from fail-stopped ranks {absent}" if absent else "")
              + f"); analyse: python -m torch.distributed.flight_recorder.fr_trace {folder}"
              f"{flag}", file=sys.stderr, flush=True)
        self._emit({"kind": "flight_record", "path": str(path), "dir": str(folder),
                    "prefix": path.name.removesuffix(str(self.config.rank)),
                    "absent": absent})
        self._events.flush()
        return str(path)

    def _first_nonfinite(self, iteration: int) -> None:
        self._emit({"kind": "nonfinite", "iteration": iteration})

    def _watchdog_fired(self, message: str) -> None:
        """The watchdog takes the process down: what the report needs first."""
        self._emit({"kind": "watchdog", "iteration": self.tracker.iteration,
                    "message": message})
        self._events.flush()

    def _fatal(self, error: Exception) -> None:
        """End the rank at once with one error the controller reports."""
        self._emit({"kind": "error", "message": str(error)})
        self._events.flush()
        os._exit(2)

    def _families(self) -> list[dict]:
        return [f.to_dict() for f in self.families.summaries()]

    # -- iterations ------------------------------------------------------------------

    def mark_iteration(self) -> None:
        """``prism_debug.iteration()``: the script ends an iteration itself."""
        self._maybe_stop()
        self.marker_mode = True
        self._boundary()

    def _before_step(self, optimizer, args, kwargs) -> None:
        self._maybe_stop()
        if self.runtime.recorder is not None and self.initialised:
            self.runtime.recorder.step(self.clock.now())

    def _after_step(self, optimizer, args, kwargs) -> None:
        if self.marker_mode or not self.initialised:
            return
        # Several optimizers may step per iteration (one per model part); the
        # first one ever seen to step marks the iteration.
        if self._lead_optimizer is None:
            self._lead_optimizer = id(optimizer)
        if id(optimizer) == self._lead_optimizer:
            self._boundary()

    def _boundary(self) -> None:
        if not self.initialised:
            return
        # the clock holds still for the bookkeeping (and any pause or snapshot
        # here): no thread sees it run ahead
        hold, t0 = self.clock.enter()
        extra: dict[str, object] = {"peak_rss_bytes": _peak_rss()}
        if self.runtime.recorder is not None:
            extra["program"] = self.runtime.recorder.end(t0)
        if self.families.version != self._families_version:
            self._families_version = self.families.version
            extra["families"] = self._families()
        if self.graph_engine is not None:
            extra.update(self._graph_extras(self.graph_engine))
        record = self.tracker.boundary(t0, extra)
        if self.graph_engine is not None:
            self.graph_engine.iteration_end()
            self.runtime.completer.engine_advanced()
            while self.faults_due:  # the engine is the main thread's
                self.faults_due.pop(0)()
        iteration = record["iteration"]
        agreed = self._agreed_changes(iteration)
        debugger = self.debugger
        if debugger is not None:
            self._publish("iteration.end", {k: record[k] for k in _ITERATION_FIELDS})
        # (a console's request may have been read just as the iteration ended)
        asked = debugger is not None and any(k <= iteration for k in self._snapshots_asked)
        asked = asked or any(change.kind == "snapshot" for change in agreed)
        if self.config.snapshot_due(iteration) or asked:
            self.stop_for_snapshot(iteration)
        elif self.config.history:
            self.stop_for_snapshot(iteration, history=True)
        if debugger is not None:
            self._publish("iteration.start", {"iteration": iteration + 1,
                                              "time_s": self.clock.now()})
            debugger.at_iteration_start(iteration + 1)
        self.clock.leave(hold)  # the bookkeeping is not the job's time
        limit = self.config.iterations
        if limit is not None and iteration >= limit:
            self._stop_pending = True
            self.runtime.stop_requested = True

    def _agreed_changes(self, iteration: int) -> list[Change]:
        """What every real rank does at the end of ``iteration``, agreed by the
        controller (waited for while it is being agreed): changes to the
        virtual peers made here, by every replica at once; the snapshots
        returned, for the caller to take."""
        changes = self.agreed.at_boundary(iteration)
        for change in changes:
            if change.apply is None:
                continue
            if self.several is not None:
                self.several.agree(iteration, change.apply)
            else:
                change.apply()
        return changes

    def ask_snapshot(self, iteration: int) -> None:
        """Snapshot the rank at the end of ``iteration``: the console's
        ``snapshot`` while the rank runs (so with a bus only); the main thread
        stops for it at that boundary."""
        self._snapshots_asked.add(iteration)

    def stop_for_snapshot(self, iteration: int, history: bool = False) -> None:
        """Wait at a consistent point while the controller dumps the rank: the
        boundary that ended ``iteration``, on the main thread (or run for it by
        the debugger while it is paused there).

        At an iteration boundary nothing is in flight; the event log is
        flushed (and append-only, as CRIU needs files that grow after a dump).
        The rank announces the snapshot and idles while CRIU dumps it, until
        the controller says go (``handshake`` has the rules) — the original,
        and every copy restored from the images later.  The time spent here is
        the harness's (the caller excludes it from the clock).  ``history``:
        only the --history ring asked for it (the controller may prune it).
        """
        cuda = self._quiesce(iteration)
        control = self._announce_and_wait(iteration, cuda, history)
        if control is not None:
            self._apply_restore(iteration, control)
        self._resume(iteration, control)

    def _quiesce(self, iteration: int) -> bool:
        """Nothing in flight that a dump would cut in half: the GPU's queue, the
        bus link's TCP connection, the exchange with the other real ranks
        (this rank's part of a consistent cut).  Whether CUDA is in use."""
        cuda = torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        if self.link is not None:
            self.link.stop()
        if self.several is not None:
            self.several.cut(iteration)
        return cuda

    def _announce_and_wait(self, iteration: int, cuda: bool,
                           history: bool) -> RestoreControl | None:
        """Announce the snapshot, its event log flushed, and idle until the
        controller lets this process go: None for the original, a restore's
        instructions for a copy that wakes up here."""

        def announce(fields: dict) -> None:
            self._emit({"kind": "snapshot", "iteration": iteration, "pid": os.getpid(),
                        "cuda": cuda, "history": history, "sources": self.sources.scan(),
                        **fields})
            self._events.flush()
        return self.handshake.wait(iteration, announce)

    def _apply_restore(self, iteration: int, control: RestoreControl) -> None:
        """A restored copy takes its new run's instructions before it goes on:
        faults a scenario starts from this snapshot with (beside any the
        snapshot's run had in force already), the user's fixed code, its
        limits and its bus."""
        added = self._inject_all(control.faults)
        if control.reload is not None:  # the user's fixed code, before it goes on
            reloaded = apply_reload(control.reload, self.sources)
            self._emit(reloaded)
            if reloaded["refused"]:
                self._fatal(PrismError("reload refused: " + "; ".join(reloaded["refused"])))
        self._emit({"kind": "resumed", "iteration": iteration, "pid": os.getpid(),
                    "backend": self._backend, "rank": self.config.rank,
                    "world_size": self.config.world_size, "snapshot": control.snapshot,
                    "families": self._families(), "faults_added": added,
                    "variability": self.config.variability, "time_s": self.clock.now()})
        self.config = dataclasses.replace(
            self.config, iterations=control.iterations, record_ops=control.record_ops,
            # (the original run's snapshot iterations are not the copy's)
            snapshot_at=(), snapshot_every=None,
            history=control.history, bus=control.bus, bus_curve=control.bus_curve,
            bus_secret=control.bus_secret)
        self.tracker.record_ops = self.config.record_ops
        if control.watch_nonfinite:
            self.runtime.on_nonfinite = self._first_nonfinite

    def _resume(self, iteration: int, control: RestoreControl | None) -> None:
        """Go on: the exchange with the other real ranks again (for a copy, on
        its restoring controller's store), and the bus link."""
        if self.several is not None:
            self.several.after_cut(iteration, control)
        if control is not None:
            self._resume_link_restored(control)
        elif self.link is not None:
            self._snapshots_asked = {k for k in self._snapshots_asked if k > iteration}
            self.link.start()

    def _resume_link_restored(self, control: RestoreControl) -> None:
        """A restored copy: talk to the controller that restored it (even if
        the original ran without a bus), and keep the debugger's state only
        when that controller's user asked for it (restore from the console); a
        restore without one must not stop at breakpoints nobody will continue
        from."""
        if self.config.bus is None:
            if self.debugger is not None:
                self.debugger.release()
            self.link = None
            return
        if self.link is None:
            self._open_bus(self.config.bus)
        link, debugger = self.link, self.debugger
        assert link is not None and debugger is not None  # (_open_bus makes both)
        self._snapshots_asked = set()
        # the debugger's state first: the controller answers the restore (and
        # the next command arrives) as soon as the link says hello
        if control.pause:
            debugger.pause_again("restore")
        else:
            debugger.release()
        link.endpoint = self.config.bus
        link.curve = self.config.bus_curve
        link.secret = self.config.bus_secret  # the restoring controller's session
        link.start()

    def _graph_extras(self, engine: GraphEngine) -> dict:
        """Who the rank waited for longest this iteration, and the traced
        virtual ranks' ops."""
        extras: dict = {}
        longest, self.runtime.longest_wait = self.runtime.longest_wait, None
        if longest is not None:
            waited, deferred = longest
            last = engine.last_arrival(deferred)
            if last is not None:
                spec = engine.op_of(deferred)
                extras["last_arrival"] = {"rank": last[0], "op": spec.kind,
                                          "family": spec.family, "wait_s": waited}
        timeline = self.several.timeline if self.several is not None else None
        if timeline is not None and self.tracker.iteration > 1:
            extras["real_ops"] = timeline.real_ops(self.tracker.iteration - 1)
        if self.config.trace_ranks:
            replay = engine.replay
            iteration = self.tracker.iteration
            extras["virtual_ops"] = [
                [rank, spec.kind, spec.family, arrival, done]
                for rank in self.config.trace_ranks
                for spec, arrival, done in replay.ops_of(rank, iteration)]
            replay.forget_records(iteration + 1)
        return extras

    def _maybe_stop(self) -> None:
        """Stop cleanly once ``--iterations`` are done, at the first point where
        raising SystemExit reaches the script's own frames: the main thread,
        outside autograd (a collective issued from a backward hook defers)."""
        if not self._stop_pending:
            return
        if threading.current_thread() is not threading.main_thread():
            return
        if torch._C._current_autograd_node() is not None:
            return
        self._stop_pending = False
        self._emit({"kind": "stop", "iterations": self.tracker.iteration - 1})
        raise SystemExit(0)


# collective events a rank sends at most a second (enter/exit pairs); the
# environment variable lifts it (tools/bench_bus.py measures the bus unsampled)
COLL_EVENTS_PER_S = float(os.environ.get("PRISM_DEBUG_COLL_EVENTS_PER_S", 2000))
_ITERATION_FIELDS = ("iteration", "start_s", "time_s", "compute_s", "comm_wait_s",
                     "num_collectives", "digest")


@dataclasses.dataclass(eq=False)
class InForce:
    """A fault in force on this rank: as written, whom it hits, and the replay
    engine's handle for it (None for a fault that changes values only)."""

    text: str
    injection: Injection
    handle: object | None


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bootstrap() -> None:
    """Called once torch has been imported in a process started by prism-debug."""
    if _active is not None:
        return
    try:
        config = AgentConfig.from_environment()
    except (OSError, ValueError, TypeError) as exc:
        # Running on without the agent would make the script attempt a real
        # rendezvous with thousands of ranks and hang; stop with the reason.
        sys.exit(f"prism-debug: error: cannot load the agent configuration "
                 f"${ENV_VAR}={os.environ.get(ENV_VAR)}: {exc}")
    if config is not None:
        Agent(claim_bus(config)).install()
