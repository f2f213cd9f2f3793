"""What a run, a restore and a scenario are asked to do, and what they give
back: frozen values checked on construction, cheap to build (nothing here
starts a process or reads a graph)."""

from __future__ import annotations

import dataclasses
import math
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from prism_debug.checked import (
    MAX_GPUS_PER_NODE,
    MAX_ITERATIONS,
    MAX_REAL_RANKS,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_WORLD_SIZE,
)
from prism_debug.cost import DEFAULT_PROFILE, HardwareProfile, load_profile
from prism_debug.errors import ConfigError
from prism_debug.example import RUN_DEFAULTS, RUN_FLAGS
from prism_debug.example import SCRIPT as EXAMPLE_SCRIPT
from prism_debug.process.interpreter import is_python
from prism_debug.process.torchrun import Host, host_of, under_torchrun

if TYPE_CHECKING:  # (types only: Variability would import numpy at every command's start)
    from prism_debug.faults import Fault
    from prism_debug.graph import ExecutionGraph
    from prism_debug.variability import Variability

# snapshots a --history ring keeps: each is a dump of the rank on disk
MAX_HISTORY = 1000
VARIABILITY_NEEDS_GRAPH = (
    "--variability needs a graph, not --lockstep: it draws the compute of virtual peers "
    "replayed from an execution graph (give --graph FILE, or leave both out to profile one)")


