"""Which Python runs the rank (issue 15, point 3): a bare ``python`` is the one
prism-debug runs in, whatever PATH finds; another Python runs as given, and
one that cannot load the agent is named, with the one that would work,
before the rank starts."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from prism_debug.process.interpreter import with_interpreter

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SYSTEM_PYTHON = "/usr/bin/python3"


def prism(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=240,
                          stdin=subprocess.DEVNULL, env=os.environ | (env or {}))


def run_args(tmp_path: Path, *command: str) -> list[str]:
    return ["run", "--lockstep", "--world-size", "4", "--rank", "1", "--no-bus",
            "--run-dir", str(tmp_path / "run"), "--", *command]


def lacks_torch(python: str) -> bool:
    """The system Python here has none of the agent's needs (checked, not assumed)."""
    if not Path(python).is_file():
        return False
    probe = subprocess.run([python, "-c", "import importlib.util as u; print(any(u.find_spec(m)"
                            " for m in ('torch', 'numpy', 'zmq')))"],
                           capture_output=True, text=True, timeout=60)
    return probe.stdout.strip() == "False"


needs_system_python = pytest.mark.skipif(not lacks_torch(SYSTEM_PYTHON),
                                         reason=f"needs a {SYSTEM_PYTHON} without torch")


def test_the_rule_maps_only_a_bare_python():
    ours = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for bare in ("python", "python3", ours):
        assert with_interpreter([bare, "train.py", "--lr", "3"]) == [sys.executable, "train.py",
                                                                    "--lr", "3"]
    for given in (["/usr/bin/python3", "t.py"], ["./python", "t.py"], ["python2.7", "t.py"],
                  ["torchrun", "t.py"], ["bash", "-c", "python t.py"]):
        assert with_interpreter(given) == given


@needs_system_python
@pytest.mark.slow
def test_a_bare_python_is_prism_debugs_own_whatever_python_path_finds(tmp_path):
    # PATH finds the system's python3, which has no torch: the rank runs anyway
    proc = prism(*run_args(tmp_path, "python3", "train_where.py"), cwd=SCRIPTS,
                 env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"command: {sys.executable} train_where.py\n" in proc.stdout
    assert f"[rank 1] step 4 python {sys.executable} cwd {SCRIPTS} " in proc.stdout


@needs_system_python
def test_a_python_without_torch_is_named_with_the_one_that_would_work(tmp_path):
    proc = prism(*run_args(tmp_path, SYSTEM_PYTHON, "train_where.py", "--x"), cwd=SCRIPTS)
    assert proc.returncode == 3
    assert proc.stderr == (
        f"prism-debug: error: the rank's Python {SYSTEM_PYTHON} cannot import torch, numpy, "
        "pyzmq, which the prism-debug agent needs in the rank: write the command as `python "
        f"train_where.py …` (a bare `python` is prism-debug's own Python, {sys.executable}), "
        "or give a Python 3.11 or later with torch, numpy and pyzmq\n")
    assert not (tmp_path / "run").exists()  # refused before the rank started


@needs_system_python
@pytest.mark.slow
def test_an_agent_that_never_loads_names_the_python_that_would_load_it(tmp_path):
    # a Python started by a wrapper cannot be asked beforehand: named after the fact
    proc = prism(*run_args(tmp_path, "bash", "-c", f"{SYSTEM_PYTHON} train_where.py"),
                 cwd=SCRIPTS)
    assert proc.returncode == 3
    assert proc.stderr == (
        "prism-debug: error: the prism-debug agent never loaded in the rank's process "
        "(started by bash, exit code 1): it loads when a Python that honours PYTHONPATH (not "
        "python -I or -E) imports torch — a bare `python` first word runs prism-debug's own, "
        f"{sys.executable}; the rank's output is in {tmp_path / 'run' / 'rank.log'}\n")
    assert "hint:" not in proc.stdout


@pytest.mark.slow
def test_another_python_with_torch_runs_as_given(tmp_path):
    # a venv of its own (not this Python) whose packages are this one's
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / \
        "site-packages"
    (site / "shared.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = venv / "bin" / "python"
    proc = prism(*run_args(tmp_path, str(python), "train_where.py"), cwd=SCRIPTS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"command: {python} train_where.py\n" in proc.stdout
    assert f"[rank 1] step 4 python {python} cwd {SCRIPTS} " in proc.stdout
