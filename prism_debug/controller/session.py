"""The controller's debugging session, one type for a run of one real rank
or several: the bus server, the session file that ``prism-debug ps`` and
``attach`` find, the ranks' processes as the loop follows them, and the
verbs every session answers alike — hello, status, detach, leave — each for
the rank its console drives.

What a snapshot is differs, and is the session's *verbs* part: for one rank
a snapshot of it, restored in place and stepped back through under
``--history`` (``controller/rank_verbs.py``); for several a consistent cut of
every rank, with perturbations every rank agrees on
(``controller/cut_verbs.py``).

Everything here runs on the controller's main loop (``controller/follow.py``),
between two looks at the ranks: :meth:`Session.poll` stands in for the
loop's sleep.  A console's restore is checked off the loop, handed to the
loop by :meth:`Session.take_restore` and done there
(``controller/replace.py``: a copy is the child of the thread that restores
it); the session is told how it went and answers its console.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from typing import NoReturn, Protocol, TypeVar

from prism_debug.bus import sessions
from prism_debug.bus.server import BusServer, Deferred, Pending, result_of
from prism_debug.bus.words import describe_pause, how_to_resume
from prism_debug.capture.history import Plan, Position
from prism_debug.capture.ring import Ring
from prism_debug.controller.no_session import RankSnapshots
from prism_debug.controller.replace import RestoreDue
from prism_debug.errors import BusError, InvalidState, PrismError, RankUnavailable
from prism_debug.process.children import RankProcess, Relay, RestoredChild
from prism_debug.snapshot.manifest import Manifest
from prism_debug.snapshot.store import now_text

T = TypeVar("T")
Message = Callable[[str], None]


class Verbs(Protocol):
    """What a session does with snapshots — one rank's, or cuts of several —
    the verbs it registers on the bus, and what the loop tells it."""

    def poll(self) -> None:
        """After the bus was served: what was recorded meanwhile, told."""

    @property
    def restoring(self) -> bool:
        """A console's restore is being checked."""

    def take_restore(self) -> RestoreDue | None:
        """A console's restore whose checks passed, for the loop to do."""

    def replacing(self, due: RestoreDue) -> None:
        """The ranks are gone from the bus: what they owe fails."""

    def restored(self, due: RestoreDue, copies: dict[int, RestoredChild]) -> None:
        """Every copy is up, followed by the session already."""

    def restore_failed(self, due: RestoreDue, error: Exception, *, kept: bool) -> None:
        """No copy runs; ``kept``: the ranks run on as they were."""

    def take_snapshot(self, rank: int, event: dict) -> None:
        """``rank`` idles at a boundary for a snapshot: dump it and let it go."""

    def snapshotting(self, rank: int) -> bool:
        """``rank`` is off the bus for a dump."""

    def exited(self, rank: int, exit_code: int) -> None:
        """``rank`` is gone: what waits for it fails, its snapshots are told."""

    def rank_back(self, rank: int) -> None:
        """``rank``'s agent proved itself on the bus (a restored copy's, too)."""

    def rank_paused(self, rank: int, where: dict) -> None:
        """``rank`` paused (a breakpoint, a step, a console's pause)."""

    def close(self) -> None:
        """The run is over: every snapshot dumped is recorded."""

    @property
    def snapshots_taken(self) -> list[str]:
        """The run's snapshots, in order, once recorded."""


