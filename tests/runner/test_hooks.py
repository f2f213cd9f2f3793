"""The injected sitecustomize loads the agent and still runs the one it shadows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
pytestmark = pytest.mark.slow


def test_a_shadowed_sitecustomize_still_runs(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = 'yes'\n")
    script = tmp_path / "check.py"
    script.write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group('nccl')\n"
        "print('user sitecustomize:', os.environ.get('USER_SITECUSTOMIZE_RAN'), flush=True)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--run-dir", str(tmp_path / "run"),
         "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 4097] user sitecustomize: yes" in proc.stdout
    events = [json.loads(l) for l in (tmp_path / "run" / "events.jsonl").read_text().splitlines()]
    assert events[0]["kind"] == "init" and events[0]["backend"] == "nccl"
