"""``prism-debug predict``: step time as a random variable, by Monte Carlo
over the whole world's graph (prism_debug.predict)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import click

from prism_debug.cli.params import Number
from prism_debug.cost import DEFAULT_PROFILE, CostModel, load_profile
from prism_debug.errors import ConfigError, VariabilityError


class Slowdown(click.ParamType):
    """x of P(iteration time > x × deterministic): a positive, finite number."""

    name = "x"

    def convert(self, value, param, ctx):
        try:
            x = float(value)
        except ValueError:
            raise ConfigError(f"--slowdown: {str(value)[:40]!r} is not a number: give a "
                              "factor such as 1.1") from None
        if not (math.isfinite(x) and x > 0):
            raise ConfigError(f"--slowdown must be a positive number, got {value}")
        return x


@click.command("predict")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
# (the defaults are the core's, read when the command runs: importing the
# engine for every prism-debug command would slow them all)
@click.option("--samples", type=Number("--ranks"), default=None,
              help="Monte Carlo samples: replays of the whole world [default: 1000].")
@click.option("--iterations", type=Number("replay --iterations"), default=None,
              help="Steady iterations per sample (K), after the warm-up [default: 5].")
@click.option("--variability", "variability_terms", multiple=True,
              help="How the compute varies, e.g. 'cv=0.05', 'class=3 cv=0.1 dist=gamma', "
                   "'op=all_reduce cv=0.02', 'rank-cv=0.03', 'fitted' or a YAML file; "
                   "repeatable [default: fitted, when the graph has fits].")
@click.option("--perturb", "perturbations", multiple=True,
              help="A what-if, as replay --perturb: e.g. 'slow fraction:0.01 1.2'; repeatable.")
@click.option("--hardware", default=DEFAULT_PROFILE, show_default=True,
              help="Hardware profile: a bundled name or a TOML file.")
@click.option("--rank", type=Number(), default=0, show_default=True,
              help="The rank whose iteration time is predicted.")
@click.option("--seed", type=Number(), default=0, show_default=True,
              help="Same seed, same prediction.")
@click.option("--slowdown", "slowdowns", type=Slowdown(), multiple=True,
              help="x of P(iteration time > x × the deterministic replay's); repeatable "
                   "[default: 1.05, 1.1, 1.2].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (with every sample's times).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the CDF and histogram of the iteration time here (png, svg, pdf).")
@click.option("--jobs", type=Number("--ranks"), default=None,
              help="Processes that replay samples [default: the CPU count].")
@click.option("--no-attribution", "no_attribution", is_flag=True,
              help="Skip the tail attribution (it replays up to 100 samples once more per "
                   "class and top op kind).")
def predict_command(path, samples, iterations, variability_terms, perturbations, hardware,
                    rank, seed, slowdowns, as_json, plot_path, jobs, no_attribution) -> None:
    """Predict the step time's distribution by Monte Carlo over a graph.

    \b
    prism-debug predict gpt.prism --variability cv=0.05 --perturb "slow fraction:0.01 1.2"
    """
    from prism_debug.faults import parse_fault, resolve
    from prism_debug.graph import ExecutionGraph
    from prism_debug.predict import (
        DEFAULT_ITERATIONS,
        DEFAULT_SAMPLES,
        DEFAULT_SLOWDOWNS,
        predict,
        prediction_lines,
    )
    from prism_debug.variability import parse_variability

    if plot_path is not None and not plot_path.resolve().parent.is_dir():
        raise ConfigError(f"--plot {plot_path}: directory {plot_path.resolve().parent} does "
                          "not exist")
    graph = ExecutionGraph.load(path)
    if not variability_terms:
        if not any(fit is not None for fits in getattr(graph, "gap_fits", {}).values()
                   for fit in fits):
            raise VariabilityError(
                f"{path} holds no fitted distributions (profile the job again for them, with "
                "repeated steady iterations): give --variability, e.g. --variability cv=0.05")
        variability_terms = ("fitted",)
    variability = parse_variability(variability_terms)
    cost_fn = CostModel(dataclasses.replace(load_profile(hardware),
                                            gpus_per_node=graph.gpus_per_node)).op_time_s
    # read and resolved as replay --perturb reads them
    injections = [(text, resolve(parse_fault(text, graph.world_size, graph.gpus_per_node),
                                 graph.world_size, graph.gpus_per_node, graph))
                  for text in perturbations]
    prediction = predict(graph, cost_fn, variability, samples=samples or DEFAULT_SAMPLES,
                         iterations=iterations or DEFAULT_ITERATIONS,
                         rank=rank, seed=seed, injections=injections,
                         slowdowns=slowdowns or DEFAULT_SLOWDOWNS,
                         attribution=not no_attribution, jobs=jobs)
    if plot_path is not None:
        from prism_debug.predict.plot import plot_prediction

        plot_prediction(prediction, plot_path)
    if as_json:
        click.echo(json.dumps(prediction.to_dict()))
    else:
        for line in prediction_lines(prediction, str(path)):
            click.echo(line)
    if plot_path is not None and not as_json:
        click.echo(f"predict: wrote {plot_path}")
