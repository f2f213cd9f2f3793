"""A new run from a snapshot, continued to its end with a bus of its own (so a
restored rank can be attached to as well): one rank's snapshot, or every
rank's part of a cut of several real ranks, which meet each other again on
a store of this controller's.

Either way the snapshots are checked first (their images' checksums, the
code they ran, the faults asked for), each copy is restored by
:func:`restored_copy` and followed by the controller's one loop
(``controller/follow.py``), and a copy that refuses what it was told says
why in one error.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from prism_debug.capture.snapshots import (
    Snapshotter,
    check_unchanged,
    restore_process,
    restore_tools,
)
from prism_debug.controller.cut_verbs import cuts_session
from prism_debug.controller.follow import FollowedRank, labelled
from prism_debug.controller.launch import follow_rank
from prism_debug.controller.no_session import NoSession
from prism_debug.controller.rank_verbs import open_rank_session
from prism_debug.controller.ranks import followed, ranks_results, run_all
from prism_debug.errors import ConfigError, InvalidState, SnapshotError
from prism_debug.graph.selectors import ranks_text
from prism_debug.process.children import Relay, RestoredChild, run_files
from prism_debug.process.options import RestoreOptions, RunResult
from prism_debug.process.paths import default_run_dir, make_run_dir, open_store, private
from prism_debug.process.start import BusEnds, check_gpu_calls, finish
from prism_debug.snapshot import lazy as lazy_pages
from prism_debug.snapshot.criu import Criu, tree_pids
from prism_debug.snapshot.manifest import CUT_PATTERN, Manifest
from prism_debug.snapshot.store import Store

Message = Callable[[str], None]


def _quiet(line: str) -> None:
    pass


@private  # the run's files, the store and the rank's are the user's alone
def restore(options: RestoreOptions, message: Message = _quiet) -> RunResult:
    """A new run from the snapshot or cut ``options.snapshot_id``, to its end."""
    store = open_store(options.store)
    members, reload = _restorable(options, store)
    criu = restore_tools(members[0])
    run_dir = options.run_dir or default_run_dir()
    make_run_dir(run_dir)
    if members[0].cut is None:
        return _restore_rank(options, store, members[0], criu, run_dir, reload, message)
    return _restore_cut(options, store, members, criu, run_dir, message)


def _restorable(options: RestoreOptions, store: Store) -> tuple[list[Manifest], list | None]:
    """The snapshots to restore — a cut's parts, every one of them, or one
    rank's snapshot — verified and checked against the code they ran and
    the options; and the changed functions ``--reload`` patches in."""
    reload = None
    if CUT_PATTERN.fullmatch(options.snapshot_id):
        members = [store.verify(m.id) for m in store.cut(options.snapshot_id)]
        _check_whole(members, store)
        if options.reload:
            raise ConfigError("--reload restores one rank; a cut of several real ranks is "
                              "restored without it (take the snapshots again from the changed "
                              "code)")
        for manifest in members:
            check_unchanged(manifest, store)
    else:
        manifest = store.verify(options.snapshot_id)
        if manifest.cut is not None:
            raise SnapshotError(f"snapshot {manifest.id} is rank {manifest.rank}'s part of the "
                                f"cut {manifest.cut} of ranks {ranks_text(manifest.cut_ranks)}, "
                                "which meet each other: restore them together, prism-debug "
                                f"snapshot restore {manifest.cut}", snapshot_id=manifest.id)
        reload = check_unchanged(manifest, store, options.reload)
        members = [manifest]
    first = members[0]
    if options.faults and first.graph_digest is None:
        what = f"cut {first.cut}" if first.cut is not None else f"snapshot {first.id}"
        raise ConfigError(f"faults act on virtual peers replayed from a graph; {what} was "
                          "taken from a run whose peers arrived in lockstep")
    return members, reload


def _check_whole(members: list[Manifest], store: Store) -> None:
    first = members[0]
    ranks = tuple(m.rank for m in members)
    if set(first.cut_ranks) - set(ranks):
        raise SnapshotError(f"cut {first.cut} is of ranks {ranks_text(first.cut_ranks)}; "
                            f"this store ({store.root}) holds ranks {ranks_text(ranks)} only, "
                            "the others were snapshotted on other hosts: copy their snapshots "
                            "(their store's folders of this cut) here and restore the cut again")


def restored_copy(store: Store, manifest: Manifest, criu: Criu, options: RestoreOptions,
                  files: dict[str, Path], bus: BusEnds, message: Message, *,
                  side: dict | None = None, reload: list | None = None) -> RestoredChild:
    """One rank's copy, restored from ``manifest`` as this process's child,
    writing to ``files`` and connecting to ``bus`` (``side``: where a cut's
    rank meets the cut's others again)."""
    os.chmod(files["control"], 0o600)  # it carries the bus's secret (and the store's prefix)
    # read before the copy runs: the snapshot may be removed meanwhile (its
    # images stay readable to a lazy restore's daemon, not to a later open)
    isolated = not tree_pids(store.path(manifest.id))
    pid = restore_process(
        store, manifest, files, criu, iterations=options.iterations,
        record_ops=options.trace_path is not None and side is None,
        bus=bus.commands_endpoint, bus_curve=bus.agent_curve, bus_secret=bus.agent_secret,
        faults=options.faults, watch_nonfinite=options.watch_nonfinite, lazy=options.lazy,
        message=message, reload=reload, side_store=side)
    # needing no pids here, the copy is the init of a pid namespace of its own
    return RestoredChild(pid, isolated=isolated)


def _restore_rank(options: RestoreOptions, store: Store, manifest: Manifest, criu: Criu,
                  run_dir: Path, reload: list | None, message: Message) -> RunResult:
    """One rank's snapshot restored, with a session that takes snapshots on."""
    files = run_files(run_dir)
    message(f"prism-debug: restoring snapshot {manifest.id} (rank {manifest.rank} of "
            f"{manifest.world_size}, after iteration {manifest.iteration})")
    session = open_rank_session(manifest.rank, manifest.world_size, options.bind, files,
                                store, lambda: Snapshotter.continuing(manifest, store, message),
                                message)
    try:
        child = restored_copy(store, manifest, criu, options, files, session, message,
                              reload=reload)
        follower, exit_code = follow_rank(session, manifest.rank, files, child, store, message)
        events, report = finish(
            follower, files["events"], exit_code, manifest.world_size, manifest.rank,
            manifest.command, manifest.hardware, options.report_path, options.trace_path,
            message, restored_from=manifest.id)
    finally:
        session.close()
        lazy_pages.reap()  # the rank is gone: so is its lazy-pages daemon, if any
    _check_copy(manifest, events, exit_code, files["log"], options)
    return RunResult(report, exit_code, run_dir, session.snapshots_taken, events)


def _restore_cut(options: RestoreOptions, store: Store, members: list[Manifest], criu: Criu,
                 run_dir: Path, message: Message) -> RunResult:
    """Every rank of a cut restored, on a store of this controller's where
    they meet again, and followed to its end as a run of several ranks is."""
    first = members[0]
    ranks = tuple(m.rank for m in members)
    message(f"prism-debug: restoring cut {first.cut} (ranks {ranks_text(ranks)} of "
            f"{first.world_size}, after iteration {first.iteration})")
    session = None if options.bind is None else cuts_session(
        ranks, first.world_size, options.bind, ranks, None, message)

    def start(side: dict) -> Iterator[FollowedRank]:
        for manifest in members:
            rank = manifest.rank
            files = run_files(make_run_dir(run_dir / f"rank-{rank}"))
            relay: Relay
            bus: BusEnds  # the session's ends of the bus (a NoSession has none)
            if session is not None:
                relay, bus = session.relay(rank), session
            else:
                relay = bus = NoSession(_no_snapshots(rank), files)
            child = restored_copy(store, manifest, criu, options, files, bus,
                                  labelled(rank, message), side=side)
            yield followed(rank, files, child, session, relay, message,
                           restored_from=manifest.id)

    restored, exit_code = run_all(start, None, session, message)
    result = ranks_results(first.world_size, first.command, first.hardware,
                           options.report_path, restored, exit_code, message)
    for manifest in members:
        each = restored[manifest.rank]
        _check_copy(manifest, result.ranks[manifest.rank].events, each.exit_code or 0,
                    each.files["log"], options)
    return result


def _no_snapshots(rank: int) -> Callable[[], Snapshotter]:
    def refuse() -> Snapshotter:  # (a restored cut's copies are asked for none)
        raise InvalidState(f"rank {rank} asked for a snapshot nobody asked of it")
    return refuse


def _check_copy(manifest: Manifest, events: list[dict], exit_code: int, log: Path,
                options: RestoreOptions) -> None:
    """What the copy said of what it was told: a GPU call it cannot make, a
    refusal, faults it did not put in force."""
    check_gpu_calls(events, exit_code, log)
    error = next((e["message"] for e in events if e["kind"] == "error"), None)
    if error is not None:
        which = "rank" if manifest.cut is None else f"rank {manifest.rank}"
        raise ConfigError(f"the restored {which} refused: {error}")
    resumed = next((e for e in events if e["kind"] == "resumed"), None)
    added = resumed.get("faults_added") if resumed is not None else None
    if options.faults and resumed is not None and added != len(options.faults):
        # a rank snapshotted by an older prism-debug reads no faults at restore
        raise SnapshotError(f"snapshot {manifest.id}'s rank put {added or 0} of "
                            f"{len(options.faults)} faults in force: it predates faults at "
                            "restore; take the snapshot again", snapshot_id=manifest.id)
