"""``prism-debug profile``: run one slice per rank class and build the graph.

Each slice is a real run of the script as one representative rank, with
collectives completing at once (the ``zero`` hardware), recording its
program.  The first slice reveals the layout (families, and the family
point-to-point ops travel on); it decides which other ranks to run.  Slices
also record the messages they send other classes (graph/messages.py), and
each is given those of the classes profiled before it.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prism_debug.agent.program import MESSAGES_ENV, events_from_json, write_slice_messages
from prism_debug.controller.launch import RunOptions, run
from prism_debug.cost import load_profile
from prism_debug.errors import ConfigError, GraphError, LaunchError
from prism_debug.graph import ExecutionGraph, Mesh
from prism_debug.graph.build import (
    MIN_ITERATIONS,
    RecordedIssue,
    SliceRecord,
    build_graph,
    class_axis,
    infer_mesh,
    representatives,
)
from prism_debug.graph.messages import NEEDS_MESSAGES_EXIT, MissingMessage, PeerMessage
from prism_debug.process import report as reporting


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    command: list[str]
    world_size: int
    gpus_per_node: int
    iterations: int
    out: Path
    slice_ranks: tuple[int, ...] = ()
    run_dir: Path | None = None

    def __post_init__(self) -> None:
        if self.iterations < MIN_ITERATIONS:
            raise ConfigError(f"--iterations must be at least {MIN_ITERATIONS} (a warm-up and "
                              f"two iterations to compare), got {self.iterations}")
        for rank in self.slice_ranks:
            if not 0 <= rank < self.world_size:
                raise ConfigError(f"slice rank {rank} is outside the world of {self.world_size}")
        if not self.out.resolve().parent.is_dir():
            raise ConfigError(f"--out {self.out}: directory {self.out.resolve().parent} does "
                              "not exist")


def profile(options: ProfileOptions, message: Callable[[str], None]) -> ExecutionGraph:
    """Profile one slice per class and write the graph (see :func:`_profile`)."""
    if options.run_dir is not None:
        return _profile(options, message, options.run_dir)
    with tempfile.TemporaryDirectory(prefix="prism-profile-") as work_dir:
        return _profile(options, message, Path(work_dir))


def _profile(options: ProfileOptions, message: Callable[[str], None],
             work_dir: Path) -> ExecutionGraph:
    """Profile one slice per class and write the graph; ``work_dir`` holds
    the messages each slice is given.

    A slice that receives what another class sends (pipelining's shape
    metadata and warm-up vote) needs that class's messages first.  The
    slices run in class order, then in reverse, and so on: a slice that stops
    at a message no profiled slice has sent runs again in a later sweep, once
    the class it waits for has sent more (a slice stops at once, so a run
    that stops costs little more than starting Python and torch).  Each chain
    of messages across the stages takes one sweep: torch's PipelineStage has
    four (the vote forward, its result back, shapes forward, gradient shapes
    back), 4(S - 1) + 1 runs for S stages.  A sweep that learns nothing new
    ends with an error naming the message nobody gets as far as sending."""
    hardware = dataclasses.replace(load_profile("zero"), gpus_per_node=options.gpus_per_node)
    runs = 0

    def run_slice(rank: int, label: str, given: Path | None) -> _SliceRun:
        nonlocal runs
        runs += 1
        message(f"profile: {label}: rank {rank} …")
        started = time.perf_counter()
        run_dir = options.run_dir / f"rank{rank}-run{runs}" if options.run_dir else None
        env = ((MESSAGES_ENV, str(given)),) if given is not None else ()
        result = run(RunOptions(
            command=options.command, rank=rank, world_size=options.world_size,
            profile=hardware, iterations=options.iterations, run_dir=run_dir,
            record_program=True, digests=False, env=env, bind=None, lockstep=True),
            lambda line: None)
        events = reporting.read_events(result.run_dir / "events.jsonl")
        sent = tuple(PeerMessage.from_list(e["message"]) for e in events
                     if e["kind"] == "message")
        missing = next((e for e in events if e["kind"] == "message_missing"), None)
        if missing is not None and result.exit_code == NEEDS_MESSAGES_EXIT:
            stopped = MissingMessage(**missing["missing"])
            message(f"profile: {label}: rank {rank} stopped after "
                    f"{time.perf_counter() - started:.1f} s, waiting for {stopped.describe()}; "
                    "it runs again once that class has run")
            # the receive it stopped at travels on its family too (the class axis)
            stop = RecordedIssue(0.0, "recv", missing["family"], 0, "", -stopped.peer_delta)
            partial = SliceRecord(rank, tuple(missing["families"]),
                                  (events_from_json(missing["program"]) + (stop,),), sent)
            return _SliceRun(partial, stopped)
        if result.exit_code != 0:
            raise LaunchError(f"the slice for rank {rank} exited with code {result.exit_code}; "
                              f"its output is in {result.run_dir / 'rank.log'}")
        iterations = tuple(events_from_json(e["program"]) for e in events
                           if e["kind"] == "iteration")
        families: list[dict] = next(
            (e["families"] for e in reversed(events) if "families" in e), [])
        record = SliceRecord(rank, tuple(families), iterations[:options.iterations], sent)
        num_issues = sum(isinstance(e, RecordedIssue) for e in iterations[-1]) \
            if iterations else 0
        message(f"profile: {label}: rank {rank} done in {time.perf_counter() - started:.1f} s: "
                f"{len(iterations)} iterations, {num_issues} ops per iteration"
                + (f", {len(sent)} messages sent" if sent else ""))
        return _SliceRun(record, None)

    first_rank = options.slice_ranks[0] if options.slice_ranks else 0
    first = run_slice(first_rank, "layout", None)
    mesh, family_axes = infer_mesh(options.world_size, first.record.families)
    axis = class_axis([first.record], family_axes)
    ranks = list(options.slice_ranks) or representatives(mesh, axis)
    message(f"profile: mesh {_mesh_words(mesh)}; "
            f"{len(ranks)} class(es)" + (f" along {axis}" if axis else ""))
    stride = mesh.strides[mesh.axis(axis)] if axis else mesh.world_size
    count = mesh.shape[mesh.axis(axis)] if axis else 1

    def class_of(rank: int) -> int:
        return (rank // stride) % count

    done: dict[int, SliceRecord] = {}
    sent: dict[int, dict[tuple, PeerMessage]] = {}
    waiting: dict[int, MissingMessage] = {}

    def take(rank: int, outcome: _SliceRun) -> bool:
        """Keep what a run sent and whether it finished; whether anything is new."""
        before = (len(done), sum(len(m) for m in sent.values()))
        mine = sent.setdefault(class_of(rank), {})
        for m in outcome.record.messages:
            if m.key in mine and mine[m.key].payload != m.payload:
                raise GraphError(f"rank {rank} sent different messages in two profiling runs "
                                 f"(iteration {m.iteration}, {m.kind} #{m.order} sent "
                                 f"{m.peer_delta:+d} ranks away): profiling needs a script that "
                                 "sends the same metadata for the same seed")
            mine[m.key] = m
        if outcome.missing is None:
            done[rank] = outcome.record
            waiting.pop(rank, None)
        else:
            waiting[rank] = outcome.missing
        return (len(done), sum(len(m) for m in sent.values())) != before

    def news(rank: int) -> tuple:
        """What the class ``rank`` waits for has sent so far (a rerun before
        that changes would stop where the last one did)."""
        missing = waiting.get(rank)
        if missing is None or class_of(missing.peer) == class_of(rank):
            return (rank, runs)  # never run, or waits for its own class: always worth it
        peer_class = class_of(missing.peer)
        return (len(sent.get(peer_class, {})), any(class_of(r) == peer_class for r in done))

    take(first_rank, first)
    last_seen: dict[int, tuple] = {first_rank: news(first_rank)}
    order = [r for r in ranks if r not in done]
    sweep = 0
    while order:
        sweep += 1
        progress = False
        for rank in order:
            if rank in last_seen and news(rank) == last_seen[rank]:
                continue
            given = work_dir / f"messages-{runs + 1}.json"
            write_slice_messages(
                given, class_stride=stride, num_classes=count, iterations=options.iterations,
                known={class_of(r) for r in done} | {class_of(rank)},
                messages={c: tuple(m.values()) for c, m in sent.items()})
            label = f"class {class_of(rank) + 1}/{len(ranks)}" + (
                f" (sweep {sweep})" if sweep > 1 else "")
            progress |= take(rank, run_slice(rank, label, given))
            last_seen[rank] = news(rank)
        if not progress:
            rank, missing = next(iter(waiting.items()))
            raise GraphError(f"profiling cannot finish: rank {rank} needs {missing.describe()}, "
                             "and no slice gets as far as sending it (each waits for a message "
                             "first: a real job would hang there too)")
        order = [r for r in reversed(order) if r not in done]
    graph = build_graph(options.world_size, options.gpus_per_node, list(done.values()),
                        command=options.command)
    graph.save(options.out)
    message(f"profile: wrote {options.out} ({options.out.stat().st_size} bytes)"
            + (f" after {runs} slice runs" if runs > len(ranks) else ""))
    return graph


@dataclasses.dataclass(frozen=True)
class _SliceRun:
    record: SliceRecord  # a stopped run's: the messages it sent, families, partial program
    missing: MissingMessage | None  # what it stopped at (None: it finished)


def _mesh_words(mesh: Mesh) -> str:
    """`pp=4 x dp=256 x tp=8`; an axis no family of the script spans has no
    name a user wrote (the graph calls it `_axisK`), so it is shown as what
    it is: plain DDP is `64 ranks, no family but the world`."""
    named = [(n, s) for n, s in zip(mesh.names, mesh.shape, strict=True)
             if not n.startswith("_axis")]
    if not named:
        return f"{mesh.world_size} ranks, no family but the world"
    return " x ".join(f"{n}={s}" if not n.startswith("_axis") else f"{s} (no family)"
                      for n, s in zip(mesh.names, mesh.shape, strict=True))
