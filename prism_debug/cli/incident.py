"""``prism-debug incident``: a production incident's flight-recorder dumps →
what happened, in a few lines, and a scenario that reproduces it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from prism_debug.cli.params import Number


@click.command("incident", context_settings={"ignore_unknown_options": True})
@click.argument("dump_dir", type=click.Path(path_type=Path))
@click.option("--prefix", help="The dump files' name before the rank [default: the one "
                               "prefix the files share].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the scenario that reproduces the incident here.")
@click.option("--world-size", type=Number(), default=None,
              help="Ranks in the job, where the dumps cannot tell [default: the largest "
                   "rank seen + 1, or the groups' sizes].")
@click.option("--gpus-per-node", type=Number(), default=8, show_default=True)
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the profile's files here.")
@click.option("--timeout-s", type=Number("--collective-timeout"), default=None,
              help="The reproduction's process-group timeout [default: the job's, from the "
                   "dumps] (a production job's 10 minutes are 10 minutes here too).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def incident_command(dump_dir, prefix, out, world_size, gpus_per_node, run_dir, timeout_s,
                     command) -> None:
    """Read the flight-recorder dumps in DUMP_DIR (torch's pickle format, any
    subset of ranks), say where the job stopped and who it waited for, and
    with --out write a scenario that reproduces it.  Give the job's command
    for one rank after -- to place the fault in its iterations (its graph is
    profiled once and cached)."""
    from prism_debug.process.paths import PRIVATE_UMASK
    from prism_debug.workflows.incident import IncidentOptions, import_incident

    os.umask(PRIVATE_UMASK)  # the scenario, the profile's files: the user's alone
    result = import_incident(IncidentOptions(
        dump_dir=dump_dir, prefix=prefix, out=out, command=tuple(command),
        world_size=world_size, gpus_per_node=gpus_per_node, run_dir=run_dir,
        timeout_s=timeout_s), click.echo)
    for line in result.summary:
        click.echo(line)
    if result.scenario is not None:
        click.echo(f"wrote {result.scenario}: reproduce it with prism-debug scenario run "
                   f"{result.scenario}")
