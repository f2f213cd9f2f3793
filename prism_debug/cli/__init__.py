"""The ``prism-debug`` command line.  Commands parse and call; nothing else.

Every :class:`~prism_debug.errors.PrismError` becomes one line on stderr and
the error's exit code in :class:`~prism_debug.cli.params.ErrorsAsLines`, and
nowhere else.  The commands about costs and graphs live in :mod:`.models`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

import click
from click.core import ParameterSource

from prism_debug.cli import models
from prism_debug.cli.incident import incident_command
from prism_debug.cli.params import NUMBER, ErrorsAsLines
from prism_debug.cli.predict import predict_command
from prism_debug.cost import DEFAULT_PROFILE, load_profile
from prism_debug.errors import ConfigError, ExitCode
from prism_debug.graph.selectors import number_list, rank_list
from prism_debug.process.options import example_command


@click.group(cls=ErrorsAsLines, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="prism-debug")
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def main(verbose: int) -> None:
    """Run one rank of a huge torch.distributed job on the machine you have."""
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="prism-debug: %(levelname)s %(name)s: %(message)s")


# options run, snapshot restore and scenario share, defined once
_store_option = click.option(
    "--store", type=click.Path(file_okay=False, path_type=Path),
    help="Snapshot store [default: snapshots/ in the prism-debug checkout].")
_bind_option = click.option(
    "--bind", default="127.0.0.1", show_default=True,
    help="Address of the debugger bus (prism-debug attach): loopback keeps it on private ipc "
         "sockets; any other adds TCP with CURVE (prism-debug keys).")
_no_bus_option = click.option(
    "--no-bus", is_flag=True, help="No debugger bus: the run cannot be attached to.")


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--rank", type=NUMBER, default=4097, show_default=True,
              help="The rank to run for real.")
@click.option("--ranks", "ranks_text", default="",
              help="Run several ranks for real instead, a process each, e.g. 4096-4103: "
                   "collectives among them carry real data.")
@click.option("--world-size", type=NUMBER, default=8192, show_default=True,
              help="Ranks in the emulated job.")
@click.option("--gpus-per-node", type=NUMBER, default=None,
              help="GPUs per node [default: the hardware profile's, 8 for H100].")
@click.option("--hardware", default=DEFAULT_PROFILE, show_default=True,
              help="Hardware profile: a bundled name or a TOML file.")
@click.option("--iterations", type=NUMBER, default=None,
              help="Stop cleanly after this many iterations.")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON report here.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Chrome trace (open it in Perfetto) here.")
@click.option("--trace-ranks", default="",
              help="Virtual ranks to show in the trace, e.g. 0,4096-4103 (not with --lockstep).")
@click.option("--seed", type=NUMBER, default=0, show_default=True,
              help="Seeds torch, random and numpy in the rank, and the seeded peer values.")
@click.option("--values", type=click.Choice(["mirror", "zeros", "random"]), default="mirror",
              show_default=True, help="What virtual peers contribute to collectives.")
@click.option("--no-digest", is_flag=True, help="Skip hashing collective values.")
@click.option("--graph", "graph_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Replay virtual peers from this execution graph (prism-debug profile) "
                   "[default: the job's own, profiled on the first run and cached].")
@click.option("--lockstep", is_flag=True,
              help="Let virtual peers arrive with the real rank at every collective, "
                   "without profiling the job (no pipeline bubbles, no stragglers).")
@click.option("--snapshot-at", default="",
              help="Snapshot the rank (CRIU) after these iterations, e.g. 3,10.")
@click.option("--snapshot-every", type=NUMBER, default=None,
              help="Snapshot the rank after every K-th iteration.")
@click.option("--incremental", is_flag=True,
              help="Snapshots after the first hold only the memory that changed since the last.")
@click.option("--history", type=NUMBER, default=None,
              help="Keep snapshots of the last K iterations, so the console can step back "
                   "(back N, reverse-continue).")
@click.option("--isolate", is_flag=True,
              help="Run the rank in its own pid namespace, so restored copies of its "
                   "snapshots can run beside it.")
@_store_option
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the run's log and events go "
                   "[default: ~/.local/state/prism-debug/runs/…].")
@_bind_option
@_no_bus_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--perturb", "perturbations", multiple=True,
              help="Perturb virtual peers (not with --lockstep), e.g. 'fail 4099 at 3', "
                   "'slow node:512 1.16', 'delay 4100 0.005 family dp'; repeatable.")
@click.option("--variability", "variability_terms", multiple=True,
              help="Draw virtual peers' compute (not with --lockstep), seeded by --seed, e.g. "
                   "'cv=0.05', 'class=3 cv=0.1 dist=gamma', 'rank-cv=0.02', 'fitted', or a "
                   "YAML file of such terms; repeatable (later terms win where they overlap).")
@click.option("--collective-timeout", type=NUMBER, default=None,
              help="Seconds before NCCL's watchdog gives up on a collective [default: the "
                   "script's process-group timeout].")
@click.option("--paused", is_flag=True,
              help="Pause the rank at init_process_group until prism-debug attach continues it.")
def run(rank, ranks_text, world_size, gpus_per_node, hardware, iterations, report_path, trace_path,
        trace_ranks, seed, values, no_digest, graph_path, lockstep, snapshot_at, snapshot_every,
        incremental, history, isolate, store, run_dir, bind, no_bus, perturbations,
        variability_terms, collective_timeout, paused, command) -> None:
    """Run COMMAND as one real rank of a WORLD_SIZE job.

    \b
    prism-debug run --world-size 8192 --rank 4097 -- python train.py --lr 3e-4

    With no COMMAND, runs the bundled example (examples/train_gpt.py: a GPT
    with tp=8 x pp=4 x data parallelism). The script's exit code is the
    command's exit code.

    Virtual peers replay the job's execution graph: the first run profiles
    the job (one slice per rank class) and caches the graph; later runs of
    the same command, script and layout start at once.
    """
    from prism_debug import api  # the runner (and ZeroMQ) only for the commands that run

    _private()
    profile = load_profile(hardware)
    if gpus_per_node is not None:
        if gpus_per_node < 1:
            raise ConfigError(f"--gpus-per-node must be at least 1, got {gpus_per_node}")
        profile = dataclasses.replace(profile, gpus_per_node=gpus_per_node)
    faults = tuple(api.parse_fault(text, world_size, profile.gpus_per_node)
                   for text in perturbations)
    ranks = tuple(sorted(rank_list(ranks_text, world_size, profile.gpus_per_node, "--ranks")))
    if ranks_text.strip() and not ranks:
        raise ConfigError("--ranks names no rank: give one or more, e.g. --ranks 4096-4103")
    if ranks and click.get_current_context().get_parameter_source("rank") \
            is not ParameterSource.DEFAULT:
        raise ConfigError("--rank and --ranks exclude each other: --ranks runs all the "
                          "ranks it names for real (--ranks 4097 is --rank 4097)")
    # (with no command, api.run runs the bundled example; under torchrun, this
    # host's share of --ranks)
    options = api.RunOptions(
        command=list(command), rank=ranks[0] if ranks else rank, ranks=ranks,
        world_size=world_size, profile=profile,
        iterations=iterations, report_path=report_path, trace_path=trace_path, seed=seed,
        values=values, run_dir=run_dir, digests=not no_digest, graph_path=graph_path,
        lockstep=lockstep,
        trace_ranks=rank_list(trace_ranks, world_size, profile.gpus_per_node, "--trace-ranks"),
        snapshot_at=number_list(snapshot_at, "--snapshot-at", "iterations"),
        snapshot_every=snapshot_every, incremental=incremental, history=history,
        isolate=isolate, store=store,
        bind=None if no_bus else bind, paused=paused, faults=faults,
        variability=_variability(variability_terms),
        collective_timeout_s=collective_timeout)
    result = api.run(options, click.echo)
    store_option = f" --store {store}" if store else ""
    if result.snapshots:
        what = "every real rank from the cut" if result.ranks else "from a snapshot"
        click.echo(f"replay {what}: prism-debug snapshot restore {result.snapshots[-1]}"
                   f"{store_option} (list them: prism-debug snapshot ls{store_option})")
    elif not options.takes_snapshots and not result.ranks and result.exit_code == 0 \
            and result.report["iterations"]:
        # (after a run that failed or finished no iteration there is nothing to snapshot)
        click.echo("hint: add --snapshot-at 2 to snapshot the rank with CRIU after iteration 2; "
                   "then prism-debug snapshot ls, and prism-debug snapshot restore ID replays "
                   "it from there, bit for bit")
    sys.exit(result.exit_code)


@main.group()
def snapshot() -> None:
    """List, inspect, check, remove and restore snapshots."""
    _private()


def _store(store: Path | None):
    from prism_debug.process.paths import open_store

    return open_store(store, lambda line: click.echo(line, err=True))


def _variability(terms: tuple[str, ...]):
    """``--variability`` terms parsed (None: none given); the statistics load
    only for a run that has some."""
    if not terms:
        return None
    from prism_debug.variability import parse_variability

    return parse_variability(terms)


def _private() -> None:
    """The controller's files are the user's alone: the store, run folders,
    reports (the rank gets the user's own umask back: process/paths.py)."""
    from prism_debug.process.paths import PRIVATE_UMASK

    os.umask(PRIVATE_UMASK)


@snapshot.command("ls")
@_store_option
def snapshot_ls(store) -> None:
    """List the snapshots in the store (one that cannot be read is skipped,
    with a warning saying why)."""
    opened = _store(store)
    found, problems = opened.scan()
    for problem in problems:
        click.echo(f"prism-debug: warning: {problem}", err=True)
    if not found:
        click.echo(f"no snapshots in {opened.root}")
        return
    click.echo(f"{'id':<24} {'iteration':>9} {'rank':>7} {'world':>7} {'MiB':>8} "
               f"{'dump s':>7}  {'kind':<7}  created")
    for m in found:
        # a run's --history ring prunes its own as it moves on; the user's
        # stay; a rank's part of a cut is restored with the cut
        kind = "history" if m.history else f"cut {m.cut}" if m.cut else "user"
        click.echo(f"{m.id:<24} {m.iteration:>9} {m.rank:>7} {m.world_size:>7} "
                   f"{m.image_bytes / 2**20:>8.1f} {m.dump_s:>7.2f}  {kind:<7}  {m.created}")


@snapshot.command("show")
@click.argument("snapshot_id")
@_store_option
def snapshot_show(snapshot_id, store) -> None:
    """Print a snapshot's manifest."""
    click.echo(_store(store).get(snapshot_id).to_json(), nl=False)


@snapshot.command("verify")
@click.argument("snapshot_id")
@_store_option
def snapshot_verify(snapshot_id, store) -> None:
    """Check a snapshot's images against their checksums (every image read again)."""
    manifest = _store(store).verify(snapshot_id, rehash=True)
    click.echo(f"snapshot {manifest.id}: {len(manifest.files)} images, "
               f"{manifest.image_bytes / 2**20:.1f} MiB, checksums match")


@snapshot.command("rm")
@click.argument("snapshot_id")
@click.option("--force", is_flag=True, help="Also remove incremental snapshots built on it.")
@_store_option
def snapshot_rm(snapshot_id, force, store) -> None:
    """Remove a snapshot."""
    for removed in _store(store).remove(snapshot_id, force):
        click.echo(f"removed {removed}")


@snapshot.command("restore")
@click.argument("snapshot_id")
@click.option("--iterations", type=NUMBER, default=None,
              help="Stop after this many more iterations [default: run to the end].")
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON report here.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a Chrome trace here.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the restored run's log and events go.")
@click.option("--reload", is_flag=True,
              help="Patch functions whose source changed since the snapshot into the rank "
                   "before it goes on; refused, restoring nothing, where a change cannot be "
                   "patched (module-level code, a class's layout, decorators, defaults).")
@click.option("--lazy/--eager", default=None,
              help="Load the rank's memory as it touches it (CRIU's lazy pages: it runs "
                   "at once), or all before it runs [default: lazily where the kernel has "
                   "userfaultfd and the snapshot has no parent].")
@_bind_option
@_no_bus_option
@_store_option
def snapshot_restore(snapshot_id, iterations, report_path, trace_path, run_dir, reload, lazy,
                     bind, no_bus, store) -> None:
    """Restore a snapshot and continue the run from it."""
    from prism_debug import api

    result = api.restore(api.RestoreOptions(
        snapshot_id=snapshot_id, store=store, iterations=iterations, report_path=report_path,
        trace_path=trace_path, run_dir=run_dir, bind=None if no_bus else bind,
        reload=reload, lazy=lazy), click.echo)
    for event in result.events:
        if event.get("kind") == "reloaded":
            for line in reloaded_lines(event):
                click.echo(line)
    sys.exit(result.exit_code)


def reloaded_lines(event: dict) -> list[str]:
    """What a ``reloaded`` event says, a line each."""
    lines = [f"reload: patched {p['qualname']} ({Path(p['path']).name}:{p['line']})"
             for p in event.get("patched", [])] or ["reload: no function changed"]
    lines += [f"reload: warning: {name} was running when patched; it keeps its old code "
              "until it returns" for name in event.get("running", [])]
    return lines


@main.command()
@click.option("--rank", type=int, default=None, help="Attach to the session running this rank.")
@click.option("--session", "session_id", default=None,
              help="… or to this session (prism-debug ps).")
@click.option("--connect", default=None,
              help="… or to the controller at this command endpoint (tcp://HOST:PORT, with "
                   "CURVE and your keys).")
@click.option("--server-key", default=None,
              help="With --connect: the controller's CURVE public key (Z85, or a .key file); "
                   "default: the server key in your keys directory.")
@click.option("--command", "-c", "commands", default=None,
              help="Run these ;-separated console commands, then leave (the rank stays as it is; "
                   "a detach command releases it).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per reply.")
def attach(rank, session_id, connect, server_key, commands, as_json) -> None:
    """Attach a debugger console to a running rank.

    \b
    prism-debug attach --rank 4097
    echo "break iter 3; c; status" | prism-debug attach --rank 4097
    prism-debug attach --rank 4097 --command "pause; where; c" --json
    """
    from prism_debug.bus import sessions
    from prism_debug.bus.client import BusClient
    from prism_debug.console import Console

    if connect:
        from prism_debug.bus.keys import connect_curve

        curve = connect_curve(connect, server_key)
        probe = BusClient(connect, connect, curve)  # the events endpoint comes from hello
        try:
            probe.check_server()
            hello = probe.request("hello", client="attach")
        finally:
            probe.close()
        remote = connect.startswith("tcp://") and hello.get("remote_events")
        client = BusClient(connect, remote or hello["events"], curve)
    else:
        client = BusClient.for_session(sessions.find(rank=rank, session=session_id), rank=rank)
    with client:
        # naming the rank binds the console to it in a session of several ranks
        hello = client.request("hello", client="attach",
                               **({"rank": rank} if rank is not None and not connect else {}))
        console = Console(client, hello["rank"], json_mode=as_json)
        if commands is not None:
            sys.exit(console.run_commands(commands))
        console.cmdloop()
        sys.exit(console.exit_status)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ps(as_json) -> None:
    """List the running prism-debug sessions (stale ones are cleaned up)."""
    from prism_debug.bus import sessions

    live = sessions.live_sessions(clean=True)
    if as_json:
        click.echo(json.dumps([json.loads(s.to_json()) for s in live], indent=1))
        return
    if not live:
        click.echo("no prism-debug session is running")
        return
    click.echo(f"{'session':<24} {'pid':>7} {'world':>7}  {'ranks':<12} {'started':<25} commands")
    for s in live:
        ranks = (",".join(map(str, s.ranks)) if len(s.ranks) == 1 and s.all_ranks is None
                 else sessions.session_ranks_text(s))
        click.echo(f"{s.session:<24} {s.pid:>7} {s.world_size:>7}  {ranks:<12} {s.started:<25} "
                   f"{s.remote_commands or s.commands}{'  (CURVE)' if s.curve_public else ''}")


@main.command()
def keys() -> None:
    """Create the CURVE keys a bus bound beyond loopback needs (idempotent)."""
    from prism_debug.bus import keys as curve_keys

    paths = curve_keys.ensure_keys()
    click.echo(f"CURVE keys in {paths.directory}: server and client pairs (secrets mode 0600)")


@main.command()
def doctor() -> None:
    """Check what snapshots need: CRIU, pycriu, kernel, privileges, GPU checkpointing."""
    from prism_debug.snapshot import doctor as checks

    problems = 0
    found = checks.run_checks()
    for check in found:
        mark = "ok  " if check.ok else ("--  " if check.optional else "FAIL")
        click.echo(f"{mark} {check.name}: {check.detail}")
        if not check.ok and check.fix:
            click.echo(f"     fix: {check.fix}")
        problems += not check.ok and not check.optional
    click.echo(checks.verdict(found))
    sys.exit(ExitCode.FAILED if problems else ExitCode.OK)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option("--world-size", type=NUMBER, default=8192, show_default=True,
              help="Ranks in the emulated job.")
@click.option("--gpus-per-node", type=NUMBER, default=8, show_default=True)
@click.option("--iterations", type=NUMBER, default=4, show_default=True,
              help="Iterations per slice (a warm-up and at least two to compare).")
@click.option("--slice-ranks", default="", help="Ranks to profile, one per class, e.g. 0,2048.")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the graph.")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep each slice's log and events here.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def profile(world_size, gpus_per_node, iterations, slice_ranks, out, run_dir, command) -> None:
    """Profile one slice per rank class of COMMAND and write the execution graph.

    With no COMMAND, profiles the bundled example.
    """
    from prism_debug.workflows.profiling import ProfileOptions
    from prism_debug.workflows.profiling import profile as run_profile

    _private()
    options = ProfileOptions(
        command=list(command) or example_command(world_size), world_size=world_size,
        gpus_per_node=gpus_per_node, iterations=iterations, out=out,
        slice_ranks=rank_list(slice_ranks, world_size, gpus_per_node, "--slice-ranks"),
        run_dir=run_dir)
    run_profile(options, click.echo)


@main.group()
def scenario() -> None:
    """Check and run fault-injection scenarios (YAML files; see the Scenarios guide)."""
    _private()


@scenario.command("lint")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
def scenario_lint(files) -> None:
    """Report every error in FILES, each with its line and column."""
    from prism_debug.scenario import lint
    from prism_debug.scenario.loader import read_scenario_text
    from prism_debug.workflows.scenario_lint import ThisMachine

    problems = 0
    for path in files:
        found = lint(read_scenario_text(path), str(path), ThisMachine())
        for problem in found:
            click.echo(str(problem))
        problems += len(found)
        if not found:
            click.echo(f"{path}: ok")
    if problems:
        click.echo(f"{problems} problem(s)", err=True)
        sys.exit(ExitCode.FAILED)


@scenario.command("run")
@click.argument("files", nargs=-1, required=True,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--report", "report_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the verdicts as JSON here.")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a JUnit XML report here (a test case per expectation).")
@click.option("--run-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the runs' files here (one folder per scenario).")
@_store_option
def scenario_run(files, report_path, junit_path, run_dir, store) -> None:
    """Run each scenario headless: one PASS/FAIL line per expectation; exit
    code 0 only when all pass."""
    from prism_debug import api
    from prism_debug.process.options import check_output_paths
    from prism_debug.workflows.scenario_run import junit_xml

    check_output_paths(("--report", report_path), ("--junit", junit_path))
    from prism_debug.workflows.scenario_lint import ThisMachine

    # every file checked first, as lint checks it (scripts, graphs): nothing starts
    # when one is broken
    scenarios = [api.load_scenario(path, ThisMachine()) for path in files]
    results = []
    for i, loaded in enumerate(scenarios):
        folder = run_dir / f"{i + 1}-{loaded.name}" if run_dir else None
        click.echo(f"scenario {loaded.name} ({loaded.source})")
        result = api.run_scenario(loaded, click.echo, run_dir=folder, store=store)
        results.append(result)
        for verdict in result.verdicts:
            click.echo(verdict.line())
        click.echo(f"{'PASSED' if result.passed else 'FAILED'}: {loaded.name} "
                   f"({sum(v.passed for v in result.verdicts)}/{len(result.verdicts)} "
                   f"expectations, {result.duration_s:.1f} s; files in {result.run_dir})")
    if report_path:
        report_path.write_text(json.dumps([r.to_dict() for r in results], indent=1) + "\n")
    if junit_path:
        junit_path.write_text(junit_xml(results))
    sys.exit(ExitCode.OK if all(r.passed for r in results) else ExitCode.FAILED)


for _command in (models.graph, models.replay, models.calibrate, models.cost, predict_command,
                 incident_command):
    main.add_command(_command)
