"""A scenario of several real ranks, end to end: ``prism-debug scenario run``
starts both real ranks of a tensor-parallel pair, puts a late virtual peer
in force on each rank's replica, and judges every expectation on each rank.

The job is ``examples/device_time.py`` (compute as sleeps) with tp 2, pp 1:
in a world of 8, ranks 0 and 1 are one tensor-parallel pair, rank 1's
data-parallel group is {1, 3, 5, 7} and rank 0's {0, 2, 4, 6}.  Virtual
rank 3 reaches each of its data-parallel all-reduces 0.3 s late in iteration
2 (the script has two gradient buckets), so rank 1's iteration 2 holds at
least 0.6 s of waiting, while rank 0's does not: rank 0 meets the delay
only in iteration 3, at its first tensor-parallel all-reduce with rank 1."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.cli import cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
DEVICE_TIME = ROOT / "examples" / "device_time.py"
EXAMPLE = ROOT / "examples" / "scenarios" / "late_peer_of_a_pair.yaml"
DELAY_S, BUCKETS = 0.3, 2

SCENARIO = f"""\
name: pair-late-dp-peer
world: {{size: 8, ranks: "0-1"}}
run:
  command: [{sys.executable}, {DEVICE_TIME}, --tp, "2", --pp, "1", --iterations, "4"]
  graph: profile
faults:
  - {{action: delay, select: {{ranks: "3"}}, seconds: {DELAY_S}, family: dp,
     at: {{iteration: 2}}, for: {{iterations: 1}}}}
expect:
  - exit_code: 0
  - iteration_time: {{max_s: 2.0}}
  - iteration_time: {{iteration: 2, max_s: 0.25}}
  # against a baseline run of the pair without the fault, each rank its own
  - iteration_time: {{iteration: 4, relative: 1.0, tolerance: 0.5}}
  - iteration_time: {{predicted: true, tolerance: 0.5}}
"""


def test_each_real_rank_is_judged_and_the_verdict_names_the_one_that_fails(tmp_path):
    path = tmp_path / "pair.yaml"
    path.write_text(SCENARIO)
    proc = cli("scenario", "run", str(path), "--run-dir", str(tmp_path / "runs"),
               "--report", str(tmp_path / "verdicts.json"))
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "prism-debug: real ranks 0-1 of 8, a process each" in proc.stdout
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdicts[:2] == [
        "PASS  exit code 0: got 0",
        "PASS  rank 0: iteration times in [0.0 ms, 2000.0 ms]: all within; rank 1: iteration "
        "times in [0.0 ms, 2000.0 ms]: all within"]
    failed = re.fullmatch(r"FAIL  rank 1: iteration 2 time in \[0\.0 ms, 250\.0 ms\]: got "
                          r"([\d.]+) ms", verdicts[2])
    assert failed, verdicts[2]  # rank 0 passes it: only rank 1 is named
    assert re.fullmatch(r"PASS  rank 0: iteration 4 time x1 ±0\.5 of the baseline's: got "
                        r"x[\d.]+ \([\d.]+ vs [\d.]+ ms\); rank 1: iteration 4 time x1 ±0\.5 "
                        r"of the baseline's: got x[\d.]+ \([\d.]+ vs [\d.]+ ms\)",
                        verdicts[3]), verdicts[3]
    # the engine's prediction for each rank, from the graph alone: the medians
    # after the first iteration hold one delayed iteration in three, so x1
    assert "scenario: the replay engine predicts iterations x1.000 (rank 0), x1.000 (rank 1)" \
        in proc.stdout
    assert re.fullmatch(r"PASS  rank 0: median iteration time x1\.000 \(predicted\) ±0\.5 .*; "
                        r"rank 1: median iteration time x1\.000 \(predicted\) ±0\.5 .*",
                        verdicts[4]), verdicts[4]
    # what each rank's own report holds: the two late buckets in rank 1's
    # iteration 2, none in rank 0's, which meets them in iteration 3
    (run_dir,) = (tmp_path / "runs").iterdir()
    reports = json.loads((run_dir / "report.json").read_text())["ranks"]
    times = {int(rank): {it["iteration"]: it["time_s"] for it in report["iterations"]}
             for rank, report in reports.items()}
    assert sorted(times) == [0, 1] and sorted(times[1]) == [1, 2, 3, 4]
    assert times[1][2] >= BUCKETS * DELAY_S
    assert float(failed.group(1)) == pytest.approx(times[1][2] * 1e3, abs=0.06)
    assert times[0][2] < 0.25 and times[0][3] >= BUCKETS * DELAY_S - 0.1
    (summary,) = json.loads((tmp_path / "verdicts.json").read_text())
    assert [(e["line"], e["passed"]) for e in summary["expectations"]] == [
        (10, True), (11, True), (12, False), (14, True), (15, True)]


def test_the_bundled_pair_scenario_passes_on_both_ranks(tmp_path):
    proc = cli("scenario", "run", str(EXAMPLE), "--run-dir", str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    verdicts = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert verdicts[0] == "PASS  exit code 0: got 0"
    assert re.fullmatch(r"PASS  rank 0: p100 of iteration times >= 600\.0 ms and <= 1500\.0 ms: "
                        r"got [\d.]+ ms over 3 iterations; rank 1: p100 of iteration times "
                        r">= 600\.0 ms and <= 1500\.0 ms: got [\d.]+ ms over 3 iterations",
                        verdicts[1]), verdicts[1]
    assert verdicts[2].startswith("PASS  rank 0: p50 of iteration times <= 300.0 ms: got ")
