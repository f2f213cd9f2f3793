"""A scenario that starts from a snapshot, end to end with real CRIU: the
bundled example as rank 5 of 64 is snapshotted after iteration 2; scenarios
then restore it and put their faults in force as it resumes.

A late data-parallel peer stretches iteration 3 and changes no value
(iterations 3 and 4 keep the original run's digests, bit for bit); a
fail-stopped one brings NCCL's watchdog down on the restored rank.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from prism_debug.graph import ExecutionGraph

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL,
                          env=os.environ | {"PRISM_DEBUG_GRAPH_CACHE": "/nonexistent"})


@pytest.fixture(scope="module")
def snapshot(example_graph, tmp_path_factory):
    """rank 5 of 64 with the example's graph, 2-second group timeouts,
    snapshotted after iteration 2 of 4; the store, the id, the digests."""
    tmp = tmp_path_factory.mktemp("scenario-snapshot")
    store = tmp / "store"
    proc = cli("run", "--world-size", "64", "--rank", "5", "--graph", str(example_graph),
               "--collective-timeout", "2", "--snapshot-at", "2", "--store", str(store),
               "--report", str(tmp / "original.json"), "--run-dir", str(tmp / "run"),
               "--no-bus")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (snapshot_id,) = [p.name for p in store.iterdir()]
    report = json.loads((tmp / "original.json").read_text())
    digests = {it["iteration"]: it["digest"] for it in report["iterations"]}
    assert sorted(digests) == [1, 2, 3, 4]
    return tmp, store, snapshot_id, digests


def scenario(tmp, name: str, snapshot_id: str, graph, body: str):
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\nworld: {{size: 64, rank: 5}}\n"
                    f"run: {{snapshot: {snapshot_id}, graph: {graph}, iterations: 2}}\n" + body)
    return path


def test_a_scenario_starts_from_a_snapshot(snapshot, example_graph):
    tmp, store, snapshot_id, original = snapshot
    late = scenario(tmp, "late-peer", snapshot_id, example_graph, (
        "faults:\n"
        "  - {action: delay, select: {ranks: '13'}, seconds: 0.3, family: dp,"
        " at: {iteration: 3}, for: {iterations: 1}}\n"
        "expect:\n"
        "  - exit_code: 0\n"
        "  - iteration_time: {iteration: 3, min_s: 0.3}\n"
        f"  - digests: {{3: {original[3]}, 4: {original[4]}}}\n"))
    dead = scenario(tmp, "dead-peer", snapshot_id, example_graph, (
        "faults:\n"
        "  - {action: fail, select: {ranks: '13'}, at: {iteration: 3}}\n"
        "expect:\n"
        "  - exit_code: 134\n"
        "  - exception: {type: DistBackendError, match: 'Watchdog caught collective operation"
        " timeout: WorkNCCL\\(SeqNum=3, OpType=ALLREDUCE'}\n"))
    proc = cli("scenario", "run", str(late), str(dead), "--store", str(store),
               "--report", str(tmp / "verdicts.json"), "--run-dir", str(tmp / "runs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = [line for line in proc.stdout.splitlines()
                if line.startswith(("PASS  ", "FAIL  "))]
    assert verdicts[:1] == ["PASS  exit code 0: got 0"] and len(verdicts) == 5
    assert all(line.startswith("PASS") for line in verdicts), proc.stdout
    assert f"prism-debug: restoring snapshot {snapshot_id} (rank 5 of 64, after iteration 2)" \
        in proc.stdout
    report = {r["scenario"]: r for r in json.loads((tmp / "verdicts.json").read_text())}
    assert report["late-peer"]["expectations"][2]["detail"] == (
        "digests of iterations 3, 4: equal")
    # the restored rank counted on from the snapshot: iterations 3 and 4, no more
    restored = json.loads((tmp / "runs" / "1-late-peer" / "report.json").read_text())
    assert [it["iteration"] for it in restored["iterations"]] == [3, 4]
    assert restored["restored_from"] == snapshot_id
    # (a lower bound only: a loaded machine makes iterations longer, never shorter)
    assert restored["iterations"][0]["time_s"] >= 0.3


def test_a_snapshot_scenario_refuses_what_a_restore_cannot_change(snapshot, example_graph):
    tmp, store, snapshot_id, _ = snapshot
    path = scenario(tmp, "timeouts", snapshot_id, example_graph, "")
    path.write_text(path.read_text().replace("iterations: 2}", "iterations: 2, timeout_s: 5}"))
    proc = cli("scenario", "lint", str(path))
    assert proc.returncode == 1
    column = path.read_text().splitlines()[2].index("timeout_s: 5") + len("timeout_s: ") + 1
    assert proc.stdout.splitlines() == [
        f"{path}:3:{column}: run.timeout_s: a restored snapshot keeps its process groups' "
        "timeouts: take the snapshot from a run with --collective-timeout"]
    # a graph of the same job that is not the snapshot's (lint refuses one that
    # is no graph at all before the snapshot is looked at)
    graph = ExecutionGraph.load(example_graph)
    dataclasses.replace(graph, command=("another", "job")).save(tmp / "other.prism")
    other = scenario(tmp, "other-graph", snapshot_id, tmp / "other.prism", "")
    proc = cli("scenario", "run", str(other), "--store", str(store))
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: {other}: run.graph {tmp / 'other.prism'}"
                           f" is not the graph snapshot {snapshot_id} was taken with: give that "
                           "graph\n")
