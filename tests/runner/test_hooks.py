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
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--run-dir",
         str(tmp_path / "run"),
         "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 4097] user sitecustomize: yes" in proc.stdout
    lines = (tmp_path / "run" / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines]
    assert [e["kind"] for e in events[:2]] == ["loaded", "init"]
    assert events[1]["backend"] == "nccl"


def test_looking_torch_up_before_importing_it_still_loads_the_agent(tmp_path):
    script = tmp_path / "lookup.py"
    script.write_text(
        "import importlib.util\n"
        "assert importlib.util.find_spec('torch') is not None  # as libraries probe for torch\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('nccl')\n"
        "print('backend', dist.get_backend(), flush=True)\n")
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--run-dir",
         str(tmp_path / "run"),
         "--", sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 4097] backend nccl" in proc.stdout


def test_an_unreadable_agent_configuration_stops_the_process_with_the_reason(tmp_path):
    hooks = Path(__file__).resolve().parents[2] / "hooks"
    proc = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(hooks),
             "PRISM_DEBUG_CONFIG": str(tmp_path / "missing.json")})
    assert proc.returncode == 1
    assert proc.stderr.startswith(
        f"prism-debug: error: cannot load the agent configuration "
        f"$PRISM_DEBUG_CONFIG={tmp_path / 'missing.json'}: [Errno 2] No such file or directory")
