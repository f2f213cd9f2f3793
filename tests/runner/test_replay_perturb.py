"""``replay GRAPH --perturb …`` says what a real run under ``--graph`` with
the same perturbation sees (issue 15, point 8).

A 4-rank data-parallel loop (tests/scripts/steady_steps.py: 40 ms of sleep,
then one all-reduce over the world per step) is profiled into a graph; the
what-if is then compared with a real run of rank 1 with the same graph and
the same ``--perturb``.

What is comparable, and how closely: the real rank's compute is real, so an
unperturbed iteration of the run takes the graph's time or longer (the real
rank may be the last to arrive).  In the perturbed iteration the stalled
peer arrives last, 200 ms after the graph says, so the iteration's length is
set by the graph and the stall alone — the run's then differs from the
what-if only by the real rank's own compute after the all-reduce (the
optimizer step: well under a millisecond here).  The tolerance is 5 ms.
What could break it: a real rank slower than the peer's compute plus the
stall (240 ms here; never seen), a run with another --hardware, --seed or
--gpus-per-node than the replay (the options must match), and the first
iteration, which in the run includes the rank's start-up (compared from
iteration 2 on).  A failed peer is compared by where the run's watchdog
fires: the what-if's blocked op is the run's timed-out one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import cli

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "steady_steps.py"
WORLD = ["--world-size", "4", "--gpus-per-node", "2"]
STALL = "hang 3 at 3 op 1 for 0.2"
TOLERANCE_S = 0.005
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graph(profiled_graph) -> Path:
    return profiled_graph(*WORLD, "--", sys.executable, SCRIPT)


def run(graph: Path, tmp: Path, perturb: str, *more: str) -> tuple[subprocess.CompletedProcess,
                                                                  dict]:
    report = tmp / "report.json"
    proc = cli("run", "--graph", str(graph), *WORLD, "--rank", "1", "--perturb", perturb,
               "--no-bus", "--report", str(report), "--run-dir", str(tmp / "run"), *more, "--",
               sys.executable, str(SCRIPT), "--iterations", "6")
    return proc, json.loads(report.read_text())


def test_a_stalled_peer_costs_the_run_what_the_replay_says(graph, tmp_path):
    what = cli("replay", str(graph), "--iterations", "6", "--ranks", "1", "--perturb", STALL,
               "--json")
    assert what.returncode == 0, what.stderr
    result = json.loads(what.stdout)
    replayed = result["times_s"]["1"]
    unperturbed = result["unperturbed_times_s"]["1"]
    # the what-if itself: the stall adds 0.2 s to iteration 3 (one all-reduce),
    # less what the rank computes between issuing it and waiting on it beyond
    # its cost (the profiled gap before the wait: microseconds)
    assert replayed[2] - unperturbed[2] == pytest.approx(0.2, abs=1e-3)
    assert [a - b for a, b in zip(replayed, unperturbed, strict=True)][3:] == \
        pytest.approx([0, 0, 0])
    assert result["world"][2]["delayed"] == 4
    proc, report = run(graph, tmp_path, STALL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    observed = {it["iteration"]: it["time_s"] for it in report["iterations"]}
    assert sorted(observed) == [1, 2, 3, 4, 5, 6]
    # the perturbed iteration: equal within the tolerance
    assert abs(observed[3] - replayed[2]) < TOLERANCE_S, (observed, replayed)
    # the others: the graph's time, or later where the real rank arrives last
    for i in (2, 4, 5, 6):
        assert observed[i] > replayed[i - 1] - TOLERANCE_S, (i, observed, replayed)


def test_a_failed_peer_blocks_the_replay_where_the_run_times_out(graph, tmp_path):
    what = cli("replay", str(graph), "--iterations", "4", "--ranks", "1", "--perturb",
               "fail 3 at 3", "--json")
    assert what.returncode == 0, what.stderr
    result = json.loads(what.stdout)
    assert result["blocked"]["1"] == {"iteration": 3, "op": 1, "kind": "all_reduce",
                                      "family": "world", "nbytes": 1024, "failed": False,
                                      "waiting_for": [3]}
    assert result["blocked"]["3"]["failed"] is True
    assert result["times_s"]["1"][2:] == [None, None]
    proc, report = run(graph, tmp_path, "fail 3 at 3", "--collective-timeout", "1")
    # the run: iterations 1-2, then the watchdog at the third all-reduce of the
    # world group (one per iteration: op 1 of iteration 3 is SeqNum 3)
    assert report["exit_code"] == 134
    assert [it["iteration"] for it in report["iterations"]] == [1, 2]
    assert ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
            "OpType=ALLREDUCE, NumelIn=256, NumelOut=256, Timeout(ms)=1000)") in proc.stdout
    text = cli("replay", str(graph), "--iterations", "4", "--ranks", "1", "--perturb",
               "fail 3 at 3")
    assert text.stdout.splitlines() == [
        "what-if: fail 3 at 3 (hits ranks 3)",
        "   rank    iter 1 ms    iter 2 ms    iter 3 ms    iter 4 ms",
        *text.stdout.splitlines()[2:4],
        "iteration 1: no rank ends it later",
        "iteration 2: no rank ends it later",
        "iteration 3: 4 rank(s) never end it (1 failed, 3 blocked)",
        "iteration 4: 4 rank(s) never end it (1 failed, 3 blocked)",
        "rank 1 blocks at op 1 of iteration 3: all_reduce of 1024 bytes on world, waiting for "
        "rank(s) 3 (failed): a run would time out there (NCCL's watchdog, after the group's "
        "timeout)",
        "rank 3 never arrives at op 1 of iteration 3: all_reduce of 1024 bytes on world (the "
        "fault)"]
    assert text.stdout.splitlines()[3].split() == ["Δ", "+0.00", "+0.00", "never", "never"]


def test_a_perturbation_is_read_and_refused_as_run_reads_it(graph, tmp_path):
    for fault, error in [("fail 9 at 2", "rank 9 is outside the world of 4 ranks"),
                         ("fail family:dp:0", "family:dp:0: no family 'dp': the graph has "
                                              "world")]:
        what = cli("replay", str(graph), "--perturb", fault)
        same = cli("run", "--graph", str(graph), *WORLD, "--rank", "1", "--perturb", fault,
                   "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(SCRIPT))
        assert (what.returncode, what.stderr) == (same.returncode, same.stderr) \
            == (2, f"prism-debug: error: {error}\n")
    proc = cli("replay", str(graph), "--perturb", "stall 3")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "prism-debug: error: unknown perturbation 'stall 3': use one of slow RANKS FACTOR")


def test_a_scenario_s_faults_are_the_same_what_if_as_their_perturb_lines(graph, tmp_path):
    scenario = tmp_path / "stall.yaml"
    scenario.write_text(
        "name: stall\nworld: {size: 4, rank: 1, gpus_per_node: 2}\n"
        f"run: {{command: [python, {SCRIPT}], graph: {graph}}}\n"
        "faults:\n  - action: hang\n    select: {ranks: '3'}\n"
        "    at: {iteration: 3, collective: 1}\n    for: {time_s: 0.2}\n")
    by_file = cli("replay", str(graph), "--iterations", "6", "--scenario", str(scenario),
                  "--json")
    by_line = cli("replay", str(graph), "--iterations", "6", "--ranks", "0,1", "--perturb",
                  STALL, "--json")
    assert by_file.returncode == 0, by_file.stderr
    file_result, line_result = json.loads(by_file.stdout), json.loads(by_line.stdout)
    assert file_result["perturbations"] == [{"text": "hang 3 from 3 op 1 for 0.2",
                                             "ranks": [3]}]
    # the graph's one class is reported by rank 0, and the scenario's rank 1 with it
    assert file_result["times_s"] == line_result["times_s"]
    other = tmp_path / "other.yaml"
    other.write_text(scenario.read_text().replace("size: 4", "size: 8"))
    proc = cli("replay", str(graph), "--scenario", str(other))
    assert (proc.returncode, proc.stderr) == (2, (
        f"prism-debug: error: the scenario {other} is of a world of 8 ranks, 2 per node; the "
        f"graph {graph} of 4, 2 per node: replay a graph profiled for that world\n"))
