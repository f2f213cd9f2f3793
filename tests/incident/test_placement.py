"""A collective of the dumps placed in the job's iterations (counted by hand
on a graph built for it), and the scenario written from an incident, read
back by the scenario loader."""

import pytest

from prism_debug.errors import ScenarioError
from prism_debug.faults import Action
from prism_debug.graph.execution import ClassProgram, Event, ExecutionGraph, Mesh, OpSpec
from prism_debug.incident.analysis import Group, analyse
from prism_debug.incident.dumps import read_dumps
from prism_debug.incident.placement import family_of, place
from prism_debug.incident.reproduce import Reproduction, scenario_text
from prism_debug.scenario.loader import parse_scenario
from tests.incident.shapes import world_job


def issue_wait(op):
    return (Event("issue", 0.001, op), Event("wait", 0.0, op))


TP, DP = OpSpec("all_reduce", "tp", 4096), OpSpec("all_reduce", "dp", 8192)
# dp 2 x tp 2 (rank = 2 dp + tp); the first iteration all-reduces dp once, the
# steady ones all-reduce tp twice, then dp
GRAPH = ExecutionGraph(
    mesh=Mesh((2, 2), ("dp", "tp")),
    families={"world": ("dp", "tp"), "tp": ("tp",), "dp": ("dp",)}, class_axis=None,
    programs=(ClassProgram(0, (TP, DP), warmup=((*issue_wait(1), Event("end", 0.0)),),
                           steady=(*issue_wait(0), *issue_wait(0), *issue_wait(1),
                                   Event("end", 0.0))),),
    gpus_per_node=8)


@pytest.mark.parametrize("family, seq, where", [
    ("dp", 1, (1, 1)), ("dp", 2, (2, 3)), ("dp", 3, (3, 3)),  # one per iteration, third op
    ("tp", 1, (2, 1)), ("tp", 2, (2, 2)), ("tp", 3, (3, 1)),  # none in the warm-up
])
def test_the_nth_collective_of_a_family_is_counted_along_the_program(family, seq, where):
    placed = place(GRAPH, 1, family, seq)
    assert (placed.iteration, placed.collective, placed.op.family) == (*where, family)


def test_a_group_is_the_family_its_description_or_its_members_name():
    assert family_of(GRAPH, Group("7", "dp", (1, 3), (), {}), 1) == "dp"
    assert family_of(GRAPH, Group("7", "mesh_tp", (2, 3), (), {}), 3) == "tp"
    assert family_of(GRAPH, Group("8", "", (0, 2), (), {}), 0) == "dp"  # by its members
    assert family_of(GRAPH, Group("0", "default_pg", (0, 1, 2, 3), (), {}), 0) == "world"
    assert family_of(GRAPH, Group("9", "", (0, 3), (), {}), 0) is None


def test_the_graph_that_disagrees_with_the_dumps_says_so(tmp_path):
    world_job(tmp_path, 4, {0: 2, 1: 2, 2: 2, 3: 2})
    entry = read_dumps(tmp_path).dumps[0].entries[-1]  # all_reduce of 1024 Float: 4096 bytes
    assert place(GRAPH, 0, "dp", 2, entry).disagreement == \
        "the graph's all_reduce there moves 8192 bytes, the dumps' 4096"
    assert place(GRAPH, 0, "tp", 2, entry).disagreement == ""
    assert place(GRAPH, 9, "tp", 1) == "rank 9 is outside the graph's world of 4"


def test_the_written_scenario_reads_back_as_the_incident(tmp_path):
    dumps = read_dumps(world_job(tmp_path, 4, {0: 2, 1: 2, 2: 1, 3: 2}))
    incident = analyse(dumps)
    placed = place(GRAPH, 2, "dp", 2)  # (this graph's world family issues none)
    repro = Reproduction(command=("python", "train.py", "--lr", "3e-4"),
                         placements={2: placed}, timeout_s=2.0)
    text = scenario_text(incident, dumps, repro, name="incident-x")
    scenario = parse_scenario(text, "x.yaml")
    assert (scenario.world.size, scenario.world.rank) == (4, 0)
    assert scenario.run.command == ("python", "train.py", "--lr", "3e-4")
    assert (scenario.run.graph, scenario.run.iterations, scenario.run.timeout_s) == \
        ("profile", 3, 2.0)
    (fault,) = scenario.faults
    assert (fault.action, fault.select.ranks_text, fault.at.iteration, fault.at.collective) == \
        (Action.HANG, "2", 2, 3)
    kinds = [e.kind for e in scenario.expect]
    assert kinds == ["exit_code", "exception", "flight_record"]
    assert scenario.expect[2].missing_ranks == (2,)
    # without the job's command the scenario cannot run, and says what to give
    bare = scenario_text(incident, dumps, Reproduction(), name="incident-x")
    assert "#   command: [python, train.py, ...]" not in bare
    assert "prism-debug incident DIR -- COMMAND writes it" in bare
    with pytest.raises(ScenarioError, match=r"run: give one of command, example, snapshot"):
        parse_scenario(bare, "x.yaml")
