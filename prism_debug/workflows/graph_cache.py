"""The graph cache: a job profiled once, replayed by every later run of it.

``prism-debug run`` without ``--graph`` and a scenario's ``graph: profile``
both take their graph from here.  A graph is keyed by what it describes and
what built it — the command line (this Python named by its name only), the
script's contents, the world and its layout, the slices' iteration count,
and the versions of torch, prism-debug and the graph format — so an edited
script or an upgrade profiles afresh.  The cache is private (folders 0700,
files 0600: a graph holds the command line) and every file appears whole
or not at all (written aside, then linked into place: a crash or a
concurrent run leaves no half file, and the first graph written stays, so
a snapshot's graph digest keeps matching).  A job no graph can describe is
remembered too, with why, so later runs do not profile it again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import prism_debug
from prism_debug.errors import ConfigError, GraphError
from prism_debug.graph.execution import GRAPH_VERSION
from prism_debug.process.options import RunOptions, check_command, script_of
from prism_debug.process.paths import default_run_dir, user_cache_dir
from prism_debug.snapshot.store import exclusive_lock, make_private_dir, sha256_file
from prism_debug.workflows.profiling import ProfileOptions, profile

CACHE_ENV = "PRISM_DEBUG_GRAPH_CACHE"
PROFILE_ITERATIONS = 4  # per slice: a warm-up, and a steady state to compare
Message = Callable[[str], None]
MAX_REASON = 2000  # characters of a .unprofilable file read back


def cache_dir() -> Path:
    """``$PRISM_DEBUG_GRAPH_CACHE``, else ``$XDG_CACHE_HOME/prism-debug/graphs``."""
    return user_cache_dir(CACHE_ENV, "graphs")


def cache_key(command: list[str], world_size: int, gpus_per_node: int,
              iterations: int = PROFILE_ITERATIONS) -> str:
    """What a graph of ``command`` depends on, hashed (16 hex digits)."""
    script = script_of(command)
    facts = {
        # this Python by name, so a moved checkout keeps its graphs; another
        # interpreter (another venv, another torch) keeps its whole path
        "command": [_canonical(word, script) for word in command],
        "script": sha256_file(script) if script is not None and script.is_file() else "",
        "world_size": world_size, "gpus_per_node": gpus_per_node, "iterations": iterations,
        "torch": package_version("torch"), "prism_debug": prism_debug.__version__,
        "graph_format": GRAPH_VERSION,
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]


def _canonical(word: str, script: Path | None) -> str:
    """One spelling per job: `python my_ddp.py` run in ~/job and a scenario's
    `~/job/my_ddp.py` are one command, so they share one graph."""
    if word == sys.executable:
        return Path(word).name
    if script is not None and word.endswith(".py") and Path(word).resolve() == script:
        return str(script)
    return word


def cached_graph(command: list[str], world_size: int, gpus_per_node: int, *,
                 run_dir: Path | None, message: Message) -> Path:
    """The graph file of ``command`` in this layout: the cached one, or a new
    profile of it (its progress to ``message``), cached.  GraphError when no
    graph can describe the job (now, or when it was profiled before);
    LaunchError when a slice of the script fails."""
    cache = cache_dir()
    key = cache_key(command, world_size, gpus_per_node)
    path = cache / f"{key}.prism"
    refused = cache / f"{key}.unprofilable"
    if not path.is_file() and not refused.is_file():
        make_private_dir(cache)
        # runs of one job started together profile it once: the others wait
        # for the first one's graph (the kernel lets the lock go if it dies)
        with exclusive_lock(cache / f"{key}.lock"):
            if not path.is_file() and not refused.is_file():
                _profile_into(command, world_size, gpus_per_node, path, refused,
                              run_dir=run_dir, message=message)
                return path
    if path.is_file():
        message(f"graph: {path} (cached: profiled before for this command, script and layout)")
        return path
    raise GraphError(f"{_reason(refused)} (profiled before; remove {refused} to profile "
                     "again)")


def _profile_into(command: list[str], world_size: int, gpus_per_node: int, path: Path,
                  refused: Path, *, run_dir: Path | None, message: Message) -> None:
    """Profile the job into the cache: its graph at ``path``, or why no graph
    can describe it at ``refused``."""
    cache = path.parent
    key = path.stem
    message(f"graph: profiling the job once into {path} ({PROFILE_ITERATIONS} iterations per "
            "slice, one slice per rank class)")
    partial = cache / f"{key}.{os.getpid()}.partial"
    started = time.perf_counter()
    try:
        profile(ProfileOptions(command=command, world_size=world_size,
                               gpus_per_node=gpus_per_node, iterations=PROFILE_ITERATIONS,
                               out=partial, run_dir=run_dir),
                lambda line: None if line.startswith("profile: wrote") else message(line))
        _publish(partial, path)
        message(f"graph: profiled in {time.perf_counter() - started:.1f} s; cached "
                f"{path} ({path.stat().st_size} bytes)")
    except GraphError as exc:
        partial.write_text(str(exc) + "\n", encoding="utf-8")
        _publish(partial, refused)
        raise
    finally:
        for left in (partial, partial.with_name(partial.name + ".tmp")):  # (graph.save's)
            left.unlink(missing_ok=True)


def with_graph(options: RunOptions, message: Message) -> RunOptions:
    """``options`` with the graph ``profile_graph`` asks for, from the cache
    or profiled now; where no graph can describe the job, lockstep peers and
    a warning that says why — or an error, when the run's faults or traced
    ranks need a graph."""
    if not options.profile_graph:
        return options
    command = options.profile_command or options.command
    check_command(command)
    run_dir = options.run_dir or default_run_dir()
    try:
        path = cached_graph(command, options.world_size, options.profile.gpus_per_node,
                            run_dir=run_dir / "profile", message=message)
    except GraphError as exc:
        if options.faults or options.trace_ranks:
            needs = "--perturb" if options.faults else "--trace-ranks"
            raise ConfigError(f"{needs} needs an execution graph, and none can describe this "
                              f"job: {exc}") from exc
        message(f"prism-debug: warning: virtual peers arrive in lockstep, as no execution "
                f"graph can describe this job: {exc}. --lockstep skips profiling and this "
                "warning")
        return dataclasses.replace(options, lockstep=True, profile_command=None,
                                   run_dir=run_dir)
    return dataclasses.replace(options, graph_path=path, profile_command=None,
                               run_dir=run_dir)


def _reason(refused: Path) -> str:
    """Why a job was found unprofilable, as its file says: one line of at most
    ``MAX_REASON`` characters, whatever the file holds (it is read back into
    an error message, so a damaged or planted one cannot flood or break it)."""
    with refused.open("rb") as f:
        text = f.read(MAX_REASON).decode("utf-8", errors="replace")
    line = " ".join(text.split()) or "no graph can describe this job"
    return line if len(line) < MAX_REASON else line[:MAX_REASON - 1] + "…"


def _publish(partial: Path, path: Path) -> None:
    """Put a finished file in place, private, unless another run's is there
    already (that one stays: runs and snapshots may already rest on it)."""
    partial.chmod(0o600)
    try:
        os.link(partial, path)
    except FileExistsError:
        pass
    except OSError:  # a file system without hard links: the last run's stays
        os.replace(partial, path)


def package_version(package: str) -> str:
    """The installed version of ``package`` ("" when it is not installed)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""
