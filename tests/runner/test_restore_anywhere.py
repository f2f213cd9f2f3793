"""Restoring a snapshot from any directory (issue 15, point 6): the manifest
records the directory the run started in, where the command's relative
script is found; the rank itself comes back in its own directory and
environment (CRIU's images hold both), with the original run's digests.

One real run, with a real CRIU snapshot, started in x/ with a relative
script path and a variable in its environment; restores from y/ without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_where.py"
pytestmark = pytest.mark.slow


def prism(*args: str, cwd: Path, mark: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PRISM_TEST_MARK"}
    if mark is not None:
        env["PRISM_TEST_MARK"] = mark
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def digests(report: Path) -> dict[int, str]:
    return {it["iteration"]: it["digest"] for it in json.loads(report.read_text())["iterations"]}


@pytest.fixture(scope="module")
def taken(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("anywhere")
    x, y = tmp / "x", tmp / "y"
    x.mkdir()
    y.mkdir()
    shutil.copy(SCRIPT, x / "train_where.py")
    proc = prism("run", "--lockstep", "--world-size", "4", "--rank", "1", "--no-bus",
                 "--snapshot-at", "2", "--store", str(tmp / "store"), "--report",
                 str(tmp / "original.json"), "--run-dir", str(tmp / "run"), "--",
                 sys.executable, "train_where.py", cwd=x, mark="taken-in-x")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (snapshot_id,) = [p.name for p in (tmp / "store").iterdir()]
    return tmp, snapshot_id


def restore(tmp: Path, snapshot_id: str, cwd: Path, name: str) -> subprocess.CompletedProcess:
    return prism("snapshot", "restore", snapshot_id, "--store", str(tmp / "store"), "--no-bus",
                 "--report", str(tmp / f"{name}.json"), "--run-dir", str(tmp / name), cwd=cwd)


def test_a_restore_from_another_directory_replays_the_run_where_it_started(taken):
    tmp, snapshot_id = taken
    proc = restore(tmp, snapshot_id, tmp / "y", "restored")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    original = digests(tmp / "original.json")
    assert sorted(original) == [1, 2, 3, 4]
    assert digests(tmp / "restored.json") == {3: original[3], 4: original[4]}
    # the rank's own directory and environment came back with it
    assert (f"[rank 1] step 4 python {sys.executable} cwd {tmp / 'x'} mark taken-in-x\n"
            in proc.stdout)
    manifest = json.loads((tmp / "store" / snapshot_id / "manifest.json").read_text())
    assert (manifest["version"], manifest["cwd"]) == (4, str(tmp / "x"))


def test_a_manifest_of_version_1_restores_from_the_directory_it_names(taken):
    tmp, snapshot_id = taken
    path = tmp / "store" / snapshot_id / "manifest.json"
    recorded = path.read_text()
    old = json.loads(recorded)
    del old["cwd"]
    path.write_text(json.dumps(old | {"version": 1}))
    try:
        proc = restore(tmp, snapshot_id, tmp / "y", "old-from-y")
        assert proc.returncode == 2
        assert proc.stderr == (
            f"prism-debug: error: snapshot {snapshot_id}: its script {tmp / 'y'}/train_where.py "
            f"is gone (looked for from {tmp / 'y'}: the snapshot predates recording the "
            "directory its run started in, so restore it from that directory)\n")
        proc = restore(tmp, snapshot_id, tmp / "x", "old-from-x")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        original = digests(tmp / "original.json")
        assert digests(tmp / "old-from-x.json") == {3: original[3], 4: original[4]}
    finally:
        path.write_text(recorded)


def test_a_script_gone_from_the_directory_the_run_started_in_is_named_there(taken):
    tmp, snapshot_id = taken
    script = tmp / "x" / "train_where.py"
    script.rename(tmp / "kept.py")
    try:
        proc = restore(tmp, snapshot_id, tmp / "y", "gone")
    finally:
        (tmp / "kept.py").rename(script)
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: snapshot {snapshot_id}: its script {script} "
                           f"is gone (the run started in {tmp / 'x'})\n")
