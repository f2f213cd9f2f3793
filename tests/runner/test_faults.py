"""Fault injection end to end: a data-parallel peer of the bundled example
fail-stops, and the real rank meets NCCL's watchdog — its log lines, its
``DistBackendError``, its SIGABRT — on the emulated clock."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

# rank 5 of 64 is (pp 0, dp 0, tp 5) in the example's tp=8 x pp=4 x dp=2: rank
# 13 is its only data-parallel peer
CAUGHT = ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLREDUCE, "
          "NumelIn=495040, NumelOut=495040, Timeout(ms)=2000) ran for 2000 milliseconds "
          "before timing out.")


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL,
                          env=os.environ | (env or {}))


@pytest.fixture(scope="module")
def graph(example_graph):
    return example_graph


def fail_run(graph, tmp_path, env=None):
    return cli("run", "--world-size", "64", "--rank", "5", "--graph", str(graph),
               "--perturb", "fail 13 at 3", "--collective-timeout", "2", "--report",
               str(tmp_path / "report.json"), "--run-dir", str(tmp_path / "run"), env=env)


def test_a_failed_peer_times_out_the_gradient_all_reduce_and_takes_the_rank_down(graph,
                                                                                  tmp_path):
    proc = fail_run(graph, tmp_path)
    assert proc.returncode == 134, proc.stderr  # SIGABRT, as ProcessGroupNCCL's watchdog
    said = [line.split("] ", 2)[-1] for line in proc.stdout.splitlines()
            if "ProcessGroupNCCL.cpp" in line]
    assert said == [
        f"[Rank 0] {CAUGHT}",
        "[PG ID 2 PG GUID 2 Rank 0]  failure detected by watchdog at work sequence id: 3 PG "
        "status: last enqueued work: 3, last completed work: 2",
        "Stack trace of the failed collective not found, potentially because FlightRecorder is "
        "disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero "
        "value.",
        "[Rank 0] Some NCCL operations have failed or timed out. Due to the asynchronous nature "
        "of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.",
        "[Rank 0] To avoid data inconsistency, we are taking the entire process down.",
        f"[PG ID 2 PG GUID 2 Rank 0] Process group watchdog thread terminated with exception: "
        f"[Rank 0] {CAUGHT}",
    ]
    assert ("[rank 5] terminate called after throwing an instance of 'c10::DistBackendError'"
            in proc.stdout.splitlines())
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exit_code"] == 134
    assert [it["iteration"] for it in report["iterations"]] == [1, 2]


def test_with_blocking_wait_the_script_gets_the_distbackenderror(graph, tmp_path):
    proc = fail_run(graph, tmp_path, env={"TORCH_NCCL_BLOCKING_WAIT": "1"})
    assert proc.returncode == 1, proc.stderr
    # (torch prefixes an uncaught exception's lines with "[rank5]:" itself)
    assert f"[rank 5] [rank5]: torch.distributed.DistBackendError: [Rank 0] {CAUGHT}" in \
        proc.stdout.splitlines()


def test_perturbations_need_a_graph(tmp_path):
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--perturb", "fail 13")
    assert proc.returncode == 2
    assert proc.stderr == ("prism-debug: error: --perturb needs a graph, not --lockstep: "
                           "perturbations act on virtual peers replayed from an execution "
                           "graph\n")


def test_the_console_perturbs_lists_and_clears(graph, tmp_path, monkeypatch):
    from prism_debug.bus import sessions
    from tests.runner.test_debug_session import attach, wait_for_session

    monkeypatch.setenv(sessions.ENV_VAR, str(tmp_path / "sessions"))
    run = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--world-size", "64", "--rank", "5",
         "--graph", str(graph), "--paused", "--run-dir", str(tmp_path / "run")],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_session(run)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("name: s\nworld: {size: 64, rank: 5}\nrun: {example: {}}\nfaults:\n"
                        "  - {action: slow, select: {family: dp, group: 0}, factor: 1.5}\n")
    console = attach("-c", "perturb slow node:1 2 from 2; perturb desync 13 op at 9; "
                           "perturb list; perturb clear 0; perturb list; perturb clear 4; "
                           f"scenario {scenario}; perturb list; continue")
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    assert console.stdout.splitlines()[:6] == [
        "slow node:1 2 from 2: applied now",
        "desync 13 op at 9: applied now",
        "0: slow node:1 2 from 2  (8 ranks: 8,9,10,11,…)",
        "1: desync 13 op at 9  (1 ranks: 13)",
        "slow node:1 2 from 2: cleared now",
        "0: desync 13 op at 9  (1 ranks: 13)",
    ]
    assert "no perturbation 4: perturb list shows 1" in console.stdout + console.stderr
    # a scenario's faults, their selectors resolved by the rank against its graph
    assert console.stdout.splitlines()[-5:-1] == [
        "slow family:dp:0 1.5: applied now",
        "s: 1 fault(s) in force; its expectations are judged by prism-debug scenario run",
        "0: desync 13 op at 9  (1 ranks: 13)",
        "1: slow family:dp:0 1.5  (2 ranks: 0,8)",
    ]


@pytest.mark.serial  # real compute against wall time, within 50 ms
def test_a_late_peer_and_a_stall_stretch_exactly_their_iterations(graph, tmp_path):
    # rank 13 reaches every dp collective of iteration 2 0.3 s late, then
    # stalls 0.5 s at its first dp all-reduce of iteration 3 (its only dp op
    # per iteration): rank 5, its dp peer, waits that long on top of its own
    # iteration (within the real compute's noise)
    def times(*perturb):
        proc = cli("run", "--world-size", "64", "--rank", "5", "--graph", str(graph), "--no-bus",
                   *perturb, "--report", str(tmp_path / "report.json"))
        assert proc.returncode == 0, proc.stderr
        report = json.loads((tmp_path / "report.json").read_text())
        return [it["time_s"] for it in report["iterations"]]

    base = times()
    late = times("--perturb", "delay 13 0.3 family dp from 2 for 1",
                 "--perturb", "hang 13 at 3 op 1 for 0.5")
    assert late[1] - base[1] == pytest.approx(0.3, abs=0.05)
    assert late[2] - base[2] == pytest.approx(0.5, abs=0.05)
    assert late[3] == pytest.approx(base[3], abs=0.05)
