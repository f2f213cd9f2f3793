"""The controller side of ``prism-debug run``: start the real rank, relay its
output, follow its event log, and assemble the report.

The rank is started the way CRIU will need it (its own session, stdin from
/dev/null, output to an append-only file the controller relays), so snapshots
can slot in without changing how ranks are launched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import prism_debug
from prism_debug.agent.config import ENV_VAR, AgentConfig
from prism_debug.cost import HardwareProfile
from prism_debug.errors import ConfigError, LaunchError
from prism_debug.graph import ExecutionGraph, GraphError
from prism_debug.runner import report as reporting

PACKAGE_ROOT = Path(prism_debug.__file__).resolve().parent
SOURCE_ROOT = PACKAGE_ROOT.parent
HOOKS_DIR = SOURCE_ROOT / "hooks"
BUNDLED_EXAMPLE = SOURCE_ROOT / "examples" / "train_gpt.py"
_POLL_S = 0.05


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    command: list[str]
    rank: int
    world_size: int
    profile: HardwareProfile
    iterations: int | None = None
    report_path: Path | None = None
    trace_path: Path | None = None
    seed: int = 0
    values: str = "mirror"
    run_dir: Path | None = None
    digests: bool = True
    record_program: bool = False  # profiling a slice
    graph_path: Path | None = None  # replay virtual peers from this graph
    trace_ranks: tuple[int, ...] = ()  # virtual ranks to put in the trace
    snapshot_at: tuple[int, ...] = ()  # dump the rank after these iterations
    snapshot_every: int | None = None
    store: Path | None = None  # the snapshot store (default: snapshots/ here)
    incremental: bool = False  # snapshots after the first hold only what changed
    isolate: bool = False  # the rank in its own pid namespace: restored copies run beside it
    bind: str | None = "127.0.0.1"  # the debugger bus's address (None: no bus)
    paused: bool = False  # the rank waits at init_process_group for a client to continue it
    perturbations: tuple[str, ...] = ()  # virtual peers' perturbations (needs a graph)
    collective_timeout_s: float | None = None  # overrides the script's group timeouts
    watch_nonfinite: bool = False  # report the first iteration the rank sends NaN or inf
    env: tuple[tuple[str, str], ...] = ()  # set in the rank's environment (scenarios)

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"--world-size must be at least 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is outside the world: --rank must be in "
                f"[0, {self.world_size - 1}] for --world-size {self.world_size}")
        if self.iterations is not None and self.iterations < 1:
            raise ConfigError(f"--iterations must be at least 1, got {self.iterations}")
        if not self.command:
            raise ConfigError("no command to run")
        if self.graph_path is not None:
            self._check_graph()
        if self.trace_ranks:
            if self.graph_path is None or self.trace_path is None:
                raise ConfigError("--trace-ranks needs --graph and --trace: without a graph "
                                  "virtual peers simply do what the real rank does")
            outside = [r for r in self.trace_ranks if not 0 <= r < self.world_size]
            if outside:
                raise ConfigError(f"--trace-ranks {outside[0]} is outside the world of "
                                  f"{self.world_size}")
        if any(k < 1 for k in self.snapshot_at) or (self.snapshot_every is not None
                                                      and self.snapshot_every < 1):
            raise ConfigError("snapshot iterations count from 1: --snapshot-at and "
                              "--snapshot-every take positive numbers")
        if self.perturbations:
            if self.graph_path is None:
                raise ConfigError("--perturb needs --graph: perturbations act on virtual peers "
                                  "replayed from an execution graph (prism-debug profile)")
            from prism_debug.engine.perturbations import Selectors, parse_perturbation
            selectors = Selectors.of_graph(ExecutionGraph.load(self.graph_path))
            for text in self.perturbations:
                parse_perturbation(text, self.world_size, self.profile.gpus_per_node, selectors)
        if self.collective_timeout_s is not None and self.collective_timeout_s <= 0:
            raise ConfigError(f"--collective-timeout must be positive, got "
                              f"{self.collective_timeout_s}")
        if self.paused and self.bind is None:
            raise ConfigError("--paused waits for prism-debug attach, which --no-bus rules out")
        if self.incremental and not (self.snapshot_at or self.snapshot_every):
            raise ConfigError("--incremental needs snapshots: add --snapshot-at or "
                              "--snapshot-every")
        for option, path in (("--report", self.report_path), ("--trace", self.trace_path)):
            if path is not None and not path.resolve().parent.is_dir():
                raise ConfigError(f"{option} {path}: directory {path.resolve().parent} does not exist")


    def _check_graph(self) -> None:
        graph = ExecutionGraph.load(self.graph_path)
        if graph.world_size != self.world_size:
            raise GraphError(f"the graph {self.graph_path} is of a world of {graph.world_size} "
                             f"ranks; this run has --world-size {self.world_size}")
        if graph.gpus_per_node != self.profile.gpus_per_node:
            raise GraphError(f"the graph {self.graph_path} places {graph.gpus_per_node} ranks "
                             f"per node; this run places {self.profile.gpus_per_node}")


@dataclasses.dataclass
class RunResult:
    report: dict
    exit_code: int
    run_dir: Path
    snapshots: list[str] = dataclasses.field(default_factory=list)  # ids taken, in order
    events: list[dict] = dataclasses.field(default_factory=list)  # the rank's event log


def default_run_dir() -> Path:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return state / "prism-debug" / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def check_command(command: list[str]) -> None:
    """Catch the mistakes that would otherwise surface as a confusing child
    failure: a missing program or a missing Python script."""
    program = command[0]
    if shutil.which(program) is None and not Path(program).is_file():
        raise ConfigError(f"command not found: {program}")
    if Path(program).name.startswith("python"):
        script = next((a for a in command[1:] if not a.startswith("-")), None)
        if script is not None and script.endswith(".py") and not Path(script).is_file():
            raise ConfigError(f"script not found: {script}")


def torchrun_environment(rank: int, world_size: int, gpus_per_node: int) -> dict[str, str]:
    """The variables torchrun sets for a worker, for the emulated rank."""
    local_world = min(gpus_per_node, world_size)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(rank % gpus_per_node),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // gpus_per_node),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "prism-debug",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def run_files(run_dir: Path) -> dict[str, Path]:
    """The files a run's rank writes and reads, fresh."""
    files = {"log": run_dir / "rank.log", "events": run_dir / "events.jsonl",
             "control": run_dir / "control.json"}
    for path in files.values():
        path.unlink(missing_ok=True)
    files["control"].write_text("{}")
    return files


