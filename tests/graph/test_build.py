import pytest

from prism_debug.cost import CostModel, load_profile
from prism_debug.engine.graph_engine import GraphEngine
from prism_debug.engine.replay import ReplayEngine
from prism_debug.graph import ExecutionGraph, FamilyRecorder, GraphError, GroupRef, Mesh
from prism_debug.graph.build import (
    RecordedEnd,
    RecordedIssue,
    RecordedWait,
    SliceRecord,
    build_graph,
    infer_mesh,
    representatives,
)
from tests.graph.test_families import megatron_groups


def families(world, tp, pp):
    recorder = FamilyRecorder(world)
    for ranks, desc in megatron_groups(world, tp=tp, pp=pp):
        recorder.add(ranks, desc)
    return tuple(f.to_dict() for f in recorder.summaries())


def test_the_megatron_layout_is_a_pp_dp_tp_mesh():
    mesh, axes = infer_mesh(8192, families(8192, tp=8, pp=4))
    assert mesh == Mesh((4, 256, 8), ("pp", "dp", "tp"))
    assert axes == {"world": ("pp", "dp", "tp"), "tp": ("tp",), "dp": ("dp",), "pp": ("pp",)}
    assert representatives(mesh, "pp") == [0, 2048, 4096, 6144]


def test_missing_axes_are_filled_in_and_flattened_families_span_axes():
    fams = [
        {"name": "world", "num_groups": 1, "group_size": 64, "stride": 1, "complete": True},
        {"name": "tp", "num_groups": 16, "group_size": 4, "stride": 1, "complete": True},
        {"name": "tp_dp", "num_groups": 4, "group_size": 16, "stride": 1, "complete": True},
    ]
    mesh, axes = infer_mesh(64, fams)
    assert mesh == Mesh((4, 4, 4), ("_axis2", "_axis1", "tp"))
    assert axes["tp_dp"] == ("_axis1", "tp")


def test_a_family_of_single_ranks_spans_no_axis_but_stays_in_the_graph(tmp_path):
    fams = families(64, tp=1, pp=4)  # DeviceMesh-style tp=1: 64 groups of one rank
    mesh, axes = infer_mesh(64, fams)
    assert mesh == Mesh((4, 16), ("pp", "dp"))
    assert axes == {"world": ("pp", "dp"), "tp": (), "dp": ("dp",), "pp": ("pp",)}
    slices = [SliceRecord(16 * s, fams, stage_iterations(s, 4)) for s in range(4)]
    graph = build_graph(64, 8, slices)
    assert graph.families["tp"] == () and graph.family_axes("tp") == ()
    graph.save(tmp_path / "g.json.gz")
    assert ExecutionGraph.load(tmp_path / "g.json.gz") == graph
    # run --graph: the script's size-1 groups match the graph, and their ops cost nothing
    cost = CostModel(load_profile("h100-ib400")).op_time_s
    GraphEngine(graph, ReplayEngine(graph, cost, real_rank=37)).group([37], GroupRef("tp", 37))
    replay = ReplayEngine(graph, cost, record=True)
    replay.run(2)
    tp_ops = [r for r in replay.records if graph.programs[r.class_id].ops[r.op].family == "tp"]
    assert len(tp_ops) == 8 and all(r.done == r.arrival for r in tp_ops)


def test_every_family_the_script_made_is_in_the_graph_used_or_not():
    fams = families(64, tp=2, pp=1) + (
        {"name": "_aux", "num_groups": 1, "group_size": 64, "stride": 1, "complete": True},)
    graph = build_graph(64, 8, [SliceRecord(0, fams, stage_iterations(0, 1))])
    assert graph.families == {"world": ("dp", "tp"), "tp": ("tp",), "dp": ("dp",), "pp": (),
                              "_aux": ("dp", "tp")}


def test_an_irregular_family_is_refused_with_its_name():
    fams = [{"name": "odd", "num_groups": 1, "group_size": 2, "stride": None, "complete": False}]
    with pytest.raises(GraphError, match="family 'odd' \\(1 groups of 2\\) does not tile"):
        infer_mesh(8, fams)


