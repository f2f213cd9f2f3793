"""What ``scenario lint`` (and ``scenario run``, before anything starts) asks
of this machine: the scenario core's :class:`~prism_debug.scenario.surroundings.Machine`,
answered with the run's own code — the command a scenario starts
(``scenario_run.scenario_command``), the check a run makes of it
(``options.check_command``) and the graph cache's key.  It reads; it never
profiles or launches."""

from __future__ import annotations

from pathlib import Path

from prism_debug.errors import ConfigError
from prism_debug.process.options import check_command
from prism_debug.scenario.model import Run, World
from prism_debug.workflows.graph_cache import cache_dir, cache_key
from prism_debug.workflows.scenario_run import scenario_command


class ThisMachine:
    """The :class:`~prism_debug.scenario.surroundings.Machine` lint runs on."""

    def command_problem(self, run: Run, source: str) -> tuple[int, str] | None:
        command = scenario_command(run, source)
        try:
            check_command(command)
        except ConfigError as exc:
            missing = str(exc).rpartition(": ")[2]
            index = command.index(missing) if missing in command else 0
            if index == 0:
                return 0, (f"command not found: {missing}: give a program on PATH or the "
                           "path to one")
            beside = Path(source).resolve().parent / missing
            return index, (f"no script {missing} beside the scenario ({beside}) or in the "
                           f"current directory ({Path.cwd()}): give its path relative to the "
                           "scenario file")
        return None

    def cached_graph(self, run: Run, world: World, source: str) -> Path | None:
        command = scenario_command(run, source)
        path = cache_dir() / f"{cache_key(command, world.size, world.gpus_per_node)}.prism"
        return path if path.is_file() else None
