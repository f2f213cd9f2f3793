"""The controller side of a run: start the real rank (several: ``ranks``),
follow it to its end, and assemble the report.

:func:`run` is what the public API (``prism_debug.api``), the CLI, the
scenario runner and profiling call to run a command (``restore`` restores a
snapshot); the mechanics live below it — the rank's process (``children``),
the loop that follows it (``follow``), CRIU (``capture.snapshots``) and the
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
    snapshot_tools,
)
from prism_debug.controller.follow import FollowedRank, follow
from prism_debug.controller.no_session import NoSession
from prism_debug.controller.rank_verbs import open_rank_session
from prism_debug.controller.ranks import run_ranks
from prism_debug.controller.replace import RestoreDue, replace_ranks
from prism_debug.controller.session import Session
from prism_debug.errors import (
    ConfigError,
    GraphError,
)
from prism_debug.faults import resolve
from prism_debug.graph import ExecutionGraph
from prism_debug.process.children import (
    Child,
    Follower,
    IsolatedChild,
    RankProcess,
    run_files,
)
from prism_debug.process.interpreter import check_interpreter, with_interpreter
from prism_debug.process.options import (
    VARIABILITY_NEEDS_GRAPH,
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
    check_rank_events,
    finish,
    rank_pythonpath,
    start_rank,
)
from prism_debug.snapshot import lazy as lazy_pages
from prism_debug.snapshot.store import Store

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
    session = open_rank_session(
        options.rank, options.world_size, options.bind, files, store,
        lambda: snapshotter or Snapshotter.for_run(options, store, message), message,
        history=options.history)
    try:
        return _run(options, graph, session, files, store, message)
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
         files: dict[str, Path], store: Store, message: Message) -> RunResult:
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
    follower, exit_code = follow_rank(session, options.rank, files, child, store, message)
    events, report = finish(follower, files["events"], exit_code, options.world_size,
                            options.rank, options.command, profile.name, options.report_path,
                            options.trace_path, message)
    check_rank_events(options, options.rank, events, exit_code, files["log"])
    return RunResult(report, exit_code, run_dir, session.snapshots_taken, events)


def follow_rank(session: Session | NoSession, rank: int, files: dict[str, Path],
                child: RankProcess, store: Store, message: Message) -> tuple[Follower, int]:
    """Follow the run's one rank to its end (the loop of several ranks, with
    one): its follower, and its exit code."""
    follower = Follower(files["log"], files["events"], rank, message, session.relay(rank))
    followed = {rank: FollowedRank(rank, files, child, follower)}
    session.follows(rank, child)

    def replace(due: RestoreDue) -> bool:
        assert isinstance(session, Session)  # (a restore is a console's)
        return replace_ranks(followed, due, session, store, message)
    return follower, follow(followed, session, message, replace)
