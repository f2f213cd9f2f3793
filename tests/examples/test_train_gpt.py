"""The bundled example is a real training script: it runs under torchrun."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
SMALL = ["--iterations", "2", "--layers", "2", "--hidden", "64", "--heads", "4",
         "--seq-len", "32", "--micro-batches", "4", "--tp", "1"]
pytestmark = pytest.mark.slow


def losses(output: str) -> list[str]:
    return re.findall(r"^iter \d+ loss ([\d.]+)$", output, re.MULTILINE)


def test_two_stage_pipeline_under_torchrun_matches_one_process(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    real = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", "29561", str(EXAMPLE), *SMALL, "--pp", "2"],
        capture_output=True, text=True, env=env, timeout=300)
    assert real.returncode == 0, real.stderr[-2000:]
    single = subprocess.run(
        [sys.executable, str(EXAMPLE), *SMALL, "--pp", "1"], capture_output=True, text=True,
        timeout=300, env=dict(env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                              MASTER_ADDR="127.0.0.1", MASTER_PORT="29562"))
    assert single.returncode == 0, single.stderr[-2000:]
    assert len(losses(real.stdout)) == 2
    assert losses(real.stdout) == losses(single.stdout)


def test_a_layout_the_world_cannot_hold_is_refused(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--tp", "2", "--pp", "2"], capture_output=True, text=True,
        env=dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0"), timeout=120)
    assert proc.returncode != 0
    assert "WORLD_SIZE=2 is not divisible by tp*pp = 2*2 = 4" in proc.stderr