class Session:
    """A run's debugging session on the bus, for its real ranks ``ranks``
    (one, or several: ``job_ranks`` and ``node`` say this host's share of a
    job on several hosts); ``verbs`` makes its snapshot part, given it."""

    def __init__(self, *, ranks: tuple[int, ...], world_size: int, host: str,
                 message: Message, verbs: Callable[[Session], Verbs],
                 job_ranks: tuple[int, ...] | None = None,
                 node: tuple[int, int] | None = None) -> None:
        self.ranks = ranks
        self.rank = ranks[0]  # the rank a console that names none drives
        self.world_size = world_size
        self.node = node
        self.message = message
        self.server = BusServer(ranks, host)
        self.commands_endpoint = self.server.commands
        self.agent_curve = self.server.agent_curve
        self.agent_secret = self.server.secret  # handed to the ranks in 0600 files only
        # each rank's process, set by whoever starts it and swapped by restores:
        # with its descendants, the only process whose agent's hello is believed
        self.children: dict[int, RankProcess] = {}
        self.server.agents.pid_of = lambda rank: (
            self.children[rank].pid if rank in self.children else None)
        self.exit_codes: dict[int, int] = {}
        # a rank of several's part of each cut, as its controller takes it
        self.rank_snapshots: dict[int, RankSnapshots] = {}
        # the part of the cut ids naming each timeline of the run, once known
        # (a console's restore begins one): the newest names its cuts now
        self.cut_runs: list[str] = []
        self._told_pause: dict[int, int] = {}  # the last pause told of, by rank (numbered)
        node_rank, nnodes = node or (None, None)
        self.info = session_info(self.server, world_size, ranks,
                                 all_ranks=job_ranks if node is not None else None,
                                 node_rank=node_rank, nnodes=nnodes)
        self.session_file = sessions.publish(self.info)
        server = self.server
        server.handle("hello", self._hello)
        server.handle("status", lambda client, args: self.ask(client, "status"))
        server.handle("detach", self._detach)
        server.handle("leave", self._leave)
        server.on_rank_agent_hello = lambda rank, pid: self.verbs.rank_back(rank)
        server.on_last_client_gone = self._nobody_left
        server.on_rank_paused_at = self._rank_paused
        self.verbs = verbs(self)  # (it registers its own verbs)

    # -- the loop's side ------------------------------------------------------------

    @property
    def child(self) -> RankProcess | None:
        """The lowest rank's process now (a session of one rank: its rank's)."""
        return self.children.get(self.rank)

    def follows(self, rank: int, child: RankProcess) -> None:
        """``child`` is ``rank``'s process now (started, or restored)."""
        self.children[rank] = child

    def relay(self, rank: int, snapshots: RankSnapshots | None = None) -> Relay:
        """Where ``rank``'s follower sends its output and snapshot requests
        (``snapshots``: a rank of several's part of each cut)."""
        if snapshots is not None:
            self.rank_snapshots[rank] = snapshots
        return _RankSide(self, rank)

    def begin_timeline(self, cut_run: str) -> None:
        """The ranks' cuts from now on are of ``cut_run`` (the run's own, or a
        console's restore's, whose copies' cuts are named apart)."""
        self.cut_runs.append(cut_run)
        for snapshots in self.rank_snapshots.values():
            snapshots.continue_as(cut_run)

    @property
    def cut_run(self) -> str | None:
        """What names the ranks' cuts now (None: a run not of several, or not started)."""
        return self.cut_runs[-1] if self.cut_runs else None

    def exit_code(self, rank: int) -> int | None:
        return self.exit_codes.get(rank)

    def poll(self, timeout_s: float) -> None:
        self.server.poll(timeout_s)
        self.verbs.poll()

    @property
    def restoring(self) -> bool:
        return self.verbs.restoring

    def take_restore(self) -> RestoreDue | None:
        return self.verbs.take_restore()

    def replacing(self, due: RestoreDue) -> None:
        self.verbs.replacing(due)

    def restored(self, due: RestoreDue, copies: dict[int, RestoredChild]) -> None:
        for rank, copy in copies.items():
            self.follows(rank, copy)
            self.exit_codes.pop(rank, None)
        self.verbs.restored(due, copies)

    def restore_failed(self, due: RestoreDue, error: Exception, *, kept: bool) -> None:
        self.verbs.restore_failed(due, error, kept=kept)

    def restore_refused(self, due: RestoreDue, why: str) -> None:
        """A checked restore the loop will not do: the run ends (its plan, if
        any, goes with the session)."""
        self.server.fail(due.pending, RankUnavailable(why))

    def output(self, rank: int, line: str) -> None:
        self.server.publish("output", {"line": line}, rank)

    def exited(self, rank: int, exit_code: int) -> None:
        self.exit_codes[rank] = exit_code
        self.verbs.exited(rank, exit_code)  # its last snapshots answered for, its waiters failed
        self.server.agent_gone(rank)
        self.server.publish("exited", {"exit_code": exit_code}, rank)

    def close(self) -> None:
        self.verbs.close()  # a snapshot dumped is a snapshot kept
        sessions.withdraw(self.info)
        self.server.close()

    @property
    def snapshots_taken(self) -> list[str]:
        """The run's snapshots (not its history's), in order, once recorded."""
        return self.verbs.snapshots_taken

    # -- verbs ------------------------------------------------------------------------

    def _hello(self, client: bytes, args: dict) -> dict:
        rank = self.server.client_rank(client)
        hello = {"session": self.info.session, "rank": rank, "world_size": self.world_size,
                 "pid": self.server.agents[rank].pid or 0, "events": self.server.events,
                 "remote_events": self.server.remote_events}
        return hello if len(self.ranks) == 1 else {**hello, "ranks": list(self.ranks)}

    def ask(self, client: bytes, verb: str,
            then: Callable[[dict], None] = lambda result: None) -> dict:
        """The answer of the rank ``client`` drives to ``verb``, with the
        session's fields (the answer is deferred), or, while that rank is off
        the bus, what the controller knows; ``then`` is told the answer once
        it is sent."""
        server = self.server
        rank = server.client_rank(client)
        extra = {"session": self.info.session, "pid": server.agents[rank].pid or 0,
                 "clients": len(server.clients)}
        if server.agents[rank].connected:
            def answer(pending: Pending) -> None:
                def reply(message: dict) -> None:
                    if (result := answered(server, pending, message)) is None:
                        return
                    result = {**result, **extra}
                    server.reply(pending, result)
                    then(result)
                server.ask_agent(verb, {}, reply, rank=rank)
            raise Deferred(answer)
        code = self.exit_codes.get(rank)
        state = ("exited" if code is not None else
                 "snapshotting" if self.verbs.snapshotting(rank) else "starting")
        result = {"state": state, "rank": rank, "world_size": self.world_size,
                  "iteration": None, "emulated_s": None, "paused_at": None, "breakpoints": 0,
                  "exit_code": code, **extra}
        then(result)
        return result

    def _detach(self, client: bytes, args: dict) -> dict:
        """The client releases its rank (every breakpoint deleted, a pause
        resumed) and leaves.  A rank off the bus for a moment (a snapshot, its
        start) is released when it is back."""
        leave = lambda result: self.server.forget_client(client)  # noqa: E731
        rank = self.server.client_rank(client)
        if self.server.agents[rank].connected or rank in self.exit_codes:
            return self.ask(client, "detach", leave)
        # (gone meanwhile, or a table full: nothing to release)
        with contextlib.suppress(BusError):
            self.server.ask_agent("detach", {}, lambda message: None, rank=rank)
        return self.ask(client, "status", leave)

    def _leave(self, client: bytes, args: dict) -> dict:
        """The client leaves; its rank stays as it is (paused or running, its
        breakpoints kept).  Answered with the rank's state, which the console
        tells its user."""
        return self.ask(client, "status", lambda result: self.server.forget_client(client))

    def _nobody_left(self) -> None:
        """The last client left (or vanished): nothing changes for the ranks —
        a pause holds until somebody attaches and continues, breakpoints stay
        armed — but nobody watches their events any more, and the terminal is
        told of a pause nobody is attached to."""
        for rank in self.ranks:
            if rank in self.exit_codes or not self.server.agents[rank].connected:
                continue
            try:
                self.server.ask_agent("events", {"on": False}, lambda message: None, rank=rank)
                self.server.ask_agent("status", {}, functools.partial(self._left_paused, rank),
                                      rank=rank)
            except BusError:  # gone, or a table full: nobody to tell then
                pass

    def _left_paused(self, rank: int, message: dict) -> None:
        try:
            where = result_of(message).get("paused_at")
        except PrismError:
            return
        if where is not None:
            # nobody was attached when the rank was asked; a console that
            # attached while the answer travelled does not unsay that (its own
            # leaving would ask again, too late if the run ends meanwhile)
            self._paused(rank, where, nobody_attached=True)

    def _rank_paused(self, rank: int, where: dict) -> None:
        self.verbs.rank_paused(rank, where)
        self._paused(rank, where)

    def _paused(self, rank: int, where: dict, *, nobody_attached: bool = False) -> None:
        """``rank`` paused, or is paused as the last client leaves: with nobody
        attached, say so on the controller's terminal (once a pause), or the
        run just looks stuck."""
        number = where.get("number", 0)
        attached = bool(self.server.clients) and not nobody_attached
        if attached or number <= self._told_pause.get(rank, 0):
            return
        self._told_pause[rank] = number
        if where.get("reason") == "start":
            self.message(f"prism-debug: rank {rank} waits at init_process_group for a "
                         f"console (--paused): prism-debug attach --rank {rank}, then "
                         "continue")
        else:
            self.message(f"prism-debug: no console is attached and rank {rank} stays "
                         f"{describe_pause(where)}: {how_to_resume(rank)}")


