"""The commands about costs and graphs: graph show, replay, calibrate, cost."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import cast

import click

from prism_debug.cli.params import NUMBER, Number
from prism_debug.cost import (
    COLLECTIVES,
    DEFAULT_PROFILE,
    CostModel,
    Placement,
    load_profile,
    op_name,
)
from prism_debug.errors import ConfigError
from prism_debug.graph.selectors import rank_list
from prism_debug.process.options import parse_bytes


class OpName(click.ParamType):
    """A collective in any of its spellings (cost/ops.py), as its canonical name."""

    name = "op"

    def convert(self, value, param, ctx):
        return op_name(value, param.opts[0] if param is not None else "op")


@click.group()
def graph() -> None:
    """Inspect execution graphs."""


@graph.command("show")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--hardware", default=DEFAULT_PROFILE, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def graph_show(path, hardware, as_json) -> None:
    """Summarise a graph: layout, classes, bytes per family, one replayed iteration."""
    from prism_debug.engine.analysis import critical_path, summarize
    from prism_debug.engine.render import graph_summary, graph_summary_lines
    from prism_debug.graph import ExecutionGraph
    from prism_debug.graph.fits import fits_line, fits_summary

    g = ExecutionGraph.load(path)
    cost_fn = _cost_fn(hardware, g.gpus_per_node)
    summaries = summarize(g, cost_fn)
    path_segments = critical_path(g, cost_fn)
    fits = fits_summary(g.gap_fits, sum(len(p.steady) for p in g.programs))
    if as_json:
        click.echo(json.dumps(graph_summary(g, summaries, path_segments) | {"fits": fits}))
        return
    for line in graph_summary_lines(str(path), g, summaries, path_segments):
        click.echo(line)
    click.echo(fits_line(fits))


@click.command()
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--iterations", type=Number("replay --iterations"), default=3, show_default=True)
@click.option("--hardware", default=DEFAULT_PROFILE, show_default=True)
@click.option("--ranks", "ranks_text", default="", help="Ranks to report (default: one per class).")
@click.option("--perturb", "perturbations", multiple=True,
              help="Perturb the world as run --perturb does, e.g. 'hang 5 at 2 op 1 for 0.02', "
                   "'fail 13 at 3'; repeatable.  Prints each iteration's change (Δ), how "
                   "many ranks end it later, and where ranks block.")
@click.option("--scenario", "scenario_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also put a scenario file's faults in force (its world must be the "
                   "graph's); its rank is reported too.")
@click.option("--seed", type=NUMBER, default=None,
              help="The replay engine's seed, as run --seed gives it (stochastic compute "
                   "models draw from it; the graph's own gaps draw nothing) [default: the "
                   "scenario's, else 0].")
@click.option("--variability", "variability_terms", multiple=True,
              help="Stochastic peers, as run --variability (e.g. 'cv=0.05'), drawn from the "
                   "seed; with --perturb both replays draw alike [default: the scenario's].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def replay(path, iterations, hardware, ranks_text, perturbations, scenario_path, seed,
           variability_terms, as_json) -> None:
    """Replay the whole world from a graph, with no real rank: what-if questions.

    \b
    prism-debug replay gpt.prism --ranks 4097 --perturb "hang 4105 at 2 op 1 for 0.02"
    """
    from prism_debug.engine import ComputeModel, ReplayEngine
    from prism_debug.engine.render import iteration_table
    from prism_debug.faults import fault_text, parse_fault, resolve
    from prism_debug.graph import ExecutionGraph
    from prism_debug.graph.build import representatives
    from prism_debug.variability import parse_variability
    from prism_debug.variability.model import StochasticCompute

    g = ExecutionGraph.load(path)
    ranks = (rank_list(ranks_text, g.world_size, g.gpus_per_node, "--ranks")
             or representatives(g.mesh, g.class_axis))
    cost_fn = _cost_fn(hardware, g.gpus_per_node)
    # read and resolved as run --perturb reads them (a fault that hits nobody
    # is refused here, naming it)
    faults = [(text, parse_fault(text, g.world_size, g.gpus_per_node)) for text in perturbations]
    if scenario_path is not None:
        scenario = _scenario_faults(scenario_path, g, path)
        faults += [(fault_text(f), f) for f in scenario.seeded_faults()]
        ranks = list(dict.fromkeys([*ranks, *scenario.world.real_ranks])) if not ranks_text \
            else ranks
        seed = scenario.seed if seed is None else seed
    seed = seed or 0
    variability = parse_variability(variability_terms) if variability_terms else (
        scenario.variability if scenario_path is not None else None)
    compute: ComputeModel | None = None
    if variability is not None:
        variability.check(g)
        # (a ComputeModel: its gaps_s may answer one array, as ComputeModel's
        # docstring allows and its annotation does not say yet)
        compute = cast(ComputeModel, StochasticCompute(g, variability))
    if faults:
        from prism_debug.engine.whatif import what_if, what_if_lines

        injections = [(text, resolve(fault, g.world_size, g.gpus_per_node, g))
                      for text, fault in faults]
        result = what_if(g, cost_fn, injections, iterations, ranks, seed=seed, compute=compute)
        if as_json:
            click.echo(json.dumps(result.to_dict()))
            return
        for line in what_if_lines(result):
            click.echo(line)
        return
    engine = ReplayEngine(g, cost_fn, compute=compute, seed=seed)
    engine.run(iterations)
    times = {rank: engine.iteration_times(rank)[:iterations] for rank in ranks}
    if as_json:
        click.echo(json.dumps({"iterations": iterations, "times_s": times}))
        return
    for line in iteration_table(times, iterations):
        click.echo(line)


def _scenario_faults(scenario_path: Path, graph, graph_path: Path):
    """The scenario at ``scenario_path``, checked to be of ``graph``'s world."""
    from prism_debug.scenario import load_scenario

    scenario = load_scenario(scenario_path)
    world = scenario.world
    if (world.size, world.gpus_per_node) != (graph.world_size, graph.gpus_per_node):
        raise ConfigError(
            f"the scenario {scenario_path} is of a world of {world.size} ranks, "
            f"{world.gpus_per_node} per node; the graph {graph_path} of {graph.world_size}, "
            f"{graph.gpus_per_node} per node: replay a graph profiled for that world")
    return scenario


