"""The debugger bus of a run of several real ranks: one server, an agent
per rank; ``prism-debug attach --rank R`` drives rank R, the others run on.

The verbs a console sends go to the agent of the rank its hello named (the
lowest, if it named none), and it hears that rank's events only.  A rank
paused by its console holds the others back only as the job would: they
wait, their clocks held, at their next op that needs its arrival.

What would set the replicas apart or needs a consistent cut is refused with
one line, before it reaches any rank: a console's ``perturb`` (it would
change one replica's virtual peers and not the others'), and a console's
snapshots and restores (one rank's snapshot is no cut: the run's
``--snapshot-at`` takes cuts, ``prism-debug snapshot restore CUT`` restores
one).  The ranks' parts of the run's cuts are dumped here as they come.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from prism_debug.bus import sessions
from prism_debug.bus.server import BusServer, Deferred, Handler, Pending, result_of
from prism_debug.controller.no_session import RankSnapshots
from prism_debug.controller.session import session_info
from prism_debug.errors import BusError, InvalidState, PrismError
from prism_debug.process.children import RankProcess

NOT_YET = ("{verb}: not yet in a run of several real ranks ({why}); the ranks run on as "
           "they are")
REFUSED = {
    "perturb": "a console's perturbation would reach this rank's replica of the virtual "
               "peers and not the others': give --perturb to the run",
    "unperturb": "the run's perturbations are every replica's",
    "snapshot": "a cut of every real rank is taken at the boundaries the run's "
                "--snapshot-at names",
    "restore": "a cut is restored as a run of its own: prism-debug snapshot restore CUT",
    "back": "stepping back needs snapshots",
    "reverse-continue": "stepping back needs snapshots",
}


class RanksSession:
    def __init__(self, *, ranks: tuple[int, ...], world_size: int, host: str,
                 job_ranks: tuple[int, ...], node: tuple[int, int] | None) -> None:
        self.ranks = ranks
        self.world_size = world_size
        self.server = BusServer(ranks, host)
        self.commands_endpoint = self.server.commands
        self.agent_curve = self.server.agent_curve
        self.agent_secret = self.server.secret  # handed to the ranks in 0600 files only
        self.children: dict[int, RankProcess] = {}
        self.server.agents.pid_of = lambda rank: (
            self.children[rank].pid if rank in self.children else None)
        self.exit_codes: dict[int, int] = {}
        node_rank, nnodes = node or (None, None)
        self.info = session_info(self.server, world_size, ranks,
                                 all_ranks=job_ranks if node is not None else None,
                                 node_rank=node_rank, nnodes=nnodes)
        self.session_file = sessions.publish(self.info)
        server = self.server
        server.handle("hello", self._hello)
        server.handle("status", lambda client, args: self._ask(client, "status"))
        server.handle("detach", self._detach)
        server.handle("leave", self._leave)
        server.handle("snapshots", lambda client, args: {"snapshots": []})
        for verb, why in REFUSED.items():
            server.handle(verb, _refuse(verb, why))
        server.on_last_client_gone = self._nobody_left

    # -- the controller's loop ---------------------------------------------------------

    def poll(self, timeout_s: float) -> None:
        self.server.poll(timeout_s)

    def output(self, rank: int, line: str) -> None:
        self.server.publish("output", {"line": line}, rank)

    def exited(self, rank: int, exit_code: int) -> None:
        self.exit_codes[rank] = exit_code
        self.server.agent_gone(rank)
        self.server.publish("exited", {"exit_code": exit_code}, rank)

    def close(self) -> None:
        sessions.withdraw(self.info)
        self.server.close()

    def follower_side(self, rank: int, snapshots: RankSnapshots | None) -> _RankSide:
        """What a rank's output relay tells the session (children.RunSession);
        ``snapshots`` takes the rank's part of each cut (None: a run that
        takes none)."""
        return _RankSide(self, rank, snapshots)

    # -- verbs ---------------------------------------------------------------------------

    def _hello(self, client: bytes, args: dict) -> dict:
        rank = self.server.client_rank(client)
        return {"session": self.info.session, "rank": rank, "world_size": self.world_size,
                "pid": self.server.agents[rank].pid or 0, "events": self.server.events,
                "remote_events": self.server.remote_events, "ranks": list(self.ranks)}

    def _ask(self, client: bytes, verb: str,
             then: Callable[[dict], None] = lambda result: None) -> dict:
        """The bound rank's answer to ``verb`` with the session's fields, or
        what the controller knows while that rank is off the bus."""
        server = self.server
        rank = server.client_rank(client)
        extra = {"session": self.info.session, "pid": server.agents[rank].pid or 0,
                 "clients": len(server.clients)}
        if server.agents[rank].connected:
            def answer(pending: Pending) -> None:
                def reply(message: dict) -> None:
                    try:
                        result = {**result_of(message), **extra}
                    except PrismError as exc:
                        server.fail(pending, exc)
                        return
                    server.reply(pending, result)
                    then(result)
                server.ask_agent(verb, {}, reply, rank=rank)
            raise Deferred(answer)
        code = self.exit_codes.get(rank)
        result = {"state": "starting" if code is None else "exited", "rank": rank,
                  "world_size": self.world_size, "iteration": None, "emulated_s": None,
                  "paused_at": None, "breakpoints": 0, "exit_code": code, **extra}
        then(result)
        return result

    def _detach(self, client: bytes, args: dict) -> dict:
        """The client releases its rank (breakpoints deleted, a pause resumed) and leaves."""
        return self._ask(client, "detach", lambda result: self.server.forget_client(client))

    def _leave(self, client: bytes, args: dict) -> dict:
        return self._ask(client, "status", lambda result: self.server.forget_client(client))

    def _nobody_left(self) -> None:
        """Nobody watches any rank's events any more: stop publishing them."""
        for rank in self.ranks:
            if self.server.agents[rank].connected:
                # (gone meanwhile, or a table full: nothing to turn off)
                with contextlib.suppress(BusError):
                    self.server.ask_agent("events", {"on": False}, lambda message: None,
                                          rank=rank)


def _refuse(verb: str, why: str) -> Handler:
    def refuse(client: bytes, args: dict) -> dict:
        raise InvalidState(NOT_YET.format(verb=verb, why=why))
    return refuse


class _RankSide:
    """One rank's relay's view of the session."""

    restoring = False

    def __init__(self, session: RanksSession, rank: int,
                 snapshots: RankSnapshots | None) -> None:
        self._session = session
        self._rank = rank
        self._snapshots = snapshots

    @property
    def child(self) -> RankProcess | None:
        return self._session.children.get(self._rank)

    def output(self, line: str) -> None:
        self._session.output(self._rank, line)

    def take_snapshot(self, event: dict) -> None:
        if self._snapshots is None:  # (a restored cut's copies are asked for none)
            raise InvalidState(f"rank {self._rank} asked for a snapshot nobody asked of it")
        child = self.child
        assert child is not None  # the rank announcing the snapshot is the one followed
        self._snapshots.take(child.pid, event)

    def poll(self, timeout_s: float) -> None:
        self._session.poll(timeout_s)

    def exited(self, exit_code: int) -> None:
        self._session.exited(self._rank, exit_code)
