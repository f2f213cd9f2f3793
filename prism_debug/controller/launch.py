"""The controller side of a run: start the real rank (or restore it from a
snapshot), follow it to its end, and assemble the report.

:func:`run` and :func:`restore` are what the public API (``prism_debug.api``),
the CLI, the scenario runner and profiling call; the mechanics live below
them — supervising the child (``children``), CRIU (``snapshots``) and the
debugger bus (``session``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from prism_debug.capture.snapshots import (
    Snapshotter,
    check_unchanged,
    restore_process,
    restore_tools,
    snapshot_tools,
)
from prism_debug.controller.follow import FollowedRank, follow
from prism_debug.controller.ranks import restore_cut, run_ranks
from prism_debug.controller.replace import RestoreDue, replace_ranks
from prism_debug.controller.session import NoSession, Session, open_session
from prism_debug.errors import (
    ConfigError,
    GraphError,
    SnapshotError,
)
from prism_debug.faults import resolve
from prism_debug.graph import ExecutionGraph
from prism_debug.graph.selectors import ranks_text
from prism_debug.process.children import (
    Child,
    Follower,
    IsolatedChild,
    RankProcess,
    RestoredChild,
    run_files,
)
from prism_debug.process.interpreter import check_interpreter, with_interpreter
from prism_debug.process.options import (
    VARIABILITY_NEEDS_GRAPH,
    RestoreOptions,
    RunOptions,
    RunResult,
    check_command,
)
from prism_debug.process.paths import (
    default_run_dir,
    make_run_dir,
    open_store,
    private,
)
from prism_debug.process.start import (
    agent_config,
    check_gpu_calls,
    check_rank_events,
    finish,
    rank_pythonpath,
    start_rank,
)
from prism_debug.snapshot import lazy as lazy_pages
from prism_debug.snapshot.criu import tree_pids
from prism_debug.snapshot.manifest import CUT_PATTERN

Message = Callable[[str], None]


def _quiet(line: str) -> None:
    pass


class GraphFinder(Protocol):
    def __call__(self, options: RunOptions, message: Message) -> RunOptions:
        """``options`` with the graph ``profile_graph`` asks for (or lockstep)."""


@private  # the run's files, the store and the rank's are the user's alone
def run(options: RunOptions, message: Message = _quiet,
        find_graph: GraphFinder | None = None) -> RunResult:
    """Run ``options.command`` as one real rank of the emulated job, to its end.

    ``options.profile_graph`` asks ``find_graph`` (the graph cache's
    ``with_graph``, which ``api.run`` passes) for the job's graph once the
    cheap checks have passed, so a mistake is not found after profiling.
    A bare ``python`` first word is this Python (``interpreter``'s rule)."""
    options = dataclasses.replace(
        options, command=with_interpreter(options.command),
        profile_command=options.profile_command and with_interpreter(options.profile_command))
    check_command(options.command)
    check_interpreter(options.command, rank_pythonpath(dict(options.env)))
    store = open_store(options.store)
    if options.profile_graph:
        if find_graph is None:
            raise ConfigError("profile_graph needs the graph cache: run through api.run")
        if options.takes_snapshots:
            snapshot_tools()  # CRIU missing or unusable: say so before profiling
        options = find_graph(options, message)
    graph = load_graph(options)
    if options.variability is not None and graph is None:
        # (profiling found no graph that can describe the job: peers in lockstep)
        raise ConfigError(VARIABILITY_NEEDS_GRAPH)
    snapshotter = None
    if options.takes_snapshots:
        # CRIU missing or unusable: say so before the run starts
        snapshotter = Snapshotter.for_run(options, store, message)
    run_dir = options.run_dir or default_run_dir()
    make_run_dir(run_dir)
    if len(options.real_ranks) > 1:
        return run_ranks(options, graph, run_dir, message, store)
    files = run_files(run_dir)
    os.chmod(files["control"], 0o600)  # it carries the bus secret to restored copies
    session = open_session(options.rank, options.world_size, options.bind, files, store,
                           lambda: snapshotter or Snapshotter.for_run(options, store, message),
                           message, history=options.history)
    try:
        return _run(options, graph, session, files, message)
    finally:
        session.close()
        lazy_pages.reap()  # of copies the console restored


def load_graph(options: RunOptions) -> ExecutionGraph | None:
    """The run's graph, read once (or as the caller loaded it), checked against
    the run's world and layout, with every fault resolved against it (so a
    fault that hits nobody is refused before anything starts)."""
    if options.graph_path is None:
        return None
    graph = options.graph or ExecutionGraph.load(options.graph_path)
    if graph.world_size != options.world_size:
        raise GraphError(f"the graph {options.graph_path} is of a world of {graph.world_size} "
                         f"ranks; this run has --world-size {options.world_size}")
    if graph.gpus_per_node != options.profile.gpus_per_node:
        raise GraphError(f"the graph {options.graph_path} places {graph.gpus_per_node} ranks "
                         f"per node; this run places {options.profile.gpus_per_node}")
    for fault in options.faults:
        resolve(fault, options.world_size, options.profile.gpus_per_node, graph)
    if options.variability is not None:
        # a class or op kind the graph lacks: one clear error, before anything starts
        options.variability.check(graph)
    return graph


def _run(options: RunOptions, graph: ExecutionGraph | None, session: Session | NoSession,
         files: dict[str, Path], message: Message) -> RunResult:
    profile = options.profile
    run_dir = files["log"].parent
    config_path = run_dir / "agent.json"
    agent_config(options, graph, files, options.rank, session).write(config_path)  # 0600

    nodes = -(-options.world_size // profile.gpus_per_node)
    message(f"prism-debug: rank {options.rank} of {options.world_size} "
            f"(node {options.rank // profile.gpus_per_node} of {nodes}, local rank "
            f"{options.rank % profile.gpus_per_node}) · hardware {profile.name} · "
            f"values {options.values} · seed {options.seed}")
    message(f"command: {shlex.join(options.command)}")
    if session.commands_endpoint:
        message(f"debugger: prism-debug attach --rank {options.rank} "
                f"(session {session.info.session})")
        if session.info.remote_commands:
            message(f"remote debugger: prism-debug attach --connect "
                    f"{session.info.remote_commands} (CURVE, your keys)")

    popen = start_rank(options, options.rank, files, config_path)
    child = IsolatedChild(popen) if options.isolate else Child(popen)
    follower, exit_code = _follow(session, options.rank, files, child, message)
    events, report = finish(follower, files["events"], exit_code, options.world_size,
                            options.rank, options.command, profile.name, options.report_path,
                            options.trace_path, message)
    check_rank_events(options, options.rank, events, exit_code, files["log"])
    return RunResult(report, exit_code, run_dir, session.snapshots_taken, events)


def _follow(session: Session | NoSession, rank: int, files: dict[str, Path],
            child: RankProcess, message: Message) -> tuple[Follower, int]:
    """Follow the run's one rank to its end (the loop of several ranks, with
    one): its follower, and its exit code."""
    follower = Follower(files["log"], files["events"], rank, message, session)
    followed = {rank: FollowedRank(rank, files, child, follower)}
    session.follows(rank, child)

    def replace(due: RestoreDue) -> None:
        assert isinstance(session, Session)  # (a restore is a console's)
        replace_ranks(followed, due, session, session.store, message)
    return follower, follow(followed, session, message, replace)


@private
def restore(options: RestoreOptions, message: Message = _quiet) -> RunResult:
    """A new run from a snapshot, continued to its end, with a bus of its own
    (so a restored rank can be attached to as well)."""
    store = open_store(options.store)
    if CUT_PATTERN.fullmatch(options.snapshot_id):
        return restore_cut(options, store, message)  # several real ranks
    manifest = store.verify(options.snapshot_id)
    if manifest.cut is not None:
        raise SnapshotError(f"snapshot {manifest.id} is rank {manifest.rank}'s part of the cut "
                            f"{manifest.cut} of ranks {ranks_text(manifest.cut_ranks)}, which "
                            "meet each other: restore them together, prism-debug snapshot "
                            f"restore {manifest.cut}", snapshot_id=manifest.id)
    reload = check_unchanged(manifest, store, options.reload)
    if options.faults and manifest.graph_digest is None:
        raise ConfigError(f"faults act on virtual peers replayed from a graph; snapshot "
                          f"{manifest.id} was taken from a run whose peers arrived in lockstep")
    criu = restore_tools(manifest)
    run_dir = options.run_dir or default_run_dir()
    make_run_dir(run_dir)
    files = run_files(run_dir)
    os.chmod(files["control"], 0o600)  # it carries the bus secret to the restored copy
    message(f"prism-debug: restoring snapshot {manifest.id} (rank {manifest.rank} of "
            f"{manifest.world_size}, after iteration {manifest.iteration})")
    session = open_session(manifest.rank, manifest.world_size, options.bind, files, store,
                           lambda: Snapshotter.continuing(manifest, store, message), message)
    # read before the copy runs: the snapshot may be removed meanwhile (its
    # images stay readable to a lazy restore's daemon, not to a later open)
    isolated = not tree_pids(store.path(manifest.id))
    try:
        pid = restore_process(store, manifest, files, criu, iterations=options.iterations,
                              record_ops=options.trace_path is not None,
                              bus=session.commands_endpoint, bus_curve=session.agent_curve,
                              bus_secret=session.agent_secret, faults=options.faults,
                              watch_nonfinite=options.watch_nonfinite,
                              lazy=options.lazy, message=message, reload=reload)
        # needing no pids here, the copy is the init of a pid namespace of its own
        child = RestoredChild(pid, isolated=isolated)
        follower, exit_code = _follow(session, manifest.rank, files, child, message)
        events, report = finish(
            follower, files["events"], exit_code, manifest.world_size, manifest.rank,
            manifest.command, manifest.hardware, options.report_path, options.trace_path,
            message, restored_from=manifest.id)
    finally:
        session.close()
        lazy_pages.reap()  # the rank is gone: so is its lazy-pages daemon, if any
    check_gpu_calls(events, exit_code, files["log"])
    error = next((e["message"] for e in events if e["kind"] == "error"), None)
    if error is not None:
        raise ConfigError(f"the restored rank refused: {error}")
    resumed = next((e for e in events if e["kind"] == "resumed"), None)
    added = resumed.get("faults_added") if resumed is not None else None
    if options.faults and resumed is not None and added != len(options.faults):
        # a rank snapshotted by an older prism-debug reads no faults at restore
        raise SnapshotError(f"snapshot {manifest.id}'s rank put {added or 0} of "
                            f"{len(options.faults)} faults in force: it predates faults at "
                            "restore; take the snapshot again", snapshot_id=manifest.id)
    return RunResult(report, exit_code, run_dir, session.snapshots_taken, events)