def open_session(rank: int, world_size: int, bind: str | None, files: dict[str, Path],
                 store: Path | None, snapshotter_factory, message: Callable[[str], None]):
    """The run's debugging session on the bus, or a silent stand-in without one."""
    from prism_debug.runner.session import NoSession, Session

    if bind is None:
        return NoSession(snapshotter_factory, files)
    return Session(rank=rank, world_size=world_size, host=bind, run_files=files, store=store,
                   snapshotter_factory=snapshotter_factory, message=message)


def run(options: RunOptions, message: Callable[[str], None]) -> RunResult:
    check_command(options.command)
    snapshotter = None
    if options.snapshot_at or options.snapshot_every:
        # CRIU missing or unusable: say so before the run starts
        from prism_debug.runner.snapshots import Snapshotter
        snapshotter = Snapshotter.for_run(options, message)
    run_dir = options.run_dir or default_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    files = run_files(run_dir)

    def snapshotter_factory():
        from prism_debug.runner.snapshots import Snapshotter
        return snapshotter or Snapshotter.for_run(options, message)

    session = open_session(options.rank, options.world_size, options.bind, files,
                           options.store, snapshotter_factory, message)
    try:
        return _run(options, session, files, message)
    finally:
        session.close()


def _run(options: RunOptions, session, files: dict[str, Path],
         message: Callable[[str], None]) -> RunResult:
    profile = options.profile
    run_dir = files["log"].parent
    config = AgentConfig(
        rank=options.rank, world_size=options.world_size, gpus_per_node=profile.gpus_per_node,
        hardware=profile.to_dict(), seed=options.seed, values=options.values,
        events_path=str(files["events"]), iterations=options.iterations,
        record_ops=options.trace_path is not None, digests=options.digests,
        record_program=options.record_program,
        graph_path=str(options.graph_path.resolve()) if options.graph_path else None,
        trace_ranks=options.trace_ranks, snapshot_at=options.snapshot_at,
        snapshot_every=options.snapshot_every, control_path=str(files["control"]),
        bus=session.commands_endpoint, bus_curve=session.agent_curve,
        start_paused=options.paused, perturbations=options.perturbations,
        collective_timeout_s=options.collective_timeout_s,
        watch_nonfinite=options.watch_nonfinite,
    )
    config_path = run_dir / "agent.json"
    config.write(config_path)

    env = dict(os.environ)
    env.update(torchrun_environment(options.rank, options.world_size, profile.gpus_per_node))
    env.update(options.env)
    env[ENV_VAR] = str(config_path)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(HOOKS_DIR), str(SOURCE_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("PYTHONUNBUFFERED", "1")

    nodes = -(-options.world_size // profile.gpus_per_node)
    message(f"prism-debug: rank {options.rank} of {options.world_size} "
            f"(node {options.rank // profile.gpus_per_node} of {nodes}, local rank "
            f"{options.rank % profile.gpus_per_node}) · hardware {profile.name} · "
            f"values {options.values} · seed {options.seed}")
    message(f"command: {shlex.join(options.command)}")
    if session.commands_endpoint:
        message(f"debugger: prism-debug attach --rank {options.rank} "
                f"(session {session.info.session})")

    command = options.command
    if options.isolate:
        # The rank as init of a pid namespace, in a session of its own inside it
        # (CRIU refuses a session leader outside the namespace); restored
        # copies get namespaces of their own, so they can run beside it.
        command = ["unshare", "--pid", "--fork", "--kill-child", "setsid", *command]
    with open(files["log"], "ab") as log:
        try:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as exc:
            raise LaunchError(f"cannot start {command[0]}: {exc}") from exc
    session.child = _Isolated(child) if options.isolate else _Child(child)
    follower = _Follower(files["log"], files["events"], options.rank, message, session)
    exit_code = _wait(session, follower)
    events, report = finish(follower, files["events"], exit_code, options.world_size,
                            options.rank, options.command, profile.name, options.report_path,
                            options.trace_path, message)
    error = next((e["message"] for e in events if e["kind"] == "error"), None)
    if error is not None:
        raise GraphError(f"{error} (graph {options.graph_path})")
    if not any(e["kind"] in ("loaded", "init") for e in events):
        raise LaunchError(
            f"the prism-debug agent never loaded in the script's process (exit code "
            f"{exit_code}): run the script with a Python that imports torch and honours "
            f"PYTHONPATH (not python -I or -E); its output is in {files['log']}")
    if not any(e["kind"] == "init" for e in events):
        raise LaunchError(
            f"the script never called torch.distributed.init_process_group (exit code "
            f"{exit_code}): prism-debug emulates one rank of a distributed job, so the "
            f"command must start one; its output is in {files['log']}")
    return RunResult(report, exit_code, run_dir, session.snapshots_taken, events)


def finish(follower: "_Follower", events_path: Path, exit_code: int, world_size: int, rank: int,
           command: list[str], hardware: str, report_path: Path | None,
           trace_path: Path | None, message: Callable[[str], None],
           restored_from: str | None = None) -> tuple[list[dict], dict]:
    """Relay what is left, then write the report and trace; the events and report."""
    follower.poll(final=True)
    events = reporting.read_events(events_path)
    report = reporting.build_report(
        events=events, world_size=world_size, rank=rank, command=command,
        exit_code=exit_code, hardware=hardware,
        child_peak_rss=resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
    if restored_from is not None:
        report["restored_from"] = restored_from
    for line in reporting.summary_lines(report):
        message(line)
    if report_path:
        report_path.write_text(json.dumps(report, indent=1) + "\n")
        message(f"report: {report_path}")
    if trace_path:
        trace_path.write_text(json.dumps(reporting.chrome_trace(events, rank)))
        message(f"trace: {trace_path} (open in https://ui.perfetto.dev)")
    return events, report


def _wait(session, follower: "_Follower") -> int:
    """Wait for the rank, relaying as it goes and serving the debugger bus.

    The rank runs in its own session (CRIU needs that), so signals aimed at
    the controller do not reach it by themselves: Ctrl-C, SIGTERM and SIGHUP
    are passed on (a second Ctrl-C kills), and if the controller itself fails
    the rank goes down with it rather than running on orphaned.  The rank
    may be replaced meanwhile (a restore from the console): ``session.child``
    is always the one to follow.
    """
    def forward(signum, frame):
        _signal_group(session.child, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    interrupted = 0
    try:
        while True:
            try:
                child = session.child
                code = child.poll()
                follower.poll()
                if code is not None and child is session.child:
                    code = code if code >= 0 else 128 - code
                    session.exited(code)
                    return code
                session.poll(_POLL_S)
            except KeyboardInterrupt:
                interrupted += 1
                _signal_group(session.child, signal.SIGINT if interrupted == 1
                              else signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if session.child.poll() is None:
            kill_rank(session.child)


def kill_rank(child) -> None:
    _signal_group(child, signal.SIGKILL)
    child.wait()


class _Child:
    """The rank as a plain child process."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen
        self.pid = popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self) -> int:
        return self._popen.wait()

    def kill_rank(self) -> None:
        kill_rank(self)


class _Isolated:
    """The rank behind ``unshare``: waited for through it, signalled and dumped
    as itself (the namespace's init, seen from here)."""

    def __init__(self, unshare: subprocess.Popen) -> None:
        self._unshare = unshare
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        if self._pid is None:
            deadline = time.monotonic() + 30
            while self._pid is None:
                try:
                    children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/"
                                    "children").read_text().split()
                except OSError:
                    children = []
                if children:
                    self._pid = int(children[0])
                elif self._unshare.poll() is not None or time.monotonic() > deadline:
                    return self._unshare.pid
                else:
                    time.sleep(0.001)
        return self._pid

    def poll(self) -> int | None:
        return self._unshare.poll()

    def wait(self) -> int:
        return self._unshare.wait()

    def signal_rank(self, signum: int) -> None:
        # A namespace's init only receives the signals it handles (SIGINT, in
        # Python), and SIGKILL and SIGSTOP from outside: stop it by force.
        os.killpg(self.pid, signum if signum == signal.SIGINT else signal.SIGKILL)

    def kill_rank(self) -> None:
        kill_rank(self)


def _signal_group(child, signum: int) -> None:
    try:
        if isinstance(child, _Isolated):
            child.signal_rank(signum)
        else:
            os.killpg(child.pid, signum)
    except ProcessLookupError:
        pass


class _Follower:
    """Relays the rank's output and prints a table row per finished iteration;
    the output goes on the bus too, and snapshot requests to the session."""

    def __init__(self, log_path: Path, events_path: Path, rank: int,
                 message: Callable[[str], None], session) -> None:
        self._log = _Tail(log_path)
        self._events = _Tail(events_path)
        self._prefix = f"[rank {rank}] "
        self._message = message
        self._header_shown = False
        self._session = session

    def poll(self, final: bool = False) -> None:
        for line in self._log.lines(final):
            self._message(self._prefix + line)
            self._session.output(line)
        for line in self._events.lines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("kind") == "iteration":
                if not self._header_shown:
                    self._message(reporting.table_header())
                    self._header_shown = True
                self._message(reporting.table_row(event))
            elif event.get("kind") == "snapshot" and not final:
                self._session.take_snapshot(event)


class _Tail:
    """Complete lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""

    def lines(self, final: bool = False) -> list[str]:
        """``final``: the writer has exited, so an unterminated last line is complete."""
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if final and self._partial:
            complete.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", "replace") for line in complete]


def python_command(script: Path, args: list[str]) -> list[str]:
    return [sys.executable, str(script), *args]
