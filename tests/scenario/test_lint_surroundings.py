"""What lint knows beyond a scenario's text: the script its command runs, its
graph file (or the graph cache's graph of its job) and what that graph says
of the faults — each problem with its file, line and column, found without
profiling or launching anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prism_debug.cost import bundled_profiles
from prism_debug.errors import ConfigError
from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec
from prism_debug.scenario import lint, load_scenario, parse_scenario
from prism_debug.workflows.graph_cache import cache_dir, cache_key
from prism_debug.workflows.scenario_lint import ThisMachine
from prism_debug.workflows.scenario_run import run_scenario, scenario_command


def issue(op: int, gap: float = 0.0) -> Event:
    return Event("issue", gap, op)


def wait(op: int) -> Event:
    return Event("wait", 0.0, op)


def two_stage_graph() -> ExecutionGraph:
    """pp=2 x tp=2 (4 ranks, 2 per node).  Stage 0 issues 3 ops in its first
    (warm-up) iteration and 2 in every later one; stage 1 issues 2."""
    end = Event("end", 0.0)
    stage0 = ClassProgram(
        0, (OpSpec("all_reduce", "tp", 64), OpSpec("send", "pp", 64, peer=1),
            OpSpec("all_reduce", "tp", 8)),
        ((issue(2), wait(2), issue(0, 1.0), wait(0), issue(1), wait(1), end),),
        (issue(0, 1.0), wait(0), issue(1), wait(1), end))
    stage1 = ClassProgram(
        1, (OpSpec("recv", "pp", 64, peer=-1), OpSpec("all_reduce", "tp", 64)),
        ((issue(0), wait(0), issue(1, 1.0), wait(1), end),),
        (issue(0), wait(0), issue(1, 1.0), wait(1), end))
    return ExecutionGraph(mesh=Mesh((2, 2), ("pp", "tp")),
                          families={"tp": ("tp",), "pp": ("pp",)}, class_axis="pp",
                          programs=(stage0, stage1), gpus_per_node=2)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A scenario folder with a script and the graph file, run from elsewhere."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    two_stage_graph().save(tmp_path / "g.prism")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return tmp_path


def lint_file(path: Path, text: str) -> list[str]:
    path.write_text(text)
    return [str(p) for p in lint(text, str(path), ThisMachine())]


HEAD = "name: t\nworld: {size: 4, rank: 0, gpus_per_node: 2}\n"


# -- the command ---------------------------------------------------------------------------


def test_a_script_beside_the_scenario_or_in_the_working_directory_is_found(folder):
    s = folder / "s.yaml"
    assert lint_file(s, HEAD + "run: {command: [python, train.py, --lr, 3e-4]}\n") == []
    (folder / "elsewhere" / "here.py").write_text("")
    assert lint_file(s, HEAD + "run: {command: [python, here.py]}\n") == []
    assert lint_file(s, HEAD + f"run: {{command: [python, {folder / 'train.py'}]}}\n") == []


def test_a_missing_script_or_program_is_named_at_its_word(folder):
    s = folder / "s.yaml"
    assert lint_file(s, HEAD + "run: {command: [python, -u, trian.py, --lr, 3]}\n") == [
        f"{s}:3:29: run.command[2]: no script trian.py beside the scenario "
        f"({folder / 'trian.py'}) or in the current directory ({folder / 'elsewhere'}): give "
        "its path relative to the scenario file"]
    assert lint_file(s, HEAD + "run:\n  command: pyhton train.py\n") == [
        f"{s}:4:12: run.command[0]: command not found: pyhton: give a program on PATH or "
        "the path to one"]


def test_the_hardware_profile_must_exist_as_the_run_reads_it(folder):
    s = folder / "s.yaml"
    run = "run: {command: [python, train.py], hardware: %s}\n"
    assert lint_file(s, HEAD + run % "h100-ib400") == []
    assert lint_file(s, HEAD + run % "h100-ib40") == [
        f"{s}:3:46: run.hardware: unknown hardware profile 'h100-ib40': give a TOML file or "
        f"one of {', '.join(bundled_profiles())}"]


# -- the graph file ------------------------------------------------------------------------


def test_a_graph_file_must_exist_and_load(folder):
    s = folder / "s.yaml"
    run = "run: {command: [python, train.py], graph: %s}\n"
    assert lint_file(s, HEAD + run % "g.prism") == []
    assert lint_file(s, HEAD + run % "gpt.prism") == [
        f"{s}:3:43: run.graph: no such file {folder / 'gpt.prism'}: make one with prism-debug "
        "profile, or write graph: profile"]
    (folder / "bad.prism").write_text("{}")
    assert lint_file(s, HEAD + run % "bad.prism") == [
        f"{s}:3:43: run.graph: {folder / 'bad.prism'} is not a prism-debug graph file: Not a "
        "gzipped file (b'{}'): give a file prism-debug profile wrote (a gzipped JSON graph)"]


def test_the_graph_must_be_of_the_scenarios_world(folder):
    s = folder / "s.yaml"
    run = "run: {command: [python, train.py], graph: g.prism}\n"
    assert lint_file(s, "name: t\nworld: {size: 8, rank: 0, gpus_per_node: 2}\n" + run) == [
        f"{s}:3:43: run.graph: the graph g.prism is of a world of 4 ranks; the scenario's "
        "world.size is 8"]
    assert lint_file(s, "name: t\nworld: {size: 4, rank: 0}\n" + run) == [
        f"{s}:3:43: run.graph: the graph g.prism places 2 ranks per node; the scenario's "
        "world.gpus_per_node is 8"]


def test_faults_without_a_graph_are_refused_before_anything_runs(folder):
    s = folder / "s.yaml"
    assert lint_file(s, HEAD + "run: {command: [python, train.py]}\n"
                               "faults:\n  - {action: hang, select: {ranks: '1'}}\n") == [
        f"{s}:3:1: run: faults act on virtual peers replayed from an execution graph: add "
        "graph: profile (or a graph file prism-debug profile wrote)"]


# -- the faults against the graph -----------------------------------------------------------

FAULTS = """\
run: {command: [python, train.py], graph: g.prism}
faults:
  - {action: hang, select: {family: tq, group: 0}, at: {iteration: 1, collective: 4}}
  - {action: hang, select: {family: tp, group: 2}}
  - {action: hang, select: {class: 2}}
  - {action: delay, seconds: 1, family: dpp, select: {ranks: '1'}}
  - {action: nan, family: tp, select: {family: pp, group: 1}}
  - {action: hang, select: {ranks: '1'}, at: {iteration: 2, collective: 3}}
  - {action: hang, select: {ranks: '1'}, at: {iteration: 1, collective: 3}}
  - {action: fail, select: {ranks: '3'}, at: {iteration: 1, collective: 4}}
