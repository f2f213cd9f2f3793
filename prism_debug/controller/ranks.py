"""Several real ranks under one controller (``prism-debug run --ranks``).

Each real rank is a process of its own, with its own agent and files
(``RUN/rank-<r>/``: rank.log, events.jsonl, agent.json, report.json), and
the virtual peers around it.  The real ranks meet on a c10d ``TCPStore``
this controller hosts on the loopback interface, under a prefix made of 128
random bits that only the ranks' 0600 config files carry (a TCPStore has no
access control and cannot list its keys): there the agents build the real
gloo communicators of the groups they share (backend/real_comms.py).

The ranks are followed by the controller's one loop (``controller/follow.py``),
which, like torchrun, stops the others once one fails.

Snapshots of several real ranks are consistent cuts: at a ``--snapshot-at``
boundary every rank waits for the others' replicas to match its own, drops
its connections to them (agent/real.py, backend/real_comms.py) and is
dumped by this controller like a rank of its own; each snapshot names its
cut, ``c<run>-it<iteration>``, the same on every host of the run.
``controller/restore.py`` restores all of a cut's ranks together, on a
store of its own, where they connect to each other again and run on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import itertools
import json
import os
import secrets
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path

from prism_debug.capture.ring import Ring
from prism_debug.capture.snapshots import (
    Snapshotter,
)
from prism_debug.controller.cut_verbs import cuts_session
from prism_debug.controller.follow import FollowedRank, follow, labelled
from prism_debug.controller.no_session import NoBus, NoSession, RankSnapshots
from prism_debug.controller.replace import RestoreDue, replace_ranks
from prism_debug.controller.session import Session
from prism_debug.graph import ExecutionGraph
from prism_debug.graph.selectors import ranks_text
from prism_debug.process.children import (
    Child,
    Follower,
    Relay,
    RestoredChild,
    run_files,
)
from prism_debug.process.options import RunOptions, RunResult
from prism_debug.process.paths import make_run_dir
from prism_debug.process.start import (
    BusEnds,
    agent_config,
    check_rank_events,
    finish,
    start_rank,
)
from prism_debug.process.torchrun import WORKER_ONLY, Host
from prism_debug.snapshot.store import Store

Message = Callable[[str], None]

# how long the ranks may take to meet on the store (every rank's start-up
# included: importing torch, the script's own set-up)
MEETING_TIMEOUT = datetime.timedelta(minutes=10)


@contextlib.contextmanager
def side_store(host: Host | None) -> Iterator[dict]:
    """Where the run's real ranks meet, for as long as the run lasts: its
    address and the run's prefix.  On one host, a TCPStore of this
    controller's on the loopback interface, under a secret prefix; on
    several, torchrun's (served by this worker where torchrun left that to
    its first worker)."""
    if host is not None and not host.hosts_store:
        yield host.side_store
        return
    import torch.distributed as dist  # only runs of several real ranks need torch here

    if host is None:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=MEETING_TIMEOUT)
        # (SideStore.to_dict()'s form, as torchrun's Host.side_store)
        where: dict = {"host": "127.0.0.1", "port": store.port,
                       "prefix": f"prism/{secrets.token_hex(16)}/"}
    else:
        where = host.side_store
        store = dist.TCPStore(where["host"], where["port"], is_master=True,
                              wait_for_workers=False, timeout=MEETING_TIMEOUT)
    try:
        yield where
    finally:
        del store


def cut_run_of(prefix: str) -> str:
    """The part of a cut's id that names its run: 8 hex digits of a hash of
    the run's store prefix (the same on every host of the run; the prefix
    itself is a secret)."""
    return hashlib.sha256(prefix.encode()).hexdigest()[:8]


def run_ranks(options: RunOptions, graph: ExecutionGraph | None, run_dir: Path,
              message: Message, store: Store) -> RunResult:
    """Run every rank of ``options.ranks`` to its end; the lowest rank's
    result, with each rank's in ``ranks`` (and the cuts taken, complete on
    this host, in ``snapshots``)."""
    profile = options.profile
    ranks, host = options.ranks, options.host
    which = "rank" if len(ranks) == 1 else "ranks"
    message(f"prism-debug: real {which} {ranks_text(ranks)} of {options.world_size}, a process "
            f"each · hardware {profile.name} · values {options.values} · seed {options.seed}")
    if host is not None:
        message(f"host {host.node_rank} of {host.nnodes} under torchrun: the job's real ranks "
                f"are {ranks_text(host.job_ranks)}")
    message(f"command: {shlex.join(options.command)}")
    session = None if options.bind is None else cuts_session(
        ranks, options.world_size, options.bind, options.real_ranks,
        (host.node_rank, host.nnodes) if host is not None else None, message, store)
    # as torchrun does for several processes on a host, unless the user set it
    extra_env = {} if "OMP_NUM_THREADS" in os.environ or any(
        k == "OMP_NUM_THREADS" for k, _ in options.env) else {"OMP_NUM_THREADS": "1"}

    def start(side: dict) -> Iterator[FollowedRank]:
        cut_run = cut_run_of(side["prefix"])
        if session is not None:
            session.begin_timeline(cut_run)  # (a console's snapshot is a cut of this run too)
        for rank in ranks:
            def snapshotter(rank: int = rank) -> Snapshotter:
                return Snapshotter.for_run(options, store, message, rank=rank, cut_run=cut_run)
            yield _start(options, graph, run_dir, rank, session, side, extra_env, message,
                         snapshotter, store)

    started, exit_code = run_all(start, host, session, message, store)
    result = ranks_results(options.world_size, options.command, options.profile.name,
                      options.report_path, started, exit_code, message)
    for rank, each in started.items():
        check_rank_events(options, rank, result.ranks[rank].events, each.exit_code or 0,
                          each.files["log"])
    return dataclasses.replace(result, snapshots=_cuts(store, started))


def _cuts(store: Store, ranks: dict[int, FollowedRank]) -> list[str]:
    """The cuts every rank here took a snapshot of, in the order taken."""
    taken = {rank: [store.get(i).cut for i in each.taken] for rank, each in ranks.items()}
    first = next(iter(taken.values()), [])
    return [cut for cut in first if cut and all(cut in cuts for cuts in taken.values())]


def run_all(start: Callable[[dict], Iterator[FollowedRank]], host: Host | None,
            session: Session | None, message: Message,
            store: Store | None = None) -> tuple[dict[int, FollowedRank], int]:
    """Start every rank (``start`` is given where they meet) and follow them
    to their ends; the ranks, and the first failure's exit code.  Whatever
    happens, no rank outlives this and every snapshot dumped is recorded.
    ``store``: where a console's restore finds the run's cuts."""
    ranks: dict[int, FollowedRank] = {}
    exit_code = 0
    try:
        with side_store(host) as side:
            restores = itertools.count(1)

            def restore(due: RestoreDue) -> bool:
                assert session is not None and store is not None  # (a restore is a console's)
                where = {**side, "prefix": f"{side['prefix']}restored-{next(restores)}/"}
                if not replace_ranks(ranks, due, session, store, message, where):
                    return False
                # the copies' cuts are of a timeline of their own, named apart
                session.begin_timeline(cut_run_of(where["prefix"]))
                return True
            try:
                for each in start(side):
                    ranks[each.rank] = each
                exit_code = follow(ranks, session or NoBus(), message, restore)
            finally:
                for each in ranks.values():
                    if each.child.poll() is None:
                        each.child.kill()
                    if each.snapshots is not None:
                        each.snapshots.close()  # a snapshot dumped is a snapshot kept
    finally:
        if session is not None:
            session.close()
    return ranks, exit_code


def _start(options: RunOptions, graph: ExecutionGraph | None, run_dir: Path, rank: int,
           session: Session | None, side: dict, extra_env: dict[str, str],
           message: Message, snapshotter: Callable[[], Snapshotter],
           store: Store) -> FollowedRank:
    """Start one real rank: its folder, its agent's config, its process and
    the relay of its output (to the session's bus, if any), which takes its
    snapshots."""
    files = run_files(make_run_dir(run_dir / f"rank-{rank}"))
    ring = Ring(options.history, store, labelled(rank, message)) if options.history else None
    snapshots = RankSnapshots(snapshotter, files, dumper=True, ring=ring)
    relay: Relay
    bus: BusEnds  # the session's ends of the bus (a NoSession has none)
    if session is not None:
        relay, bus = session.relay(rank, snapshots), session
    else:
        relay = bus = NoSession(snapshotter, files, snapshots)
    config_path = files["log"].parent / "agent.json"
    agent_config(options, graph, files, rank, bus, real_ranks=options.real_ranks,
                 side_store=side).write(config_path)  # 0600: the bus's and the store's secrets
    child = Child(start_rank(options, rank, files, config_path, extra_env,
                             drop_env=WORKER_ONLY if options.host else ()))
    return followed(rank, files, child, session, relay, message, snapshots=snapshots)


def followed(rank: int, files: dict[str, Path], child: Child | RestoredChild,
             session: Session | None, relay: Relay, message: Message, *,
             snapshots: RankSnapshots | None = None,
             restored_from: str | None = None) -> FollowedRank:
    """A rank's process, known to the session (or its relay) and followed."""
    if session is not None:
        session.follows(rank, child)
    else:
        assert isinstance(relay, NoSession)  # without a session, a rank's relay is its own
        relay.follows(rank, child)
    follower = Follower(files["log"], files["events"], rank, message, relay,
                        table_prefix=f"[rank {rank}] ")
    return FollowedRank(rank, files, child, follower, snapshots=snapshots,
                        restored_from=restored_from)


def ranks_results(world_size: int, command: list[str], hardware: str, report_path: Path | None,
                  ranks: dict[int, FollowedRank], exit_code: int, message: Message) -> RunResult:
    """Each rank's report (its folder's report.json, and ``report_path`` for
    them all); the lowest rank's result, with each rank's in ``ranks``."""
    results: dict[int, RunResult] = {}
    reports: dict[str, dict] = {}
    for rank, each in ranks.items():
        events, report = finish(each.follower, each.files["events"], each.exit_code or 0,
                                world_size, rank, command, hardware, None, None,
                                labelled(rank, message), restored_from=each.restored_from)
        run_dir = each.files["log"].parent
        (run_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        reports[str(rank)] = report
        taken = each.taken
        results[rank] = RunResult(report, each.exit_code or 0, run_dir, taken, events)
    if report_path:
        report_path.write_text(json.dumps({"ranks": reports}, indent=1) + "\n")
        message(f"report: {report_path}")
    lowest = results[min(results)]
    return RunResult(lowest.report, exit_code, lowest.run_dir.parent, [], lowest.events,
                     ranks=results)
