"""``prism-debug scenario run``: run a scenario headless and judge it.

The scenario's faults, typed values from its file, go to an ordinary run of
its command — or to a restore of its snapshot, put in force as the rank
resumes — and a baseline run without them comes first when an expectation
compares iteration times.  What the runs showed (exit code, the exception in
the rank's output, the report, the flight record torch's analyzer reads)
goes back to the pure verdicts (``scenario/plan.py``).
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from xml.sax.saxutils import escape, quoteattr

import numpy as np
from numpy.typing import NDArray

from prism_debug.controller.launch import run
from prism_debug.controller.restore import restore
from prism_debug.cost import DEFAULT_PROFILE, CostModel, HardwareProfile, load_profile
from prism_debug.errors import ConfigError
from prism_debug.example import SCRIPT as EXAMPLE_SCRIPT
from prism_debug.faults import Action, Fault, fault_text, rank_text, resolve
from prism_debug.graph import ExecutionGraph
from prism_debug.graph.selectors import ranks_text
from prism_debug.predict import predict
from prism_debug.process.interpreter import with_interpreter
from prism_debug.process.options import RestoreOptions, RunOptions, RunResult, python_command
from prism_debug.process.paths import default_run_dir, make_run_dir, open_store
from prism_debug.scenario import Scenario, plan
from prism_debug.scenario.model import (
    ExpectFlightRecord,
    ExpectNanAt,
    Run,
    only_real_ranks_message,
)
from prism_debug.snapshot.manifest import Manifest
from prism_debug.snapshot.store import sha256_file
from prism_debug.variability import Variability
from prism_debug.variability.model import StochasticCompute
from prism_debug.workflows.fr_analyzer import FR_TRACE_TIMEOUT_S, run_fr_trace
from prism_debug.workflows.graph_cache import cached_graph

# samples of a scenario's predicted percentile: p99 over 200 × K iterations
PREDICT_SAMPLES = 200

_FR_TRACE_TIMEOUT_S = FR_TRACE_TIMEOUT_S
Message = Callable[[str], None]


@dataclasses.dataclass
class ScenarioResult:
    scenario: Scenario
    verdicts: list[plan.Verdict]
    run_dir: Path
    duration_s: float
    predicted_ratio: float | None = None  # (several real ranks: the lowest's)
    # several real ranks: each one's predicted ratio (empty for one)
    predicted_ratios: dict[int, float] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def to_dict(self) -> dict:
        ratios = {"predicted_ratios": {str(r): x for r, x in self.predicted_ratios.items()}} \
            if self.predicted_ratios else {}
        return {"scenario": self.scenario.name, "source": self.scenario.source,
                "passed": self.passed, "run_dir": str(self.run_dir),
                "duration_s": round(self.duration_s, 3),
                "predicted_ratio": self.predicted_ratio, **ratios,
                "expectations": [{"kind": v.expectation.kind, "line": v.expectation.line,
                                  "passed": v.passed, "detail": v.detail}
                                 for v in self.verdicts]}


@dataclasses.dataclass(frozen=True)
class _Job:
    """What a scenario runs, resolved before anything starts: its snapshot (if
    it restores one), hardware, command, graph, faults and variability."""

    manifest: Manifest | None
    profile: HardwareProfile
    command: list[str]
    graph_path: Path | None
    graph: ExecutionGraph | None
    faults: tuple[Fault, ...]
    variability: Variability | None
    watch_nonfinite: bool


def run_scenario(scenario: Scenario, message: Message = lambda line: None, *,
                 run_dir: Path | None = None, store: Path | None = None) -> ScenarioResult:
    """Run ``scenario`` (a command, the example, or a snapshot of ``store``)
    with its faults, and judge what it showed: resolve the job, start a
    baseline if an expectation compares with one, predict what the replay
    engine expects, run with the faults, then judge."""
    started = time.monotonic()
    run_dir = (run_dir or default_run_dir()).resolve()
    make_run_dir(run_dir)
    job = _resolve(scenario, run_dir, store, message)
    start = _starter(scenario, job, run_dir, store)
    baseline = None
    if plan.needs_baseline(scenario):
        message("scenario: baseline run, without the faults")
        baseline = observe(start("baseline", False, None, _quiet(message)))
    predicted, ratios = _predicted_ratios(scenario, job, message)
    predicted_times = None
    if plan.needs_distribution(scenario):
        predicted_times = _predicted_times(scenario, job)
        message(f"scenario: prism-debug predict: {predicted_times.size} iterations of rank "
                f"{scenario.world.rank} over {len(predicted_times)} samples")
    message(f"scenario: {scenario.name}: run with the faults")
    observed = observe(start("run", True, run_dir / "report.json", message))
    several = scenario.world.several_real_ranks
    verdicts = plan.evaluate(scenario, observed, baseline, ratios if several else predicted,
                             predicted_times)
    return ScenarioResult(scenario, verdicts, run_dir, time.monotonic() - started, predicted,
                          ratios if several else {})


def _resolve(scenario: Scenario, run_dir: Path, store: Path | None,
             message: Message) -> _Job:
    """The job a scenario runs, checked against what only now can be known (its
    snapshot in the store, a graph profiled just now), its faults resolved."""
    spec, world = scenario.run, scenario.world
    manifest = _snapshot(scenario, spec.snapshot, store) if spec.snapshot is not None else None
    hardware = manifest.hardware if manifest is not None else spec.hardware or DEFAULT_PROFILE
    profile = dataclasses.replace(load_profile(hardware), gpus_per_node=world.gpus_per_node)
    command = (manifest.command if manifest is not None
               else scenario_command(scenario.run, scenario.source))
    graph_path = _graph(scenario, command, run_dir, message)
    if manifest is not None and graph_path is not None \
            and manifest.graph_digest != sha256_file(graph_path):
        raise ConfigError(f"{scenario.source}: run.graph {graph_path} is not the graph snapshot "
                          f"{manifest.id} was taken with: give that graph")
    graph = ExecutionGraph.load(graph_path) if graph_path else None  # once for every run
    if scenario.faults and graph is None:
        raise ConfigError(f"{scenario.source}: faults act on virtual peers replayed from an "
                          "execution graph: give run.graph (a file, or profile)")
    _check_variability(scenario, graph, manifest, message)
    faults = scenario.seeded_faults()
    for i, fault in enumerate(faults):
        _resolve_fault(scenario, i, fault, graph, message)
    watch = any(isinstance(e, ExpectNanAt) for e in scenario.expect)
    return _Job(manifest, profile, command, graph_path, graph, tuple(faults),
                scenario.variability, watch)


def _check_variability(scenario: Scenario, graph: ExecutionGraph | None,
                       manifest: Manifest | None, message: Message) -> None:
    """Stochastic peers need a graph to draw from, and a fresh run: a restored
    snapshot keeps the variability of the run it was taken in."""
    variability = scenario.variability
    if variability is None:
        return
    if graph is None:
        raise ConfigError(f"{scenario.source}: variability draws the compute of virtual "
                          "peers replayed from an execution graph: give run.graph (a "
                          "file, or profile)")
    if manifest is not None:
        raise ConfigError(f"{scenario.source}: a restored snapshot keeps the variability "
                          f"of the run it was taken in: leave variability out")
    try:
        variability.check(graph)
    except ConfigError as exc:  # a graph profiled just now, which lint could not read
        raise ConfigError(f"{scenario.source}: variability: {exc}") from exc
    message(f"scenario: variability {variability.describe()}")


def _resolve_fault(scenario: Scenario, i: int, fault: Fault, graph: ExecutionGraph | None,
                   message: Message) -> None:
    """Whom ``faults[i]`` hits, said in a line; one that would hit only real
    ranks refused (a fraction drawn with the scenario's seed, a group of a
    graph profiled just now: what lint could not see)."""
    world = scenario.world
    try:
        targets = resolve(fault, world.size, world.gpus_per_node, graph).targets
    except ConfigError as exc:  # a graph profiled just now, which lint could not read
        raise ConfigError(f"{scenario.source}:{fault.line}: faults[{i}].select: {exc}") \
            from exc
    if world.several_real_ranks and fault.action != Action.LINK:
        real = set(world.real_ranks)
        if set(targets) <= real:
            raise ConfigError(f"{scenario.source}:{fault.line}: faults[{i}].select: "
                              + only_real_ranks_message(targets, world))
        if spared := sorted(real & set(targets)):
            which = f"rank {spared[0]}" if len(spared) == 1 else f"ranks {ranks_text(spared)}"
            message(f"scenario: faults[{i}] spares real {which}: faults act on virtual "
                    "peers only")
    message(f"scenario: perturb {fault_text(fault)}" + (
        f"  ({rank_text(targets)})" if fault.select.kind in ("family", "class", "fraction")
        else ""))


class _Start(Protocol):
    """Starts one run of the scenario's job, with or without its faults."""

    def __call__(self, name: str, with_faults: bool, report: Path | None,
                 say: Message) -> RunResult: ...