def _default_hardware() -> HardwareProfile:
    return load_profile(DEFAULT_PROFILE)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunOptions:
    """One real rank of a ``world_size`` job running ``command`` — by default
    as ``prism-debug run`` runs it: the bundled example when ``command`` is
    empty, on the default hardware, virtual peers replaying the job's graph
    (profiled once and cached; ``lockstep`` or ``graph_path`` say otherwise),
    and under torchrun this host's share of ``ranks`` (:func:`on_this_host`,
    which ``api.run`` applies)."""

    rank: int
    world_size: int
    command: list[str] = dataclasses.field(default_factory=list)  # []: the bundled example
    profile: HardwareProfile = dataclasses.field(default_factory=_default_hardware)
    iterations: int | None = None
    report_path: Path | None = None
    trace_path: Path | None = None
    seed: int = 0
    values: str = "mirror"
    run_dir: Path | None = None
    digests: bool = True
    record_program: bool = False  # profiling a slice
    graph_path: Path | None = None  # replay virtual peers from this graph
    # virtual peers arrive with the real rank, from no graph; with neither this
    # nor graph_path, the job's graph comes from the graph cache, profiled
    # first if need be (api.run; lockstep, with a warning, where no graph can
    # describe the job)
    lockstep: bool = False
    # what profiling runs, when not command (the bundled example told the
    # slices' iteration count, so runs of any length share its graph)
    profile_command: list[str] | None = None
    # the graph at graph_path, when the caller has loaded it already (a
    # scenario's runs share one load)
    graph: ExecutionGraph | None = dataclasses.field(default=None, compare=False, repr=False)
    trace_ranks: tuple[int, ...] = ()  # virtual ranks to put in the trace
    snapshot_at: tuple[int, ...] = ()  # dump the rank after these iterations
    snapshot_every: int | None = None
    store: Path | None = None  # the snapshot store (default: snapshots/ here)
    incremental: bool = False  # snapshots after the first hold only what changed
    # keep the last K iterations' snapshots (a ring the controller prunes), so
    # the console can step back: back N, reverse-continue
    history: int | None = None
    isolate: bool = False  # the rank in its own pid namespace: restored copies run beside it
    bind: str | None = "127.0.0.1"  # the debugger bus's address (None: no bus)
    paused: bool = False  # the rank waits at init_process_group for a client to continue it
    faults: tuple[Fault, ...] = ()  # virtual peers' faults (needs a graph)
    # virtual peers' compute drawn per rank, op and iteration (needs a graph;
    # the draws are seeded with ``seed``: same seed, same peers)
    variability: Variability | None = None
    collective_timeout_s: float | None = None  # overrides the script's group timeouts
    watch_nonfinite: bool = False  # report the first iteration the rank sends NaN or inf
    env: tuple[tuple[str, str], ...] = ()  # set in the rank's environment (scenarios)
    # several real ranks (--ranks): those this controller runs, ``rank`` the
    # lowest; () for one
    ranks: tuple[int, ...] = ()
    # one of several hosts under torchrun: its share of the job's real ranks
    host: Host | None = None

    def __post_init__(self) -> None:
        # (in this order: with several mistakes, the first is the one said)
        self._check_job()
        self._check_replay()
        self._check_snapshots()
        if self.faults and self.lockstep:
            raise ConfigError("--perturb needs a graph, not --lockstep: perturbations act on "
                              "virtual peers replayed from an execution graph")
        if self.variability is not None and self.lockstep:
            raise ConfigError(VARIABILITY_NEEDS_GRAPH)
        if self.collective_timeout_s is not None \
                and not 0 < self.collective_timeout_s <= MAX_TIMEOUT_S:  # (NaN too)
            raise ConfigError(f"--collective-timeout must be a number of seconds in (0, "
                              f"{MAX_TIMEOUT_S:.10g}], got {self.collective_timeout_s}")
        if self.paused and self.bind is None:
            raise ConfigError("--paused waits for prism-debug attach, which --no-bus rules out")
        if self.incremental and not self.takes_snapshots:
            raise ConfigError("--incremental needs snapshots: add --snapshot-at, "
                              "--snapshot-every or --history")
        check_output_paths(("--report", self.report_path), ("--trace", self.trace_path))
        if self.ranks:
            self._check_ranks()

    def _check_job(self) -> None:
        """The world, the rank in it, and what it runs."""
        if self.world_size < 1:
            raise ConfigError(f"--world-size must be at least 1, got {self.world_size}")
        if self.world_size > MAX_WORLD_SIZE:
            raise ConfigError(f"--world-size must be at most {MAX_WORLD_SIZE}, got "
                              f"{self.world_size}")
        if not self.command and (problem := RUN_DEFAULTS.layout_problem(self.world_size)):
            raise ConfigError(problem)  # (the bundled example's layout, said before the rank)
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is outside the world: --rank must be in "
                f"[0, {self.world_size - 1}] for --world-size {self.world_size}")
        check_iterations(self.iterations)
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be at least 0 and at most {MAX_SEED}, got "
                              f"{self.seed}")

    def _check_replay(self) -> None:
        """Where virtual peers' timing comes from, and who is traced."""
        if self.lockstep and self.graph_path is not None:
            raise ConfigError("--lockstep and --graph exclude each other: --graph replays "
                              "virtual peers from a graph, --lockstep lets them arrive with "
                              "the real rank")
        if self.trace_ranks:
            if self.lockstep or self.trace_path is None:
                raise ConfigError("--trace-ranks needs a graph (not --lockstep) and --trace: "
                                  "in lockstep virtual peers simply do what the real rank does")
            outside = [r for r in self.trace_ranks if not 0 <= r < self.world_size]
            if outside:
                raise ConfigError(f"--trace-ranks {outside[0]} is outside the world of "
                                  f"{self.world_size}")

    def _check_snapshots(self) -> None:
        """When the rank is dumped, and the history ring the console steps back through."""
        if any(k < 1 for k in self.snapshot_at) or (self.snapshot_every is not None
                                                      and self.snapshot_every < 1):
            raise ConfigError("snapshot iterations count from 1: --snapshot-at and "
                              "--snapshot-every take positive numbers")
        if self.history is not None and not 1 <= self.history <= MAX_HISTORY:
            raise ConfigError(f"--history must be at least 1 and at most {MAX_HISTORY}, got "
                              f"{self.history}")
        if self.history is not None and self.bind is None:
            raise ConfigError("--history keeps snapshots for the console's back and "
                              "reverse-continue, which --no-bus rules out")

    @property
    def profile_graph(self) -> bool:
        """Whether the job's graph is still to be found (the graph cache's)."""
        return self.graph_path is None and not self.lockstep

    @property
    def takes_snapshots(self) -> bool:
        return bool(self.snapshot_at or self.snapshot_every or self.history)

    @property
    def real_ranks(self) -> tuple[int, ...]:
        """Every real rank of the run, on every host (one, or --ranks)."""
        if self.host is not None:
            return self.host.job_ranks
        return self.ranks or (self.rank,)

    def _check_ranks(self) -> None:
        ranks = self.real_ranks
        if self.host is not None and self.ranks != self.host.local_ranks:
            raise ConfigError("a host runs its own share of the job's real ranks")
        if list(ranks) != sorted(set(ranks)) or self.rank != self.ranks[0]:
            raise ConfigError("--ranks must name each rank once, in order, the lowest first")
        if len(self.ranks) > MAX_REAL_RANKS:
            raise ConfigError(f"--ranks names {len(self.ranks)} ranks: one host runs at most "
                              f"{MAX_REAL_RANKS} real ranks (each is a process of its own)")
        outside = [r for r in ranks if not 0 <= r < self.world_size]
        if outside:
            raise ConfigError(f"rank {outside[0]} of --ranks is outside the world: ranks are "
                              f"in [0, {self.world_size - 1}] for --world-size {self.world_size}")
        if len(ranks) == 1:
            return
        # what several real ranks cannot do yet, said before anything starts
        if self.history and self.host is not None:
            raise ConfigError("--history steps back through cuts a console restores on one "
                              "host; a job of several hosts under torchrun does not take it")
        later = [flag for flag, asked in (
            ("--paused", self.paused),
            ("--isolate", self.isolate), ("--trace", self.trace_path),
            ("--record-program", self.record_program)) if asked]
        if later:
            raise ConfigError(f"{later[0]} works with one real rank; a run of several real "
                              f"ranks (--ranks) does not take it yet")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RestoreOptions:
    """A new run of the rank a snapshot holds, from where it was taken."""

    snapshot_id: str
    store: Path | None = None
    iterations: int | None = None  # further iterations to run (default: to the end)
    report_path: Path | None = None
    trace_path: Path | None = None
    run_dir: Path | None = None
    bind: str | None = "127.0.0.1"  # the debugger bus (None: no bus)
    faults: tuple[Fault, ...] = ()  # put in force as the restored rank resumes
    watch_nonfinite: bool = False  # report the first iteration the rank sends NaN or inf
    # patch functions whose source changed since the snapshot into the rank
    # before it goes on (prism_debug.reload); refused, restoring nothing, where
    # a change cannot be patched (its ``reloaded`` event lists what was)
    reload: bool = False
    # CRIU's lazy pages (the rank runs before its memory is all back): None
    # where the kernel and the snapshot allow it, True asks for it, False eager
    lazy: bool | None = None

    def __post_init__(self) -> None:
        check_iterations(self.iterations)
        check_output_paths(("--report", self.report_path), ("--trace", self.trace_path))