class _RankSide:
    """One rank's relay's view of the session (children.Relay)."""

    def __init__(self, session: Session, rank: int) -> None:
        self._session = session
        self._rank = rank

    def output(self, line: str) -> None:
        self._session.output(self._rank, line)

    def take_snapshot(self, event: dict) -> None:
        self._session.verbs.take_snapshot(self._rank, event)


def answered(server: BusServer, pending: Pending, message: dict) -> dict | None:
    """An agent's result in ``message``, or None once ``pending`` has been
    failed with the error the message carries."""
    try:
        return result_of(message)
    except PrismError as exc:
        server.fail(pending, exc)
        return None


def plan_step_back(server: BusServer, verb: str, rank: int, ring: Ring,
                   iterations: int | None, recorded: Callable[[], None],
                   go: Callable[[Pending, Plan, list], None]) -> NoReturn:
    """``back ITERATIONS`` (None: ``reverse-continue``) of ``rank``, planned
    from where it is paused (``recorded`` first waits for the ring's dumps:
    the newest may be the nearest); ``go`` restores for it, given who asked,
    the plan and the breakpoints the rank has now (the copy gets those, not
    its snapshot's).  Raises the Deferred that answers the console."""
    def where(pending: Pending) -> None:
        def paused(message: dict) -> None:
            try:
                status = result_of(message)
                if status.get("paused_at") is None:
                    raise InvalidState(f"{verb} goes back from a paused rank: pause it first "
                                       "(pause, or a breakpoint)")
                recorded()
                plan = ring.plan(Position.of(status["paused_at"]), iterations)
            except PrismError as exc:
                server.fail(pending, exc)
                return

            def breaks(message: dict) -> None:
                if (result := answered(server, pending, message)) is not None:
                    go(pending, plan, result["breakpoints"])
            server.ask_agent("breaks", {}, breaks, rank=rank)
        server.ask_agent("status", {}, paused, rank=rank)
    raise Deferred(where)


