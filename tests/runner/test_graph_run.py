"""profile → graph → run --graph, end to end, at 8,192 and 65,536 ranks."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest

from prism_debug.graph import ExecutionGraph, Mesh

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
WORLDS = [8192, 65536]
ACTIVATION = 2 * 128 * 256 * 4  # the example's micro-batch x sequence x hidden, float32
pytestmark = pytest.mark.slow


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def graphs(profiled_graph):
    """Each (script, world) profiled once for the session (None: the example)."""

    def get(script: str | None, world: int) -> Path:
        command = ["--", sys.executable, str(SCRIPTS / script)] if script else []
        return profiled_graph("--world-size", world, *command)

    return get


@pytest.mark.parametrize("world", WORLDS)
def test_the_example_graph_has_one_class_per_stage_and_the_bytes_of_its_layers(graphs, world):
    graph = ExecutionGraph.load(graphs(None, world))
    assert graph.mesh == Mesh((4, world // 32, 8), ("pp", "dp", "tp"))
    assert graph.class_axis == "pp"
    assert set(graph.families) == {"world", "tp", "dp", "pp"}
    per_block = 100_064  # TP-sharded parameters of one transformer block
    embeddings, head = 1024 * 256 + 128 * 256, 2 * 256 + 256 * 1024
    expected_dp = [4 * (2 * per_block + embeddings), 4 * 2 * per_block, 4 * 2 * per_block,
                   4 * (2 * per_block + head)]
    for stage, program in enumerate(graph.programs):
        bytes_ = program.iteration_bytes()
        # 8 micro-batches x 2 layers x (2 forward + 2 backward) TP all-reduces
        assert bytes_["tp"] == 8 * 2 * 4 * ACTIVATION
        # activations and their gradients, to and from each neighbour stage
        assert bytes_["pp"] == 8 * ACTIVATION * (2 if stage in (0, 3) else 4)
        assert bytes_["dp"] == expected_dp[stage]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("script,rank", [
    (None, 4097), ("ddp.py", 4097), ("fsdp2_tp.py", 3), ("pipeline_1f1b.py", 4097),
], ids=["example", "ddp", "fsdp2_tp", "pipeline"])
def test_runs_follow_their_graph(graphs, tmp_path, script, rank, world):
    graph = graphs(script, world)
    command = ["--", sys.executable, str(SCRIPTS / script)] if script else []
    report = tmp_path / "report.json"
    proc = cli("run", "--world-size", str(world), "--rank", str(rank), "--graph", str(graph),
               "--report", str(report), "--run-dir", str(tmp_path / "run"), *command)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    iterations = json.loads(report.read_text())["iterations"]
    assert len(iterations) >= 3
    assert all(it["time_s"] > 0 and it["num_collectives"] > 0 for it in iterations)
    replay = cli("replay", str(graph), "--ranks", str(rank), "--json")
    assert replay.returncode == 0, replay.stderr
    assert len(json.loads(replay.stdout)["times_s"][str(rank)]) == 3


def test_a_graph_of_another_script_is_refused_naming_the_first_mismatch(graphs, tmp_path):
    graph = graphs(None, 8192)
    proc = cli("run", "--graph", str(graph), "--run-dir", str(tmp_path),
               "--", sys.executable, str(SCRIPTS / "ddp.py"))
    assert proc.returncode == 2
    # DDP's first op checks parameter shapes across ranks; rank 4097's stage receives first
    assert proc.stderr == (
        "prism-debug: error: the script does not follow the graph: in iteration 1 rank 4097 "
        "issued all_gather of 65536 bytes on world where the graph has recv of 262144 bytes "
        f"with the rank -1 along pp (graph {graph})\n")


def test_a_graph_of_another_world_size_is_refused(graphs, tmp_path):
    graph = graphs(None, 8192)
    proc = cli("run", "--world-size", "65536", "--graph", str(graph))
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: the graph {graph} is of a world of 8192 ranks; "
                           "this run has --world-size 65536\n")


def test_graph_show_summarises_classes(graphs):
    proc = cli("graph", "show", str(graphs(None, 8192)), "--json")
    summary = json.loads(proc.stdout)
    assert summary["mesh"] == {"pp": 4, "dp": 256, "tp": 8}
    assert [c["num_ops"] for c in summary["classes"]] == [81, 97, 97, 81]
    times = {round(c["iteration_s"], 9) for c in summary["classes"]}
    assert len(times) == 1  # in steady state every stage runs at the pipeline's pace
    path = summary["critical_path"]
    assert all(s["end_s"] >= s["start_s"] for s in path)
    assert {s["family"] for s in path} == {None, "tp", "pp", "dp"}
    for before, after in pairwise(path):  # a chain: each link starts as the last ends
        assert after["start_s"] == pytest.approx(before["end_s"], abs=1e-12)


def test_a_1f1b_critical_path_runs_through_every_stage(graphs, tmp_path):
    # With measured compute one stage may dominate (a loaded machine slows
    # whichever slice it profiled); with every gap alike, 1F1B's chain must
    # pass through each stage's compute.
    graph = ExecutionGraph.load(graphs(None, 8192))

    def alike(events):
        return tuple(dataclasses.replace(e, gap_s=1e-3) for e in events)

    programs = tuple(dataclasses.replace(p, warmup=tuple(alike(w) for w in p.warmup),
                                         steady=alike(p.steady)) for p in graph.programs)
    dataclasses.replace(graph, programs=programs).save(tmp_path / "alike.prism")
    proc = cli("graph", "show", str(tmp_path / "alike.prism"), "--json")
    path = json.loads(proc.stdout)["critical_path"]
    assert {s["class_id"] for s in path if s["family"] is None} == {0, 1, 2, 3}


def test_traced_virtual_ranks_and_who_the_longest_wait_was_for(graphs, tmp_path):
    trace, report = tmp_path / "trace.json", tmp_path / "report.json"
    proc = cli("run", "--graph", str(graphs(None, 8192)), "--trace", str(trace),
               "--trace-ranks", "4096,6144-6145", "--report", str(report),
               "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {4097: "rank 4097 (real)", 4096: "rank 4096 (virtual)",
                     6144: "rank 6144 (virtual)", 6145: "rank 6145 (virtual)"}
    spans = [e for e in events if e["ph"] == "X" and e["pid"] == 4096]
    # rank 4096 is in rank 4097's class: the same 97 ops per iteration
    assert len(spans) == 97 * 4
    for it in json.loads(report.read_text())["iterations"]:
        last = it["last_arrival"]
        assert set(last) == {"rank", "op", "family", "wait_s"}
        assert last["wait_s"] > 0 and 0 <= last["rank"] < 8192
    assert "longest wait" in proc.stdout


def test_trace_ranks_need_a_graph():
    proc = cli("run", "--lockstep", "--trace-ranks", "1", "--trace", "/tmp/x.json")
    assert proc.returncode == 2
    assert proc.stderr == ("prism-debug: error: --trace-ranks needs a graph (not --lockstep) and "
                           "--trace: in lockstep virtual peers simply do what the real rank "
                           "does\n")
