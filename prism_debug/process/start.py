"""Starting a real rank's process and reading what it left: the agent's
config, the environment torchrun would give the rank, and the report at its
end.  A run of one real rank (``launch``) and of several (``ranks``) share them.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from prism_debug.agent.config import ENV_VAR, OWNER_ENV_VAR, AgentConfig
from prism_debug.errors import GraphError, LaunchError, MissingGpu
from prism_debug.graph import ExecutionGraph
from prism_debug.process import report as reporting
from prism_debug.process.children import Follower, die_with_controller
from prism_debug.process.interpreter import never_loaded
from prism_debug.process.options import RunOptions
from prism_debug.process.paths import HOOKS_DIR, SOURCE_ROOT, USER_UMASK

Message = Callable[[str], None]


class BusEnds(Protocol):
    """What a rank's agent is told of the run's debugger bus: a session's
    ends of it (a run without a bus has none: a NoSession's are None)."""

    @property
    def commands_endpoint(self) -> str | None: ...

    @property
    def agent_curve(self) -> dict | None: ...

    @property
    def agent_secret(self) -> str | None: ...


def rank_pythonpath(env: dict[str, str], hooks: bool = False) -> str:
    """The rank's PYTHONPATH: prism-debug's source (and the hook that loads
    the agent) before the user's own (``env``'s, else this process's)."""
    own = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    return os.pathsep.join([str(HOOKS_DIR)] * hooks + [str(SOURCE_ROOT)]
                           + [p for p in [own] if p])


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


def agent_config(options: RunOptions, graph: ExecutionGraph | None, files: dict[str, Path],
                 rank: int, session: BusEnds, **more: Any) -> AgentConfig:
    """What the agent in ``rank``'s process is told (``more``: the fields of
    a run of several real ranks)."""
    profile = options.profile
    graph_path = None
    if graph is not None:
        assert options.graph_path is not None  # a run's graph is read from it (load_graph)
        graph_path = str(options.graph_path.resolve())
    return AgentConfig(
        rank=rank, world_size=options.world_size, gpus_per_node=profile.gpus_per_node,
        hardware=profile.to_dict(), seed=options.seed, values=options.values,
        events_path=str(files["events"]), iterations=options.iterations,
        record_ops=options.trace_path is not None, digests=options.digests,
        record_program=options.record_program,
        graph_path=graph_path,
        trace_ranks=options.trace_ranks, snapshot_at=options.snapshot_at,
        snapshot_every=options.snapshot_every, history=options.history is not None,
        control_path=str(files["control"]),
        bus=session.commands_endpoint, bus_curve=session.agent_curve,
        bus_secret=session.agent_secret, start_paused=options.paused,
        faults=tuple(f.to_dict() for f in options.faults),
        collective_timeout_s=options.collective_timeout_s,
        watch_nonfinite=options.watch_nonfinite,
        variability=options.variability.to_dict() if options.variability else None,
        **more,
    )


def start_rank(options: RunOptions, rank: int, files: dict[str, Path],
               config_path: Path, more_env: dict[str, str] | None = None,
               drop_env: tuple[str, ...] = ()) -> subprocess.Popen:
    """Start ``rank``'s process: the command, with the environment torchrun
    would give it and the agent told where its config is (``drop_env``: this
    process's variables the rank must not inherit)."""
    env = {k: v for k, v in os.environ.items() if k not in drop_env}
    env.update(torchrun_environment(rank, options.world_size, options.profile.gpus_per_node))
    env.update(more_env or {})
    env.update(options.env)
    env[ENV_VAR] = str(config_path)
    env.pop(OWNER_ENV_VAR, None)  # the rank's first torch-importing process claims the bus
    env["PYTHONPATH"] = rank_pythonpath(env, hooks=True)
    env.setdefault("PYTHONUNBUFFERED", "1")
    command = options.command
    if options.isolate:
        # The rank as init of a pid namespace, in a session of its own inside it
        # (CRIU refuses a session leader outside the namespace); restored
        # copies get namespaces of their own, so they can run beside it.
        command = ["unshare", "--pid", "--fork", "--kill-child", "setsid", *command]
    with open(files["log"], "ab") as log:
        try:
            # the rank dies with this process (children.py says how)
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                    preexec_fn=die_with_controller(), umask=USER_UMASK)
        except OSError as exc:
            raise LaunchError(f"cannot start {command[0]}: {exc}") from exc


def finish(follower: Follower, events_path: Path, exit_code: int, world_size: int, rank: int,
           command: list[str], hardware: str, report_path: Path | None,
           trace_path: Path | None, message: Message,
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


def check_gpu_calls(events: list[dict], exit_code: int, log: Path) -> None:
    """:class:`MissingGpu` when the rank died on a CUDA call this machine
    cannot serve (the agent's ``no_gpu`` event), naming the script's line."""
    event = next((e for e in events if e["kind"] == "no_gpu"), None)
    found = reporting.no_gpu_line(event, Path.cwd()) if event and exit_code != 0 else None
    if found is not None:
        text, path, line = found
        raise MissingGpu(text, path=path, line=line, log=log)


def check_rank_events(options: RunOptions, rank: int, events: list[dict], exit_code: int,
                      log: Path) -> None:
    """One clear error where the rank did not run as a rank: it died on a
    CUDA call, the graph did not fit it, the agent never loaded, or the
    script never made a process group."""
    check_gpu_calls(events, exit_code, log)
    error = next((e["message"] for e in events if e["kind"] == "error"), None)
    if error is not None:
        raise GraphError(f"{error} (graph {options.graph_path})", rank=rank)
    if not any(e["kind"] in ("loaded", "init") for e in events):
        raise never_loaded(options.command, exit_code, log)
    if not any(e["kind"] == "init" for e in events):
        raise LaunchError(
            f"the script never called torch.distributed.init_process_group (exit code "
            f"{exit_code}): prism-debug emulates one rank of a distributed job, so the "
            f"command must start one; its output is in {log}", log=log)