def run_to_stop(server: BusServer, pending: Pending, restored: dict, plan: Plan,
                breakpoints: list, rank: int) -> None:
    """A step back's copy of ``rank`` is back on the bus, paused where its
    snapshot (or cut) was taken: run it to the plan's stop (passing
    breakpoints, stopping at ``breakpoints``), then answer ``pending``."""
    target = plan.target
    args = {"iteration": target.iteration, "reason": plan.reason, "breakpoints": breakpoints}
    if target.seq:
        args["seq"] = target.seq

    def running(message: dict) -> None:
        if (result := answered(server, pending, message)) is None:
            return
        server.reply(pending, {**restored, **result, "target": target.iteration,
                               "target_seq": target.seq or None, "replayed": plan.replayed,
                               "reason": plan.reason})
    server.ask_agent("run_to", args, running, rank=rank)


def listed(manifest: Manifest) -> dict:
    """A snapshot as the ``snapshots`` verb lists it (a cut's part names its cut)."""
    m = manifest
    row = {"id": m.id, "iteration": m.iteration, "parent": m.parent,
           "image_bytes": m.image_bytes, "created": m.created, "rank": m.rank,
           "world_size": m.world_size, "history": m.history}
    return {**row, "cut": m.cut} if m.cut is not None else row


def off_the_loop(checks: Callable[[], T]) -> concurrent.futures.Future[T]:
    """A restore's ``checks`` run on a thread of their own (every image's
    checksum: seconds for a large rank), so the bus goes on answering; the
    loop looks at the future and answers with its result or its error."""
    future: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(checks())
        except BaseException as exc:  # handed to the loop, which answers with it
            future.set_exception(exc)

    threading.Thread(target=run, name="prism-restore-checks", daemon=True).start()
    return future


def session_info(server: BusServer, world_size: int, ranks: tuple[int, ...], *,
                 all_ranks: tuple[int, ...] | None = None, node_rank: int | None = None,
                 nnodes: int | None = None) -> sessions.SessionInfo:
    """What ``prism-debug ps`` and ``attach`` learn of a session whose bus is
    ``server`` (``all_ranks``, ``node_rank``, ``nnodes``: its share of a job
    on several hosts)."""
    return sessions.SessionInfo(
        session=sessions.new_session_id(), pid=os.getpid(), commands=server.commands,
        events=server.events, world_size=world_size, ranks=ranks, started=now_text(),
        curve_public=server.curve_public, remote_commands=server.remote_commands,
        all_ranks=all_ranks, node_rank=node_rank, nnodes=nnodes)
