"""What a session of several real ranks does with snapshots: cuts.  The
session (``controller/session.py``) has one server, an agent per rank;
``prism-debug attach --rank R`` drives rank R, the others run on.  A rank
paused by its console holds the others back only as the job would: they
wait, their clocks held, at their next op that needs its arrival.

What must be the same on every replica is agreed with every rank first
(agent/agreed.py): a console's ``snapshot`` is a consistent cut of every
real rank at the next boundary they all reach, and ``perturb`` (and its
``clear``) changes every replica's virtual peers at one boundary.  A
console's ``restore CUT`` replaces every rank by its part of a cut of this
run (checked off the loop, then done by the controller's loop:
controller/replace.py), the console's own rank paused where the cut was
taken; the copies' cuts are named for a timeline of their own.  Under
``--history K`` each rank's parts of the last K iterations' cuts are kept
(its ring), and ``back`` / ``reverse-continue`` restore every rank from the
nearest earlier cut, the console's rank run on to its stop.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable

from prism_debug.bus.server import BusServer, Deferred, Pending, result_of
from prism_debug.capture.history import Plan
from prism_debug.capture.ring import Ring
from prism_debug.capture.snapshots import check_unchanged, restore_tools
from prism_debug.controller.replace import RestoreDue
from prism_debug.controller.session import (
    Message,
    Session,
    listed,
    off_the_loop,
    plan_step_back,
    run_to_stop,
)
from prism_debug.errors import (
    InvalidState,
    PrismError,
    RankUnavailable,
    SnapshotError,
    SnapshotFailed,
)
from prism_debug.graph.selectors import ranks_text
from prism_debug.process.children import RestoredChild
from prism_debug.snapshot.criu import Criu, tree_pids
from prism_debug.snapshot.manifest import Manifest, cut_id, cut_prefix
from prism_debug.snapshot.store import Store


class CutVerbs:
    """A session of several ranks' cuts, perturbations and restores
    (session.Verbs); ``store``: where the run's cuts go (None: a restored
    cut's copies, which take none)."""

    def __init__(self, session: Session, store: Store | None) -> None:
        self._session = session
        self.server = session.server
        self.ranks = session.ranks
        self.store = store
        self._announced: set[str] = set()  # the cuts told to the consoles
        self._parts: dict[str, Manifest | None] = {}  # the ranks' parts of them, by id
        # a console's restore: who asked, the checks running off the loop, its rank
        self._checking: tuple[Pending, concurrent.futures.Future, int] | None = None
        server = self.server
        server.handle("snapshots", self._snapshots_listed)
        server.handle("snapshot", self._snapshot)
        server.handle("perturb", self._perturb)
        server.handle("unperturb", self._unperturb)
        server.handle("restore", self._restore)
        server.handle("back", lambda client, args: self._step_back(
            client, args.get("iterations", 1)))
        server.handle("reverse-continue", lambda client, args: self._step_back(client, None))
        # restores that step back: where the console's rank stops, and its breakpoints
        self._plans: dict[Pending, tuple[Plan, list]] = {}
        # restores stepping back whose copies run, answered once the console's
        # rank's copy is back on the bus and has run to its stop: (who, the reply, rank)
        self._replays: list[tuple[Pending, dict, int]] = []

    @property
    def cut_run(self) -> str | None:
        """The part of the cut ids naming this run, once known."""
        return self._session.cut_run

    @property
    def _snapshots(self) -> dict:
        return self._session.rank_snapshots

    # -- the controller's loop ---------------------------------------------------------

    def poll(self) -> None:
        self._announce_cuts()

    @property
    def restoring(self) -> bool:
        return self._checking is not None

    def snapshotting(self, rank: int) -> bool:
        return False  # (a rank's part of a cut is dumped on a thread of its own)

    def take_snapshot(self, rank: int, event: dict) -> None:
        snapshots = self._snapshots.get(rank)
        if snapshots is None:  # (a restored cut's copies are asked for none)
            raise InvalidState(f"rank {rank} asked for a snapshot nobody asked of it")
        child = self._session.children.get(rank)
        assert child is not None  # the rank announcing the snapshot is the one followed
        snapshots.take(child.pid, event)

    def exited(self, rank: int, exit_code: int) -> None:
        """A step back whose copy of ``rank`` ended before it was back fails
        (the rank's part of each cut is recorded by its own snapshots)."""
        for pending, _, _ in [replay for replay in self._replays if replay[2] == rank]:
            self._plans.pop(pending, None)
            self.server.fail(pending, RankUnavailable(
                f"the restored rank {rank} exited (code {exit_code}) before it reconnected"))
        self._replays = [replay for replay in self._replays if replay[2] != rank]

    def rank_back(self, rank: int) -> None:
        """A copy of ``rank`` is back: a step back its console asked runs on."""
        due = [replay for replay in self._replays if replay[2] == rank]
        self._replays = [replay for replay in self._replays if replay[2] != rank]
        for pending, restored, bound in due:
            plan, breakpoints = self._plans.pop(pending)
            run_to_stop(self.server, pending, restored, plan, breakpoints, bound)

    def rank_paused(self, rank: int, where: dict) -> None:
        if (ring := self._ring(rank)) is not None:
            ring.hit(where)

    def _ring(self, rank: int) -> Ring | None:
        """``rank``'s ``--history`` ring (its parts of the last K cuts), if any."""
        snapshots = self._snapshots.get(rank)
        return snapshots.ring if snapshots is not None else None

    def close(self) -> None:
        pass  # (each rank's snapshots are closed by the run: controller/ranks.py)

    @property
    def snapshots_taken(self) -> list[str]:
        return []  # (a run's cuts are its ranks' snapshots': controller/ranks.py)

    # -- what every rank does at one boundary -----------------------------------------

    def _snapshot(self, client: bytes, args: dict) -> dict:
        """A cut of every real rank at the next boundary they all reach,
        announced (``snapshot`` event) once every rank's part is recorded."""
        cut_run = self.cut_run
        if cut_run is None or len(self._snapshots) < len(self.ranks):
            raise InvalidState("snapshot: a restored cut's copies take no snapshots (restore "
                               "the cut again to go back to it)")

        def scheduled(boundary: int, answers: dict[int, dict]) -> dict:
            return {"iteration": boundary, "when": "scheduled",
                    "cut": cut_id(cut_run, boundary), "ranks": list(self.ranks),
                    "state": answers[self.server.client_rank(client)].get("state")}
        return self._agreed(client, "snapshot", {"change": "snapshot"}, scheduled)

    def _perturb(self, client: bytes, args: dict) -> dict:
        text = args.get("text") or "the perturbation"

        def applied(boundary: int, answers: dict[int, dict]) -> dict:
            return {"perturbation": text, "cleared": False, "when": self._when(boundary)}
        return self._agreed(client, "perturb", {"change": "perturb", **args}, applied)

    def _unperturb(self, client: bytes, args: dict) -> dict:
        index = args.get("index")
        what = "every perturbation" if index is None else f"perturbation {index}"

        def cleared(boundary: int, answers: dict[int, dict]) -> dict:
            return {"perturbation": what, "cleared": True, "when": self._when(boundary)}
        return self._agreed(client, "perturb clear", {"change": "unperturb", **args}, cleared)

    def _when(self, boundary: int) -> str:
        return f"at the end of iteration {boundary} on every real rank ({ranks_text(self.ranks)})"

    def _agreed(self, client: bytes, verb: str, change: dict,
                answer: Callable[[int, dict[int, dict]], dict]) -> dict:
        """``change`` made by every rank at one boundary (agent/agreed.py):
        each names the boundary it reaches next and holds there; the latest of
        them is the one; the client is answered with ``answer(boundary, each
        rank's answer)`` once every rank has agreed."""
        self._every_rank_here(verb)
        raise Deferred(lambda pending: Agreement(self.server, self.ranks, pending, change,
                                                  answer).start())

    def _every_rank_here(self, verb: str) -> None:
        """Refuse ``verb`` unless every real rank is on the bus (each takes part)."""
        away = [rank for rank in self.ranks if not self.server.agents[rank].connected]
        if away:
            which = "rank" if len(away) == 1 else "ranks"
            raise InvalidState(f"{verb}: every real rank takes part, and {which} "
                               f"{ranks_text(away)} {'is' if len(away) == 1 else 'are'} off "
                               "the bus (starting, in a snapshot, or exited): ask again once "
                               "status shows every rank running")

    # -- a console's restore of a cut -------------------------------------------------

    def _restore(self, client: bytes, args: dict) -> dict:
        """Every real rank replaced by its part of cut ``id`` (checked off the
        loop first; the loop restores, :meth:`take_restore`); answered once
        every copy runs, the asking console's rank paused where it was cut."""
        if self.store is None or self.cut_run is None:
            raise InvalidState("restore: a restored cut is restored again as a run of its own "
                               "(prism-debug snapshot restore CUT)")
        if self._session.node is not None:
            raise InvalidState("restore: a cut of ranks on several hosts is restored as a run "
                               "of its own (prism-debug snapshot restore CUT, its parts copied "
                               "to one store)")
        if self._checking is not None or self._replays:
            raise InvalidState("a restore is under way: wait for its answer")
        bound = self.server.client_rank(client)
        raise Deferred(lambda pending: self._check_restore(pending, args["id"], bound))

    def _check_restore(self, pending: Pending, cut: str, bound: int) -> None:
        self._checking = (pending, off_the_loop(lambda: self._restorable(cut)), bound)

    def _restorable(self, cut: str) -> tuple[list[Manifest], Criu, set[int]]:
        """Every part of ``cut`` verified (its images' checksums), of this
        session's ranks, from unchanged code; and the CRIU to restore with."""
        assert self.store is not None  # (_restore refuses a session without one)
        members = [self.store.verify(m.id) for m in self.store.cut(cut)]
        ranks = tuple(m.rank for m in members)
        if ranks != self.ranks:
            raise SnapshotError(f"cut {cut} is of ranks {ranks_text(ranks)}; this session runs "
                                f"ranks {ranks_text(self.ranks)}: prism-debug snapshot restore "
                                f"{cut} restores it as a run of its own")
        for manifest in members:
            check_unchanged(manifest, self.store)
        needed = {pid for m in members for pid in tree_pids(self.store.path(m.id))}
        return members, restore_tools(members[0]), needed

    def take_restore(self) -> RestoreDue | None:
        """For the controller's loop: a console's restore whose checks passed
        (one that failed is answered here; the ranks run on as they were)."""
        if self._checking is None or not self._checking[1].done():
            return None
        pending, checks, bound = self._checking
        self._checking = None
        try:
            members, criu, needed = checks.result()
        except Exception as exc:  # (a bug in the checks must not end the session either)
            self._plans.pop(pending, None)
            self.server.fail(pending, SnapshotFailed(f"{exc}; the ranks run on as they were"))
            return None
        return RestoreDue(pending, tuple(members), criu, bound, frozenset(needed),
                          history=self._ring(bound) is not None)

    def replacing(self, due: RestoreDue) -> None:
        for rank in self.ranks:
            self.server.agent_gone(rank)
            self.server.agent_away(rank)

    def restored(self, due: RestoreDue, copies: dict[int, RestoredChild]) -> None:
        first = due.members[0]
        plan = self._plans.get(due.pending, (None, None))[0]
        for manifest in due.members:  # every rank's ring: its timeline cut where it was restored
            if (ring := self._ring(manifest.rank)) is not None:
                ring.restored(manifest, plan.target if plan is not None else None)
        pids = {rank: copy.pid for rank, copy in copies.items()}
        result = {"id": first.cut, "iteration": first.iteration, "pid": pids[due.bound],
                  "ranks": list(self.ranks), "pids": {str(r): pid for r, pid in pids.items()}}
        if plan is None:
            self.server.reply(due.pending, result)
        else:  # answered once the console's rank has run to where it stops
            self._replays.append((due.pending, result, due.bound))
        for rank in self.ranks:
            self.server.publish("restored", {"id": first.cut}, rank)

    def restore_failed(self, due: RestoreDue, error: Exception, *, kept: bool) -> None:
        self._plans.pop(due.pending, None)
        if kept:
            self.server.fail(due.pending, SnapshotFailed(
                f"{error}; the ranks run on as they were"))
        else:
            self.server.fail(due.pending, SnapshotFailed(
                f"{error}; every rank had ended first, as the copies need their pids: the "
                "run ends"))

    # -- stepping back (run --history K) -----------------------------------------------

    def _step_back(self, client: bytes, iterations: int | None) -> dict:
        """``back ITERATIONS`` (None: ``reverse-continue``) of the console's
        rank: every rank restored from the nearest earlier cut of the history,
        the console's rank run on to its stop and paused there (the others
        run on as far as it lets them).  Answered once it is there."""
        verb = "back" if iterations is not None else "reverse-continue"
        bound = self.server.client_rank(client)
        ring = self._ring(bound)
        if ring is None:
            raise InvalidState(f"{verb} needs the run's history: run with --history K "
                               "(e.g. prism-debug run --ranks 0-1 --history 8 …) to keep cuts "
                               "of the last K iterations to go back to")
        if self._session.node is not None:
            raise InvalidState(f"{verb}: a cut of ranks on several hosts is restored as a run "
                               "of its own (prism-debug snapshot restore CUT)")
        if self._checking is not None or self._replays:
            raise InvalidState("a restore is under way: wait for its answer")
        self._every_rank_here(verb)
        plan_step_back(self.server, verb, bound, ring, iterations, self._drain,
                       lambda pending, plan, breakpoints: self._go_back(
                           pending, plan, breakpoints, bound))

    def _drain(self) -> None:
        for each in self._snapshots.values():
            each.drain()  # the rings' newest cut may be the nearest

    def _go_back(self, pending: Pending, plan: Plan, breakpoints: list, bound: int) -> None:
        try:
            if self._checking is not None or self._replays:
                raise InvalidState("a restore is under way: wait for its answer")
            assert self.store is not None  # (a session with rings has the run's store)
            cut = self.store.get(plan.snapshot.id).cut
        except PrismError as exc:
            self.server.fail(pending, exc)
            return
        assert cut is not None  # (a rank of several's snapshots are its parts of cuts)
        self._plans[pending] = (plan, breakpoints)
        self._check_restore(pending, cut, bound)

    def _snapshots_listed(self, client: bytes, args: dict) -> dict:
        """Every rank's part of this run's cuts, recorded so far."""
        if self.store is None or self.cut_run is None:
            return {"snapshots": []}
        for each in self._snapshots.values():
            each.wait_recorded()  # those dumped already are listed (a record: ≈0.4 s/GiB)
        prefixes = tuple(cut_prefix(run) for run in self._session.cut_runs)
        return {"snapshots": [listed(m) for m in self.store.list()
                              if (m.cut or "").startswith(prefixes)]}

    def _announce_cuts(self) -> None:
        """Tell every console of each cut once every rank's part is recorded."""
        if self.store is None or len(self._snapshots) < len(self.ranks):
            return
        # (a record in progress is not waited for: the loop serves the bus meanwhile)
        taken = [each.recorded_so_far() for each in self._snapshots.values()]
        if min(map(len, taken)) <= len(self._announced):
            return  # (each snapshot of a rank here is its part of one cut)
        members: dict[str, list[Manifest]] = {}
        for snapshot_id in (i for ids in taken for i in ids):
            if snapshot_id not in self._parts:  # (read once: a manifest never changes)
                try:
                    self._parts[snapshot_id] = self.store.get(snapshot_id)
                except SnapshotError:  # (removed meanwhile: its cut is never whole here)
                    self._parts[snapshot_id] = None
            manifest = self._parts[snapshot_id]
            if manifest is not None and manifest.cut is not None \
                    and manifest.cut not in self._announced:
                members.setdefault(manifest.cut, []).append(manifest)
        for cut, parts in members.items():
            if len(parts) < len(self.ranks):
                continue
            self._announced.add(cut)
            data = {"id": cut, "cut": cut, "iteration": parts[0].iteration,
                    "bytes": sum(m.image_bytes for m in parts),
                    "dump_s": max(m.dump_s for m in parts), "ranks": list(self.ranks)}
            for rank in self.ranks:
                self.server.publish("snapshot", data, rank)