"""


def test_families_groups_classes_and_collectives_are_checked_against_the_graph(folder):
    s = folder / "s.yaml"
    assert lint_file(s, HEAD + FAULTS) == [
        f"{s}:5:37: faults[0].select.family: no family 'tq' in the graph g.prism: did you "
        "mean 'tp'? it has tp, pp",
        # whom it selects is not known: the busiest class's count bounds it
        f"{s}:5:83: faults[0].at.collective: collective 4 is beyond the 3 collectives of "
        "iteration 1 in the graph g.prism: give 1-3",
        f"{s}:6:48: faults[1].select.group: family tp has groups 0-1 in the graph g.prism, "
        "not 2",
        f"{s}:7:36: faults[2].select.class: class 2 does not exist: the graph g.prism has "
        "classes 0-1",
        f"{s}:8:41: faults[3].family: no family 'dpp' in the graph g.prism: did you mean "
        "'pp'? it has tp, pp",
        # stage 0 (rank 1's, and the real rank's) issues 2 ops after its warm-up, 3 in it
        f"{s}:10:73: faults[5].at.collective: collective 3 is beyond the 2 collectives of "
        "iteration 2 in the graph g.prism: give 1-2",
        f"{s}:12:73: faults[7].at.collective: collective 4 is beyond the 3 collectives of "
        "iteration 1 in the graph g.prism: give 1-3",
    ]


def test_the_graph_cache_holds_the_graph_of_graph_profile_and_nothing_is_profiled(folder):
    s = folder / "s.yaml"
    text = HEAD + FAULTS.replace("graph: g.prism", "graph: profile")
    s.write_text(text)
    before = sorted(cache_dir().glob("*")) if cache_dir().exists() else []
    # not profiled yet: the graph's checks say nothing rather than guess
    assert lint_file(s, text) == []
    assert (sorted(cache_dir().glob("*")) if cache_dir().exists() else []) == before
    scenario = load_scenario(s)
    key = cache_key(scenario_command(scenario.run, str(s)), 4, 2)
    cache_dir().mkdir(parents=True, exist_ok=True)
    two_stage_graph().save(cache_dir() / f"{key}.prism")
    try:
        found = lint_file(s, text)
    finally:
        (cache_dir() / f"{key}.prism").unlink()
    assert found[0] == (f"{s}:5:37: faults[0].select.family: no family 'tq' in the cached "
                        "graph of this job: did you mean 'tp'? it has tp, pp")
    assert len(found) == 7


def test_the_pure_loader_checks_no_surroundings(folder):
    """Without a machine (parse_scenario, the console's scenario command) the
    text alone is checked: no script, no graph file is looked at."""
    text = HEAD + FAULTS.replace("g.prism", "absent.prism").replace("train.py", "absent.py")
    assert parse_scenario(text).run.graph == "absent.prism"


# -- the command line ----------------------------------------------------------------------


def cli(*args: str, cwd: Path, cache: Path) -> subprocess.CompletedProcess:
    env = os.environ | {"PRISM_DEBUG_GRAPH_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL, env=env, cwd=cwd)


def test_lint_prints_each_problem_as_file_line_column_and_exits_1(folder):
    (folder / "s.yaml").write_text(HEAD + "run: {command: [python, trian.py], graph: g.prism}\n"
                                   "faults:\n  - {action: hang, select: {family: dq, group: 0}}\n")
    (folder / "ok.yaml").write_text(HEAD + "run: {command: [python, train.py], graph: g.prism}\n")
    proc = cli("scenario", "lint", "s.yaml", "ok.yaml", cwd=folder, cache=folder / "cache")
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        f"s.yaml:3:25: run.command[1]: no script trian.py beside the scenario "
        f"({folder / 'trian.py'}) or in the current directory ({folder}): give its path "
        "relative to the scenario file",
        "s.yaml:5:37: faults[0].select.family: no family 'dq' in the graph g.prism: it has "
        "tp, pp",
        "ok.yaml: ok"]
    assert proc.stderr == "2 problem(s)\n"
    # scenario run refuses it the same way, before anything starts
    proc = cli("scenario", "run", "s.yaml", "--run-dir", "runs", cwd=folder,
               cache=folder / "cache")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[0].startswith("prism-debug: error: s.yaml:3:25: ")
    assert not (folder / "runs").exists() and not (folder / "cache").exists()


@pytest.mark.slow
def test_the_bundled_examples_lint_clean_against_the_examples_graph(example_graph, tmp_path):
    """With the example's real graph in the cache under each scenario's key,
    its families, classes and collectives are checked too — and hold."""
    examples = sorted((Path(__file__).resolve().parents[2] / "examples" / "scenarios")
                      .glob("*.yaml"))
    cache = tmp_path / "cache"
    cache.mkdir()
    for path in examples:
        scenario = load_scenario(path)
        key = cache_key(scenario_command(scenario.run, str(path)), 64, 8)
        (cache / f"{key}.prism").write_bytes(example_graph.read_bytes())
    proc = cli("scenario", "lint", *map(str, examples), cwd=tmp_path, cache=cache)
    assert proc.returncode == 0 and proc.stdout.splitlines() == [f"{p}: ok" for p in examples]
    # and the cached graph is read: a family the example has not is found
    broken = tmp_path / "broken.yaml"
    broken.write_text(examples[2].read_text().replace('{ranks: "13"}',
                                                      "{family: dq, group: 0}"))
    key = cache_key(scenario_command(load_scenario(broken).run, str(broken)), 64, 8)
    assert key in {p.stem for p in cache.glob("*.prism")}
    proc = cli("scenario", "lint", str(broken), cwd=tmp_path, cache=cache)
    assert proc.stdout.splitlines() == [
        f"{broken}:14:22: faults[0].select.family: no family 'dq' in the cached graph of this "
        "job: did you mean 'dp'? it has world, tp, dp, pp"]


def test_a_selector_a_just_profiled_graph_refuses_names_its_line_when_run(folder):
    """What lint could not check (the graph is profiled by the run itself) is
    still refused before the rank starts, at the fault's line."""
    s = folder / "s.yaml"
    s.write_text(HEAD + "run: {command: [python, train.py], graph: g.prism}\n"
                        "faults:\n  - {action: hang, select: {family: dq, group: 0}}\n")
    scenario = load_scenario(s)  # the text alone: as if the graph came later
    with pytest.raises(ConfigError) as caught:
        run_scenario(scenario, run_dir=folder / "runs")
    assert str(caught.value) == (f"{s}:5: faults[0].select: family:dq:0: no family 'dq': the "
                                 "graph has tp, pp")
    assert not (folder / "runs" / "run").exists()


def test_variability_needs_a_graph_and_names_classes_and_op_kinds_it_has(folder):
    s = folder / "s.yaml"
    assert lint_file(s, HEAD + "run: {command: [python, train.py]}\n"
                               "variability:\n  - {cv: 0.05}\n") == [
        f"{s}:3:1: run: variability draws the compute of virtual peers replayed from an "
        "execution graph: add graph: profile (or a graph file prism-debug profile wrote)"]
    assert lint_file(s, HEAD + "run: {command: [python, train.py], graph: g.prism}\n"
                               "variability:\n  - {cv: 0.05}\n  - {class: 1, op: recv, "
                               "cv: 0.1}\n") == []
    (found,) = lint_file(s, HEAD + "run: {command: [python, train.py], graph: g.prism}\n"
                                   "variability:\n  - {class: 2, cv: 0.1}\n")
    assert found.startswith(f"{s}:4:1: variability: ") and "class 2" in found
    assert found.endswith("(the graph g.prism)")
