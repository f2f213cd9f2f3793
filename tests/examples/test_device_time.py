"""The device-time workload runs for real under torchrun and as one rank under
prism-debug, and each rank's figures land in its own file (never in a shared
stdout, where two ranks' lines can interleave)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ROOT / "examples" / "device_time.py"
# 4 ranks: pp=2 x dp=2; short sleeps, so the run is all start-up
SMALL = ["--pp", "2", "--iterations", "2", "--micro-batches", "2", "--forward-ms", "2",
         "--backward-ms", "4", "--optimizer-ms", "1", "--activation-kib", "16",
         "--grad-kib", "64"]
pytestmark = pytest.mark.slow


def env(**extra):
    # the rank under prism-debug imports this checkout's prism_debug
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **extra)


def test_each_real_rank_writes_its_own_figures_and_the_straggler_only_its_own(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
         "--log-dir", str(tmp_path / "logs"), "--redirects", "3", str(WORKLOAD), *SMALL,
         "--timing-dir", str(tmp_path / "timing")],
        capture_output=True, text=True, env=env(DEVICE_TIME_SLOW_RANK="1"), timeout=120,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = {rank: json.loads((tmp_path / "timing" / f"rank{rank}.json").read_text())
               for rank in range(4)}
    assert [f["rank"] for f in figures.values()] == [0, 1, 2, 3]
    assert [f["compute_factor"] for f in figures.values()] == [1.0, 2.0, 1.0, 1.0]
    for f in figures.values():
        assert len(f["iteration_s"]) == 2
        # a steady iteration is at least the last stage's compute: 2 micro-batches
        # of (2 + 4) ms x 1.5, plus the optimizer's 1 ms
        assert f["iteration_s"][1] > 0.019
        assert f["peak_rss_bytes"] > 50 * 2**20
    assert sorted(p.name for p in (tmp_path / "timing").iterdir()) == [
        f"rank{r}.json" for r in range(4)]  # no half-written files left


def test_one_rank_under_prism_debug_reports_the_workload_iterations(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--world-size", "4",
         "--gpus-per-node", "4", "--rank", "3", "--hardware", "zero", "--no-bus",
         "--report", str(tmp_path / "report.json"), "--run-dir", str(tmp_path / "run"),
         "--", sys.executable, str(WORKLOAD), *SMALL, "--timing-dir", str(tmp_path / "timing")],
        capture_output=True, text=True, env=env(), timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    own = json.loads((tmp_path / "timing" / "rank3.json").read_text())
    assert own["rank"] == 3 and own["compute_factor"] == 1.0
    # the iterations prism-debug counts (optimizer steps) are the workload's
    assert len(report["iterations"]) == len(own["iteration_s"]) == 2
    # rank 3 is the last stage: 2 x (2 + 4) ms x 1.5 + 1 ms of sleeps per step at least
    assert report["iterations"][1]["time_s"] > 0.019
