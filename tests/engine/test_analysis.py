"""graph show's per-class summary and critical path, against timelines worked out by
hand, and the text they are shown as."""

import dataclasses
from itertools import pairwise

import pytest

from prism_debug.engine.analysis import ClassSummary, critical_path, summarize
from prism_debug.engine.render import graph_summary, graph_summary_lines, iteration_table
from tests.engine.test_replay import (
    constant_cost,
    end,
    issue,
    pipeline_graph,
    tp_then_dp_graph,
    wait,
)


def test_the_steady_iteration_excludes_every_warmup_iteration():
    graph = tp_then_dp_graph()
    (program,) = graph.programs
    slow_start = (issue(0, 4.0), wait(0), issue(1, 1.0), wait(1), end(0.5))  # 5.7 s
    warmup = (slow_start, slow_start)
    graph = dataclasses.replace(graph, programs=(dataclasses.replace(program, warmup=warmup),))
    (summary,) = summarize(graph, constant_cost)
    assert summary == ClassSummary(class_id=0, representative=0, num_ops=2,
                                   bytes_by_family={"tp": 64, "dp": 64}, compute_s=2.5,
                                   iteration_s=pytest.approx(2.7))
    assert summary.waiting_s == pytest.approx(0.2)


def test_the_pipeline_fill_is_not_a_steady_iteration():
    # stage 1's first iteration waits 1.1 s for stage 0 (2.3 s); then 1.2 s each
    summaries = summarize(pipeline_graph(), constant_cost)
    assert [(s.representative, s.iteration_s) for s in summaries] == [
        (0, pytest.approx(1.2)), (2, pytest.approx(1.2))]


def test_the_critical_path_of_a_pipeline_runs_through_the_stage_that_sends():
    # stage 0: 1 s, TP (0.1), send (0.1); stage 1: recv, 1 s, TP.  Stage 1's
    # iteration 2 ends last; its chain: its recv waited for stage 0's send,
    # which followed stage 0's TP and compute
    path = critical_path(pipeline_graph(), constant_cost)
    assert [(s.class_id, s.what, s.duration_s) for s in path] == [
        (0, "compute", pytest.approx(1.0)),
        (0, "all_reduce on tp", pytest.approx(0.1)),
        (1, "recv on pp", pytest.approx(0.1)),
        (1, "compute", pytest.approx(1.0)),
        (1, "all_reduce on tp", pytest.approx(0.1)),
    ]
    assert path[-1].end_s - path[0].start_s == pytest.approx(2.3)
    for before, after in pairwise(path):
        assert after.start_s == pytest.approx(before.end_s)


def test_the_critical_path_of_one_class_alternates_compute_and_its_collectives():
    graph = tp_then_dp_graph()
    path = critical_path(graph, constant_cost)
    assert [(s.what, s.duration_s) for s in path] == [
        ("compute", pytest.approx(1.0)), ("all_reduce on tp", pytest.approx(0.1)),
        ("compute", pytest.approx(1.0)), ("all_reduce on dp", pytest.approx(0.1)),
        ("compute", pytest.approx(0.5))]


def test_graph_show_prints_the_classes_and_the_critical_path_of_a_pipeline():
    graph = pipeline_graph()
    summaries = summarize(graph, constant_cost)
    path = critical_path(graph, constant_cost)
    assert graph_summary_lines("g.json.gz", graph, summaries, path) == [
        "graph g.json.gz: world 4 = pp 2 x tp 2, 2 class(es) along pp",
        "families: tp (tp) · pp (pp)",
        "class    rank   ops  compute ms  iteration ms  waiting ms  bytes per iteration by family",
        "    0       0     2     1000.00       1200.00      200.00  tp 0.00 MiB, pp 0.00 MiB",
        "    1       2     2     1000.00       1200.00      200.00  pp 0.00 MiB, tp 0.00 MiB",
        "every class: 1200.00 ms per iteration (they move at one pace; the critical path shows "
        "whose)",
        "critical path of a steady iteration: 2300.00 ms in 5 links, from class 0 to class 1",
        "  compute: class 0 1000.00 ms · class 1 1000.00 ms",
        "  communication: tp 200.00 ms · pp 100.00 ms",
    ]
    assert graph_summary(graph, summaries, path)["classes"][1]["waiting_s"] == pytest.approx(0.2)


def test_graph_show_names_the_slowest_class_and_survives_an_empty_critical_path():
    summaries = [ClassSummary(0, 0, 1, {}, compute_s=0.5, iteration_s=1.0),
                 ClassSummary(1, 2, 1, {}, compute_s=0.25, iteration_s=1.5)]
    lines = graph_summary_lines("g", pipeline_graph(), summaries, [])
    assert lines[-4:] == [
        "slowest class: 1 (rank 2): 1500.00 ms per iteration, 250.00 ms of it compute",
        "critical path of a steady iteration: 0.00 ms in 0 links, from class - to class -",
        "  compute: none",
        "  communication: none",
    ]


def test_the_replay_table_has_a_column_per_iteration_and_a_row_per_rank():
    assert iteration_table({0: [1.0, 0.5], 4097: [2.25, 0.001]}, 2) == [
        "   rank    iter 1 ms    iter 2 ms",
        "      0      1000.00       500.00",
        "   4097      2250.00         1.00",
    ]