@dataclasses.dataclass
class RunResult:
    """What a run or a restore left: its report, exit code and files."""

    report: dict
    exit_code: int
    run_dir: Path
    snapshots: list[str] = dataclasses.field(default_factory=list)  # ids taken, in order
    events: list[dict] = dataclasses.field(default_factory=list)  # the rank's event log
    # a run of several real ranks: each rank's own result (the fields above
    # are the lowest rank's, with the run's exit code, and ``snapshots`` the
    # run's cuts every rank here took part in, which snapshot restore takes)
    ranks: dict[int, RunResult] = dataclasses.field(default_factory=dict)

    @property
    def log_path(self) -> Path:
        """The rank's output."""
        return self.run_dir / "rank.log"


def check_iterations(iterations: int | None) -> None:
    if iterations is not None and iterations < 1:
        raise ConfigError(f"--iterations must be at least 1, got {iterations}")
    if iterations is not None and iterations > MAX_ITERATIONS:
        raise ConfigError(f"--iterations must be at most {MAX_ITERATIONS}, got {iterations}")


# what each numeric command-line option may be: (int or float, lowest, highest);
# a float's lowest is excluded (a timeout of 0 s is none)
OPTION_BOUNDS: dict[str, tuple[type, float, float]] = {
    "--rank": (int, 0, MAX_WORLD_SIZE - 1),
    "--world-size": (int, 1, MAX_WORLD_SIZE),
    "--ranks": (int, 1, MAX_WORLD_SIZE),
    "--gpus-per-node": (int, 1, MAX_GPUS_PER_NODE),
    "--iterations": (int, 1, MAX_ITERATIONS),
    "--snapshot-every": (int, 1, MAX_ITERATIONS),
    "--history": (int, 1, MAX_HISTORY),
    "--seed": (int, 0, MAX_SEED),
    "--processes": (int, 2, 64),
    "--collective-timeout": (float, 0.0, MAX_TIMEOUT_S),
    # a replay of the whole world prints a row per iteration: more is no table
    "replay --iterations": (int, 1, 10_000),
}


def option_number(option: str, text: str | int | float, bounds: str | None = None
                  ) -> int | float:
    """The number command-line ``option`` gave as ``text``, within
    :data:`OPTION_BOUNDS`; :class:`ConfigError` naming the option otherwise
    (``nan``, ``inf``, ``1e999``, a number of thousands of digits included).
    ``bounds`` names the entry when it is not the option's own."""
    kind, low, high = OPTION_BOUNDS[bounds or option]
    word = "an integer" if kind is int else "a number"
    try:
        if isinstance(text, str) and len(text) > 40:  # (int() of thousands of digits raises)
            raise ValueError(text)
        value = kind(text)
    except (ValueError, OverflowError):
        raise ConfigError(f"{option}: {str(text)[:40]!r} is not {word}: give {word} in "
                          f"{_bounds(kind, low, high)}") from None
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{option} must be a finite number, got {value}")
    if kind is float and value <= low:
        raise ConfigError(f"{option} must be positive, got {value}")
    if value < low:
        raise ConfigError(f"{option} must be at least {low}, got {value}")
    if value > high:
        shown = high if kind is int else f"{high:.10g}"
        raise ConfigError(f"{option} must be at most {shown}, got {value}")
    return value