@click.command()
@click.option("--nccl-tests", "nccl_tests", multiple=True,
              help="An nccl-tests output file, as PATH or OP=PATH (repeatable).")
@click.option("--local", is_flag=True, help="Measure gloo collectives between processes here.")
@click.option("--processes", type=NUMBER, default=2, show_default=True,
              help="Processes for --local.")
@click.option("--base", default=DEFAULT_PROFILE, show_default=True,
              help="Profile whose form the nccl-tests fit keeps.")
@click.option("--no-nvls", "no_nvls", is_flag=True,
              help="The cluster has no NVLink SHARP (A100, PCIe GPUs): fit rings and trees only.")
@click.option("--name", default=None, help="Name of the fitted profile [default: from --out].")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the profile (TOML, usable as --hardware).")
def calibrate(nccl_tests, local, processes, base, no_nvls, name, out) -> None:
    """Fit a hardware profile from nccl-tests results or local gloo runs."""
    from prism_debug.cost import calibrate as fitting

    if bool(nccl_tests) == local:
        raise ConfigError("give --nccl-tests FILE (repeatable) or --local, one of the two")
    if not out.resolve().parent.is_dir():
        raise ConfigError(f"--out {out}: directory {out.resolve().parent} does not exist")
    name = name or out.stem
    if local:
        from prism_debug.workflows.local_bench import measure

        click.echo(f"calibrate: timing gloo all-reduce, send/recv, all-gather, reduce-scatter "
                   f"and broadcast between {processes} processes …")
        measurements = measure(processes)
        profile = fitting.local_profile(measurements, name=name)
    else:
        measurements = []
        for item in nccl_tests:
            op, _, path = item.rpartition("=")
            measurements.append(fitting.read_nccl_tests(
                Path(path), op_name(op, f"--nccl-tests {item}") if op else None))
        base_profile = load_profile(base)
        if no_nvls:
            base_profile = dataclasses.replace(base_profile, nvls_bw=0.0)
        profile = fitting.fit(base_profile, measurements, name)
    quality = fitting.fit_quality(CostModel(profile), measurements)
    out.write_text(fitting.to_toml(profile, quality))
    for line in fitting.fit_table(CostModel(load_profile(str(out))), measurements):
        click.echo(line)
    for line in fitting.fit_warnings(quality, local=local, cpus=os.cpu_count() or 1,
                                     load=os.getloadavg()[0]):
        click.echo(line, err=True)
    click.echo(f"calibrate: wrote {out} (use it as --hardware {out})")


def _cost_fn(hardware: str, gpus_per_node: int):
    model = CostModel(dataclasses.replace(load_profile(hardware), gpus_per_node=gpus_per_node))
    return model.op_time_s


@click.command()
@click.option("--hardware", default=DEFAULT_PROFILE, show_default=True,
              help="Hardware profile: a bundled name or a TOML file.")
@click.option("--op", type=OpName(), required=True,
              help=f"The collective: {', '.join(COLLECTIVES)} (allreduce, all-reduce … too).")
@click.option("--bytes", "size", required=True,
              help="Message size in nccl-tests' convention (e.g. 1G, 64MiB).")
@click.option("--ranks", type=NUMBER, required=True,
              help="Ranks in the group (packed onto nodes).")
@click.option("--gpus-per-node", type=NUMBER, default=None, help="[default: the profile's]")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def cost(hardware, op, size, ranks, gpus_per_node, as_json) -> None:
    """Predict one collective's time and bus bandwidth."""
    profile = load_profile(hardware)
    if gpus_per_node is not None:
        profile = dataclasses.replace(profile, gpus_per_node=gpus_per_node)
    gpn = profile.gpus_per_node
    if ranks < 1:
        raise ConfigError(f"--ranks must be at least 1, got {ranks}")
    nbytes = parse_bytes(size)
    placement = Placement.of(range(ranks), gpn)
    estimate = CostModel(profile).estimate(op, nbytes, placement)
    if as_json:
        click.echo(json.dumps({
            "hardware": profile.name, "op": op, "bytes": nbytes, "ranks": ranks,
            "nodes": placement.num_nodes, "gpus_per_node": gpn,
            "time_us": estimate.time_s * 1e6, "busbw_gbs": estimate.busbw_gbs,
            "algorithm": estimate.algorithm, "protocol": estimate.protocol,
        }))
        return
    click.echo(estimate.describe(profile.name))