def _starter(scenario: Scenario, job: _Job, run_dir: Path, store: Path | None) -> _Start:
    """How the scenario's runs start: a restore of its snapshot, with the faults
    put in force as the rank resumes, or a run of its command."""
    spec, world = scenario.run, scenario.world
    if job.manifest is not None:
        snapshot_id = spec.snapshot  # (a cut's id, for several real ranks: all of them)
        assert snapshot_id is not None  # job.manifest was read from it

        def restore_it(name: str, with_faults: bool, report: Path | None,
                       say: Message) -> RunResult:
            return restore(RestoreOptions(
                snapshot_id=snapshot_id, store=store, iterations=spec.iterations,
                run_dir=run_dir / name, bind=None, report_path=report,
                faults=job.faults if with_faults else (),
                watch_nonfinite=job.watch_nonfinite and with_faults), say)
        return restore_it

    flight_env = {}
    if any(isinstance(e, ExpectFlightRecord) for e in scenario.expect):
        # torch records only when asked; the dump goes into the run's folder
        flight_env = {"TORCH_FR_BUFFER_SIZE": "2000",
                      "TORCH_FR_DUMP_TEMP_FILE": str(run_dir / "flight" / "trace_rank_")}

    def run_it(name: str, with_faults: bool, report: Path | None, say: Message) -> RunResult:
        env = tuple(spec.env)
        if with_faults:
            env += tuple((k, v) for k, v in flight_env.items() if k not in dict(spec.env))
        return run(RunOptions(
            command=job.command, rank=world.real_ranks[0], world_size=world.size,
            ranks=world.real_ranks if world.several_real_ranks else (), profile=job.profile,
            iterations=spec.iterations, seed=scenario.seed, graph_path=job.graph_path,
            lockstep=job.graph_path is None,
            graph=job.graph, bind=None, collective_timeout_s=spec.timeout_s,
            run_dir=run_dir / name, report_path=report, env=env,
            faults=job.faults if with_faults else (), variability=job.variability,
            watch_nonfinite=job.watch_nonfinite and with_faults), say)
    return run_it


