"""From a real incident's dumps to a reproduction, end to end: each real
torchrun job of conftest.py (a rank that hangs, dies, or all-reduces the
wrong size) → ``prism-debug incident`` → ``prism-debug scenario run`` of the
scenario it wrote.  The scenario expects the verdict torch's fr_trace gave
on the real job's dumps; the reproduction's own dumps are written by
prism-debug's flight recorder and judged by fr_trace again — and, apart
from the verdict, the collective the reproduction stopped in (group and
sequence number, read from those dumps) must be the real job's."""

import re
from pathlib import Path

import pytest

from prism_debug.incident.analysis import analyse
from prism_debug.incident.dumps import read_dumps
from tests.cli import cli

pytestmark = pytest.mark.slow


def reproduce(incident, tmp_path: Path):
    """incident → scenario → its run; the summary, the scenario's text, the
    run's output and the incident the reproduction's own dumps record."""
    scenario = tmp_path / "repro.yaml"
    imported = cli("incident", str(incident.dump_dir), "--out", str(scenario), "--",
                   *incident.command)
    assert imported.returncode == 0, imported.stderr
    run_dir = tmp_path / "runs"
    ran = cli("scenario", "run", str(scenario), "--run-dir", str(run_dir))
    flight = next(run_dir.glob("*/flight"))
    return imported.stdout, scenario.read_text(), ran, analyse(read_dumps(flight))


def verdicts(run) -> list[str]:
    return [line.split(":")[0] for line in run.stdout.splitlines()
            if line.startswith(("PASS  ", "FAIL  "))]


def test_a_hung_rank_reproduces(real_hang, tmp_path):
    summary, scenario, run, seen = reproduce(real_hang, tmp_path)
    assert re.search(r"^stopped: all_reduce of 8192 Float #5 on group \d+ \(dp, 2 ranks\): "
                     r"rank 2 never arrived; rank 0 waited$", summary, re.M), summary
    # the dp stop's verdict, then every group's: tp's knock-on waits for rank 0
    assert re.search(r"^fr_trace: missing ranks \[2\] in group \d+; missing ranks \[0, 2\] over "
                     r"all groups \(on copies", summary, re.M), summary
    assert "world: {size: 8, rank: 0}" in scenario
    assert "  - action: hang\n    select: {ranks: \"2\"}\n    at: {iteration: 3, collective: 9}" \
        in scenario
    assert "flight_record: {missing_ranks: [2]}" in scenario  # the dp group's verdict
    assert run.returncode == 0, run.stdout + run.stderr
    assert verdicts(run) == ["PASS  exit code 134", "PASS  exception DistBackendError matching "
                             "'Watchdog caught collective operation timeout'",
                             "PASS  flight record shows missing ranks [2]"]
    # the reproduction stopped where the job did: dp collective 5, rank 2 missing
    assert (seen.stop.group.desc, seen.stop.seq, seen.stop.culprits) == ("dp", 5, (2,))


def test_a_dead_rank_reproduces(real_die, tmp_path):
    summary, scenario, run, seen = reproduce(real_die, tmp_path)
    assert re.search(r"^incident: 7 dumps in .*, world of 8 ranks; no dump from rank 2$",
                     summary, re.M), summary
    assert "fr_trace: missing ranks [2]" in summary
    assert "  - action: fail\n    select: {ranks: \"2\"}" in scenario
    assert run.returncode == 0, run.stdout + run.stderr
    assert verdicts(run)[-1] == "PASS  flight record shows missing ranks [2]"
    stop = re.search(r"^stopped: \S+ of \d+ Float #(\d+) on group \d+ \((\w+),", summary, re.M)
    assert (seen.stop.group.desc, seen.stop.seq) == (stop.group(2), int(stop.group(1)))
    assert seen.stop.culprits == (2,) and seen.stop.no_dump == (2,)


def test_a_wrong_size_reproduces(real_size, tmp_path):
    summary, scenario, run, seen = reproduce(real_size, tmp_path)
    assert re.search(r"^stopped: all_reduce of 8192 Float #5 on group \d+ \(dp, 4 ranks\): "
                     r"rank 2 called all_reduce of 16384 Float, the others all_reduce of 8192 "
                     r"Float$", summary, re.M), summary
    # torch's verdict on the real job, gloo's aborted peer (no dump) included
    assert "fr_trace: missing ranks [1], size mismatch, culprit [2]" in summary
    assert "  - action: desync\n    kind: size" in scenario
    assert "flight_record: {mismatch: size, culprits: [2]}" in scenario
    assert run.returncode == 0, run.stdout + run.stderr
    assert verdicts(run)[-1] == "PASS  flight record shows a size mismatch and culprits [2]"
    assert (seen.stop.group.desc, seen.stop.seq, seen.stop.kind) == ("dp", 5, "mismatch")
    assert [(m.rank, m.kind) for m in seen.stop.mismatched] == [(2, "size")]