def _bounds(kind: type, low: float, high: float) -> str:
    return f"[{low}, {high}]" if kind is int else f"({low:.10g}, {high:.10g}]"


_SIZE = re.compile(r"^\s*(\d{1,20}(?:\.\d{1,20})?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
MAX_BYTES = 1 << 50  # a PiB: no message is larger


def parse_bytes(text: str) -> int:
    """``1G``, ``64MiB``, ``8k``, ``4096``: binary multiples, as nccl-tests' -b/-e."""
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"--bytes: {text[:40]!r} is not a size such as 4096, 64K, 1M or 8GiB")
    number, unit = float(match.group(1)), match.group(2).lower()
    size = int(number * 1024 ** " kmgt".index(unit or " "))
    if size > MAX_BYTES:
        raise ConfigError(f"--bytes must be at most 1024T ({MAX_BYTES} bytes), got {text}")
    return size


def check_output_paths(*named: tuple[str, Path | None]) -> None:
    for option, path in named:
        if path is not None and not path.resolve().parent.is_dir():
            raise ConfigError(f"{option} {path}: directory {path.resolve().parent} does not exist")


def on_this_host(options: RunOptions, environ: Mapping[str, str],
                 profile_iterations: int) -> RunOptions:
    """``options`` as this host runs them: the bundled example where no
    command is given (profiled told ``profile_iterations``, the slices'
    count, so runs of any length share its graph), and, in a torchrun worker,
    this host's share of the ranks, in a folder of its own (every host is
    given the same command line)."""
    if not options.command:
        options = dataclasses.replace(
            options, command=example_command(options.world_size, options.iterations),
            profile_command=None if not options.profile_graph else
            example_command(options.world_size, profile_iterations))
    if options.host is None and under_torchrun(environ):
        host = host_of(environ, options.ranks or (options.rank,))
        options = dataclasses.replace(
            options, host=host, ranks=host.local_ranks, rank=host.local_ranks[0],
            run_dir=options.run_dir and options.run_dir / f"node-{host.node_rank}")
    elif len(options.ranks) == 1:  # one real rank, however it was named
        options = dataclasses.replace(options, rank=options.ranks[0], ranks=())
    return options


def example_command(world_size: int, iterations: int | None = None) -> list[str]:
    """The bundled example as ``run`` starts it: ``--iterations K`` runs K of them."""
    if not EXAMPLE_SCRIPT.is_file():
        raise ConfigError(f"the bundled example is missing ({EXAMPLE_SCRIPT}); "
                          "install prism-debug from a checkout (pip install -e .)")
    # (a count below 1 is RunOptions' to refuse, with the option's name)
    example = RUN_DEFAULTS if iterations is None or iterations < 1 else \
        dataclasses.replace(RUN_DEFAULTS, iterations=iterations)
    if (problem := example.layout_problem(world_size)) is not None:
        raise ConfigError(problem)
    return python_command(EXAMPLE_SCRIPT, example.argv(RUN_FLAGS))


def check_command(command: list[str]) -> None:
    """Catch the mistakes that would otherwise surface as a confusing child
    failure: no command, a missing program or a missing Python script."""
    if not command:
        raise ConfigError("no command to run")
    program = command[0]
    if shutil.which(program) is None and not Path(program).is_file():
        raise ConfigError(f"command not found: {program}")
    script = _script_word(command)
    if script is not None and not Path(script).is_file():
        raise ConfigError(f"script not found: {script}")


def script_of(command: list[str], cwd: Path | None = None) -> Path | None:
    """The Python script a command runs, if it runs one; ``cwd``: the
    directory the command ran in (default: this process's)."""
    script = _script_word(command)
    return (Path(cwd or ".") / script).resolve() if script is not None else None


def _script_word(command: list[str]) -> str | None:
    if is_python(command[0]):
        script = next((a for a in command[1:] if not a.startswith("-")), None)
        if script is not None and script.endswith(".py"):
            return script
    return None


def python_command(script: Path, args: list[str]) -> list[str]:
    """``script`` run by this Python."""
    return [sys.executable, str(script), *args]