def _predicted_ratios(scenario: Scenario, job: _Job,
                      message: Message) -> tuple[float | None, dict[int, float]]:
    """The replay engine's iteration-time ratio with the faults against without,
    for the lowest real rank and for each (nothing when no expectation asks)."""
    if not plan.needs_prediction(scenario):
        return None, {}
    spec, world, manifest = scenario.run, scenario.world, job.manifest
    graph = _graph_to_predict(scenario, job)
    # a restored run's iterations count on from its snapshot's
    horizon = spec.last_iteration or (
        manifest.iteration + (spec.iterations or 4) if manifest is not None else 4)
    compute = StochasticCompute(graph, job.variability) if job.variability else None
    ratios = plan.predicted_ratios(
        graph, CostModel(job.profile).op_time_s, world.real_ranks, list(job.faults), horizon,
        first_iteration=manifest.iteration + 1 if manifest is not None else 2,
        seed=scenario.seed, compute=compute)
    predicted = ratios[world.real_ranks[0]]
    if world.several_real_ranks:
        message("scenario: the replay engine predicts iterations " + ", ".join(
            f"x{ratio:.3f} (rank {rank})" for rank, ratio in ratios.items()))
    else:
        message(f"scenario: the replay engine predicts iterations x{predicted:.3f}")
    return predicted, ratios