def stage_iterations(stage, num_stages, n=4, gap=0.01):
    """A pipeline stage: receive, TP all-reduce, send, DP all-reduce at the end."""
    events = []
    if stage > 0:
        events += [RecordedIssue(0.0, "recv", "pp", 64, "float32", -16), RecordedWait(0.0, 0)]
    events += [RecordedIssue(gap, "all_reduce", "tp", 64, "float32"),
               RecordedWait(0.0, len([e for e in events if isinstance(e, RecordedIssue)]))]
    if stage < num_stages - 1:
        issues = len([e for e in events if isinstance(e, RecordedIssue)])
        events += [RecordedIssue(0.0, "send", "pp", 64, "float32", 16), RecordedWait(0.0, issues)]
    events += [RecordedEnd(0.002)]
    return tuple(tuple(events) for _ in range(n))


def test_slices_compose_the_world_with_one_class_per_stage():
    fams = families(64, tp=2, pp=4)  # mesh (pp 4, dp 8, tp 2): stage stride 16
    slices = [SliceRecord(16 * s, fams, stage_iterations(s, 4)) for s in range(4)]
    graph = build_graph(64, 8, slices, command=("python", "train.py"))
    assert graph.class_axis == "pp"
    assert [len(p.ops) for p in graph.programs] == [2, 3, 3, 2]
    assert graph.programs[1].ops[0].peer == -1 and graph.programs[1].ops[2].peer == 1
    assert graph.programs[1].iteration_bytes() == {"pp": 128, "tp": 64}
    assert graph.programs[0].warmup == ()  # iteration 1 was like the rest


def test_a_slice_whose_iterations_differ_names_the_first_divergence():
    fams = families(64, tp=2, pp=1)
    iterations = list(stage_iterations(0, 1))
    iterations[3] = (RecordedIssue(0.01, "all_reduce", "dp", 64, "float32"),) + iterations[3][1:]
    with pytest.raises(GraphError) as info:
        build_graph(64, 8, [SliceRecord(0, fams, tuple(iterations))])
    assert str(info.value) == ("rank 0: iteration 4 does not repeat iteration 3: at event 0 it "
                               "has all_reduce of 64 bytes on dp where iteration 3 has "
                               "all_reduce of 64 bytes on tp")


def test_warmup_iterations_before_the_steady_state_are_kept_in_order():
    # as DDP: iteration 2 broadcasts the rebuilt bucket order, then it repeats
    fams = families(64, tp=2, pp=1)
    steady = stage_iterations(0, 1)[0]
    rebuild = (RecordedIssue(0.0, "broadcast", "world", 20, "int64"), RecordedWait(0.0, 0))
    first = (RecordedIssue(0.5, "broadcast", "world", 8, "int64"),) + steady[:1] + (
        RecordedWait(0.0, 1), RecordedEnd(0.1))
    iterations = (first, rebuild + tuple(
        RecordedWait(e.gap_s, e.issue + 1) if isinstance(e, RecordedWait) else e
        for e in steady), steady, steady)
    graph = build_graph(64, 8, [SliceRecord(0, fams, iterations)])
    (program,) = graph.programs
    assert len(program.warmup) == 2
    assert [graph.programs[0].ops[e.op].kind for e in program.warmup[1] if e.action == "issue"] \
        == ["broadcast", "all_reduce"]
    assert [e.action for e in program.steady] == ["issue", "wait", "end"]


def test_a_missing_class_says_which_rank_to_profile():
    fams = families(64, tp=2, pp=4)
    slices = [SliceRecord(16 * s, fams, stage_iterations(s, 4)) for s in (0, 1, 3)]
    with pytest.raises(GraphError, match=r"no slice for classes \[2\] along 'pp': profile one "
                                         r"rank of each \(e.g. ranks \[32\]\)"):
        build_graph(64, 8, slices)