class Agreement:
    """One change agreed with every rank: holds, then the boundary and the
    change, then the client's answer (or the first refusal, every hold let go)."""

    def __init__(self, server: BusServer, ranks: tuple[int, ...], pending: Pending,
                 change: dict, answer: Callable[[int, dict[int, dict]], dict]) -> None:
        self._server = server
        self._ranks = ranks
        self._pending = pending
        self._change = change
        self._answer = answer
        self._held: dict[int, int] = {}
        self._agreed: dict[int, dict] = {}
        self._errors: list[PrismError] = []
        self._boundary = 0

    def start(self) -> None:
        for rank in self._ranks:
            self._ask(rank, "hold_boundary", {}, self._on_held)

    def _ask(self, rank: int, verb: str, args: dict,
             then: Callable[[int, dict | None], None]) -> None:
        def reply(message: dict) -> None:
            try:
                result = result_of(message)
            except PrismError as exc:
                self._errors.append(exc)
                result = None
            then(rank, result)
        try:
            self._server.ask_agent(verb, args, reply, rank=rank)
        except PrismError as exc:  # gone just now, or a table full
            self._errors.append(exc)
            then(rank, None)

    def _on_held(self, rank: int, result: dict | None) -> None:
        if result is not None:
            self._held[rank] = int(result["iteration"])
        if len(self._held) + len(self._errors) < len(self._ranks):
            return
        if self._errors:  # every hold let go, nothing changed anywhere
            for held, boundary in self._held.items():
                self._ask(held, "agree_boundary", {"iteration": boundary, "change": "none"},
                          lambda rank, result: None)
            self._server.fail(self._pending, self._errors[0])
            return
        # no rank is past the latest boundary held: each is held at or before it
        self._boundary = max(self._held.values())
        for each in self._ranks:
            self._ask(each, "agree_boundary", {"iteration": self._boundary, **self._change},
                      self._on_agreed)

    def _on_agreed(self, rank: int, result: dict | None) -> None:
        if result is not None:
            self._agreed[rank] = result
        if len(self._agreed) + len(self._errors) < len(self._ranks):
            return
        if self._errors:
            # (each replica refuses a change as every other does: same world, same graph)
            self._server.fail(self._pending, self._errors[0])
        else:
            self._server.reply(self._pending, self._answer(self._boundary, self._agreed))


def cuts_session(ranks: tuple[int, ...], world_size: int, bind: str,
                 job_ranks: tuple[int, ...], node: tuple[int, int] | None, message: Message,
                 store: Store | None = None) -> Session:
    """The bus of a run of several real ranks (``node``: this host's share of
    a job on several, as node rank and count; ``store``: where its cuts go)."""
    session = Session(ranks=ranks, world_size=world_size, host=bind, message=message,
                      verbs=lambda session: CutVerbs(session, store), job_ranks=job_ranks,
                      node=node)
    message(f"debugger: prism-debug attach --rank R, R one of {ranks_text(ranks)} "
            f"(session {session.info.session})")
    return session