def _graph_to_predict(scenario: Scenario, job: _Job) -> ExecutionGraph:
    if job.graph is None:
        raise ConfigError(f"{scenario.source}: iteration_time predicted replays the world from "
                          "an execution graph: give run.graph (a file, or profile)")
    return job.graph


def _predicted_times(scenario: Scenario, job: _Job) -> NDArray[np.float64]:
    """The real rank's iteration times prism-debug predict gives for the
    scenario's world — its graph, variability, faults and seed — over the
    iterations the run's percentile counts (after the first, or after the
    snapshot a restored run resumes from): an array (samples, iterations)."""
    spec, manifest, graph = scenario.run, job.manifest, _graph_to_predict(scenario, job)
    first = manifest.iteration if manifest is not None else 1
    horizon = spec.last_iteration or first + (spec.iterations or 4) - (manifest is None)
    injections = [(fault_text(f), resolve(f, graph.world_size, graph.gpus_per_node, graph))
                  for f in job.faults]
    prediction = predict(graph, CostModel(job.profile).op_time_s,
                         scenario.variability or Variability(()),
                         samples=PREDICT_SAMPLES, iterations=max(1, horizon - first),
                         rank=scenario.world.real_ranks[0], seed=scenario.seed,
                         injections=injections, attribution=False, jobs=1)
    return prediction.times_s


def _snapshot(scenario: Scenario, snapshot_id: str, store: Path | None) -> Manifest:
    """The snapshot the scenario starts from (of a cut, for several real
    ranks: its lowest rank's, whose run's facts every rank of it shares),
    checked against its world, its faults and its expectations (a restored
    rank runs only the iterations after the snapshot's)."""
    # the manifest alone: each restore verifies the images before it starts
    world = scenario.world
    where = f"{scenario.source}: run.snapshot {snapshot_id}"
    if world.several_real_ranks:  # a cut of exactly its ranks, all in this store
        members = open_store(store).cut(snapshot_id)
        manifest = members[0]
        ranks = tuple(manifest.cut_ranks)
        if (ranks, manifest.world_size) != (world.real_ranks, world.size):
            raise ConfigError(f"{where} is a cut of ranks {ranks_text(ranks)} of "
                              f"{manifest.world_size}; the scenario's world is ranks "
                              f"{ranks_text(world.real_ranks)} of {world.size}")
    else:
        manifest = open_store(store).get(snapshot_id)
        if (manifest.rank, manifest.world_size) != (world.rank, world.size):
            raise ConfigError(f"{where} is of rank {manifest.rank} of {manifest.world_size}; "
                              f"the scenario's world is rank {world.rank} of {world.size}")
    taken = manifest.iteration
    for i, fault in enumerate(scenario.faults):
        if fault.last_iteration <= taken:
            raise ConfigError(f"{where} was taken after iteration {taken}: faults[{i}] (line "
                              f"{fault.line}) ends at iteration {fault.last_iteration:g}, "
                              "before the restored rank resumes")
    for i, expectation in enumerate(scenario.expect):
        asked = [n for _, n in expectation.iterations_named()]
        if asked and min(asked) <= taken:
            raise ConfigError(f"{where} was taken after iteration {taken}: expect[{i}] (line "
                              f"{expectation.line}) looks at iteration {min(asked)}, which the "
                              "restored rank does not run")
    return manifest


def scenario_command(spec: Run, source: str) -> list[str]:
    """The command a scenario's run starts (its file is ``source``): the
    example's, or its own with a script found beside the file (what lint
    checks, too)."""
    if spec.example is not None:
        return python_command(EXAMPLE_SCRIPT, spec.example.argv())
    assert spec.command is not None  # the model gives a run a command or the example
    command = list(spec.command)
    # a script named relative to the scenario file
    base = Path(source).resolve().parent
    for i, word in enumerate(command):
        if word.endswith(".py") and not Path(word).is_absolute() and (base / word).is_file():
            command[i] = str(base / word)
    return with_interpreter(command)  # run's rule, before the graph cache's key is made


