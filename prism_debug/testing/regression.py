"""One regression check: a job's snapshot at an iteration (recorded once,
then taken from the cache), restored, with faults put in force as it
resumes, run K iterations — what the ``prism`` fixture and marker call, and
what a script can call without pytest (:func:`regression_run`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from prism_debug import api
from prism_debug.errors import ConfigError
from prism_debug.example import SCRIPT as EXAMPLE_SCRIPT
from prism_debug.example import Example
from prism_debug.faults import Fault
from prism_debug.process.interpreter import with_interpreter
from prism_debug.process.options import python_command
from prism_debug.testing.cache import DEFAULT_HARDWARE, Job, SnapshotCache, cache_dir
from prism_debug.testing.result import DEFAULT_TIME_RTOL, PrismResult
from prism_debug.workflows.graph_cache import PROFILE_ITERATIONS

Message = Callable[[str], None]
#: what the bundled example is told to run when a test snapshots it: more
#: iterations than any test restores (a restore stops after its own K)
EXAMPLE_ITERATIONS = 1000


def job_for(*, world_size: int, rank: int, iteration: int,
            command: Iterable[str] | str | None = None,
            example: Mapping[str, Any] | None = None, hardware: str = DEFAULT_HARDWARE,
            gpus_per_node: int | None = None, seed: int = 0,
            env: Mapping[str, str] | None = None, collective_timeout_s: float | None = None,
            cwd: Path | None = None) -> Job:
    """The job a test names: ``command`` (a list, or one string split on
    spaces; a script relative to ``cwd``), or the bundled example with
    ``example``'s arguments (its ``iterations`` left out: the snapshot's run
    stops after ``iteration``).  ``collective_timeout_s``: the groups' timeout
    (a test of a dead peer waits for it), fixed in the snapshot."""
    if command is not None and example is not None:
        raise ConfigError("a prism test runs a command or the bundled example, not both")
    if iteration < 1:
        raise ConfigError(f"iteration counts from 1, got {iteration}")
    profile_command = None
    if command is None:
        arguments = dict(example or {})
        if "iterations" in arguments:
            raise ConfigError("example: leave out iterations (the snapshot's run stops after "
                              "`iteration`, the restore after `iterations` more)")
        spec = Example(**arguments)
        words = python_command(EXAMPLE_SCRIPT, dataclasses.replace(
            spec, iterations=EXAMPLE_ITERATIONS).argv())
        # its graph: the slices' iteration count, and the learning rate and
        # seed left at the example's own (they change values, not what the
        # rank sends or how long it computes), so such tests share one graph
        profile_command = tuple(python_command(EXAMPLE_SCRIPT, dataclasses.replace(
            spec, iterations=PROFILE_ITERATIONS, lr=Example().lr, seed=Example().seed).argv()))
    else:
        words = command.split() if isinstance(command, str) else list(command)
        base = Path(cwd or ".").resolve()
        # a script named relative to the test: absolute, so the key and the
        # restore find it wherever pytest runs from
        words = [str(base / w) if w.endswith(".py") and not Path(w).is_absolute()
                 and (base / w).is_file() else w for w in words]
        words = with_interpreter(words)
    return Job(tuple(words), world_size, rank, iteration, hardware, gpus_per_node, seed,
               profile_command, tuple(sorted((env or {}).items())), collective_timeout_s)


def parse_faults(faults: Iterable[Fault | str | Mapping], world_size: int) -> tuple[Fault, ...]:
    """Faults as a scenario's run takes them: typed, a perturbation line
    (``"slow rank:13 2 from 4"``), or a scenario file's mapping."""
    parsed = []
    for fault in faults:
        if isinstance(fault, Fault):
            parsed.append(fault)
        elif isinstance(fault, str):
            parsed.append(api.parse_fault(fault, world_size))
        else:
            parsed.append(api.fault_from_dict(dict(fault)))
    return tuple(parsed)


def regression_run(job: Job, *, iterations: int, run_dir: Path,
                   cache: SnapshotCache | None = None,
                   faults: Iterable[Fault | str | Mapping] = (), reload: bool = False,
                   time_rtol: float = DEFAULT_TIME_RTOL,
                   message: Message = lambda line: None) -> PrismResult:
    """Restore ``job``'s snapshot (recorded now if the cache has none), put
    ``faults`` in force, run ``iterations`` iterations; what it showed."""
    cache = cache or SnapshotCache(cache_dir())
    # reloading runs the script's edited functions in a snapshot of its old code
    manifest = cache.snapshot_for(job, message, by_contents=not reload)
    run_dir.mkdir(parents=True, exist_ok=True)
    result = api.restore(api.RestoreOptions(
        snapshot_id=manifest.id, store=cache.store, iterations=iterations,
        run_dir=run_dir / "run", bind=None,
        trace_path=run_dir / "trace.json",  # (a trace: the rank records every collective)
        faults=parse_faults(faults, job.world_size), reload=reload), message)
    return PrismResult.from_run(result, manifest.id, reload=reload, time_rtol=time_rtol)