def _graph(scenario: Scenario, command: list[str], run_dir: Path,
           message: Message) -> Path | None:
    """The graph file: the scenario's (relative to its file), or the job's from
    the graph cache (profiled now if need be), which runs of the job share."""
    spec, world = scenario.run, scenario.world
    if spec.graph is None:
        return None
    if not spec.profile_graph:
        path = Path(spec.graph)
        if not path.is_absolute():
            path = Path(scenario.source).resolve().parent / path
        if not path.is_file():
            raise ConfigError(f"{scenario.source}: run.graph {spec.graph}: no such file "
                              f"({path}); make one with prism-debug profile, or write profile")
        return path
    return cached_graph(command, world.size, world.gpus_per_node, run_dir=run_dir / "profile",
                        message=_quiet(message))


def observe(result: RunResult) -> plan.Observed:
    """What a run showed, as the verdicts (and the pytest plugin's results) read
    it; a run of several real ranks: the lowest rank's, with the run's exit
    code and each rank's own in ``ranks``."""
    if result.ranks:
        ranks = {rank: observe(result.ranks[rank]) for rank in sorted(result.ranks)}
        lowest = ranks[min(ranks)]
        return dataclasses.replace(lowest, exit_code=result.exit_code, ranks=ranks)
    events = result.events  # read once, by the run
    log = result.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
    flight = None
    dumped = next((e for e in events if e["kind"] == "flight_record"), None)
    if dumped is not None:
        flight = _analyse_flight_record(dumped)
    nonfinite = next((e["iteration"] for e in events if e["kind"] == "nonfinite"), None)
    iterations = result.report["iterations"]
    return plan.Observed(
        exit_code=result.exit_code, exception=plan.exception_from_output(log),
        iteration_times={it["iteration"]: it["time_s"] for it in iterations},
        digests={it["iteration"]: it["digest"] for it in iterations if it.get("digest")},
        nonfinite_iteration=nonfinite, flight=flight)


def _analyse_flight_record(dumped: dict, timeout_s: float | None = None) -> plan.FlightFindings:
    """Torch's own analyzer on the dump: what it prints is what the scenario
    judges, nothing the harness knows besides (without the ranks that wrote
    none, fr_trace would stop at the first missing dump instead of analysing)."""
    return run_fr_trace(Path(dumped["dir"]), dumped["prefix"], incomplete=bool(dumped["absent"]),
                        timeout_s=_FR_TRACE_TIMEOUT_S if timeout_s is None else timeout_s)


def _quiet(message: Message) -> Message:
    """Only the summary lines of the runs that support the scenario (each real
    rank's, in a run of several)."""
    return lambda line: message("  " + line) if re.sub(r"^\[rank \d+\] ", "", line).startswith(
        ("summary:", "profile: wrote", "graph:")) else None


def junit_xml(results: list[ScenarioResult]) -> str:
    """A JUnit report: one suite, a test case per expectation."""
    cases = []
    failures = 0
    for result in results:
        for verdict in result.verdicts:
            e = verdict.expectation
            name = quoteattr(f"{e.kind} (line {e.line})")
            classname = quoteattr(f"scenario.{result.scenario.name}")
            body = ""
            if not verdict.passed:
                failures += 1
                body = (f"<failure message={quoteattr(verdict.detail)}>"
                        f"{escape(verdict.detail)}</failure>")
            cases.append(f'  <testcase classname={classname} name={name} '
                         f'time="{result.duration_s:.3f}">{body}</testcase>')
    total = sum(len(r.verdicts) for r in results)
    duration = sum(r.duration_s for r in results)
    return ('<?xml version="1.0" encoding="utf-8"?>\n'
            f'<testsuite name="prism-debug scenarios" tests="{total}" failures="{failures}" '
            f'errors="0" time="{duration:.3f}">\n' + "\n".join(cases) + "\n</testsuite>\n")
