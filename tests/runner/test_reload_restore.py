"""Fix and verify from the same snapshot, with a real rank and real CRIU.

``tests/scripts/desync_at.py`` as rank 3 of 4 (the last rank) skips the
loss all-reduce at iteration 5.  Its peers are replayed from the job's
profiled graph (rank 0's slice, which takes the all-reduce), so the real
rank's skip is the desync the real job would have, and the replay engine
reports it at the end of iteration 5, naming the op.  Snapshotted after
iteration 4, the bug reproduces from the snapshot; the script is fixed (one
function, ``train_step``); ``restore --reload`` patches the fix into the
restored rank, and iterations 5 and 6 give exactly the digests of a fresh
run of the fixed script.  A reload that cannot be patched is refused before
anything is restored, and the snapshot stays as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from prism_debug import api

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "scripts" / "desync_at.py"
MODULE = ROOT / "tests" / "scripts" / "desync_model.py"  # the script's own module
BUG = ("    if dist.get_rank() == dist.get_world_size() - 1 and iteration == 5:\n"
       "        pass  # BUG: the last rank skips the loss all-reduce at iteration 5\n"
       "    else:\n"
       "        dist.all_reduce(logged)\n")
FIXED = SCRIPT.read_text().replace(BUG, "    dist.all_reduce(logged)\n")
pytestmark = pytest.mark.slow


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL, cwd=cwd,
                          env=os.environ | {"PYTHONPATH": str(ROOT)})


def digests(report: Path) -> dict[int, str]:
    return {it["iteration"]: it["digest"] for it in json.loads(report.read_text())["iterations"]}


def run(tmp: Path, name: str, *options: str) -> subprocess.CompletedProcess:
    return cli("run", "--world-size", "4", "--rank", "3", "--no-bus", "--report",
               str(tmp / f"{name}.json"), "--run-dir", str(tmp / name), *options, "--",
               sys.executable, "desync.py", "--iterations", "6", cwd=tmp)


def restore(tmp: Path, snapshot_id: str, name: str, *options: str):
    return cli("snapshot", "restore", snapshot_id, "--store", str(tmp / "store"), "--no-bus",
               "--report", str(tmp / f"{name}.json"), "--run-dir", str(tmp / name), *options,
               cwd=tmp)


@pytest.fixture(scope="module")
def snapshotted(tmp_path_factory):
    """The buggy script's run, snapshotted after iteration 4 (it then fails at 5)."""
    tmp = tmp_path_factory.mktemp("reload")
    shutil.copy(SCRIPT, tmp / "desync.py")
    shutil.copy(MODULE, tmp / "desync_model.py")
    proc = run(tmp, "original", "--snapshot-at", "4", "--store", str(tmp / "store"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "rank 3 ended iteration 5 without issuing all_reduce of 4 bytes on world" \
        in proc.stderr
    (snapshot_id,) = [p.name for p in (tmp / "store").iterdir()]
    return tmp, snapshot_id


def test_the_snapshot_keeps_the_script_and_its_modules(snapshotted):
    tmp, snapshot_id = snapshotted
    manifest = json.loads((tmp / "store" / snapshot_id / "manifest.json").read_text())
    files = {str((tmp / name).resolve()): original
             for name, original in (("desync.py", SCRIPT), ("desync_model.py", MODULE))}
    assert sorted(manifest["sources"]) == sorted(files)  # not torch's, not prism-debug's
    for path, original in files.items():
        kept = tmp / "store" / snapshot_id / f"source-{manifest['sources'][path]}.py"
        assert kept.read_text() == original.read_text()


def test_the_bug_reproduces_from_the_snapshot(snapshotted):
    tmp, snapshot_id = snapshotted
    (tmp / "desync.py").write_text(SCRIPT.read_text())
    proc = restore(tmp, snapshot_id, "buggy")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "prism-debug: error: the restored rank refused: the script does not follow the graph: "
        "rank 3 ended iteration 5 without issuing all_reduce of 4 bytes on world, which the "
        "graph has next")


def test_a_fixed_script_needs_reload(snapshotted):
    tmp, snapshot_id = snapshotted
    (tmp / "desync.py").write_text(FIXED)
    proc = restore(tmp, snapshot_id, "plain")
    assert proc.returncode == 2
    assert "changed since the snapshot; restoring would mix old code in memory with new code " \
           f"on disk: prism-debug snapshot restore {snapshot_id} --reload patches the changed " \
           "functions in; or take the snapshot again\n" in proc.stderr
    assert not (tmp / "plain").exists()


def test_an_unpatchable_reload_is_refused_and_restores_nothing(snapshotted):
    tmp, snapshot_id = snapshotted
    store = tmp / "store" / snapshot_id
    before = sorted((p.name, p.stat().st_size) for p in store.iterdir())
    (tmp / "desync.py").write_text(FIXED.replace(
        "def train_step(model, optimizer, iteration):",
        "LOG_EVERY = 1\n\n\ndef train_step(model, optimizer, iteration, scale=2):"))
    (tmp / "desync_model.py").write_text(MODULE.read_text().replace("WIDTH = 16", "WIDTH = 32"))
    try:
        proc = restore(tmp, snapshot_id, "refused", "--reload")
    finally:
        shutil.copy(MODULE, tmp / "desync_model.py")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"prism-debug: error: snapshot {snapshot_id}: --reload refused, nothing was restored: "
        "desync.py:14: module-level code changed (it ran once, at import: constants, imports "
        "and globals keep their values in memory); desync.py:17: train_step: its decorators "
        "or default values changed (evaluated once, when it was defined); desync_model.py:6: "
        "module-level code changed (it ran once, at import: constants, imports and globals "
        "keep their values in memory); take the snapshot again from the changed code "
        "(prism-debug run … --snapshot-at 4)")
    assert "restored pid" not in proc.stdout and not (tmp / "refused").exists()
    assert sorted((p.name, p.stat().st_size) for p in store.iterdir()) == before


def test_reload_runs_the_fixed_code_with_a_fresh_runs_digests(snapshotted):
    tmp, snapshot_id = snapshotted
    (tmp / "desync.py").write_text(FIXED)
    proc = restore(tmp, snapshot_id, "reloaded", "--reload")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-2:] == [
        "reload: patched train_step (desync.py:14)",
        "reload: warning: train_step was running when patched; it keeps its old code until "
        "it returns"]  # the snapshot was taken in its optimizer.step() of iteration 4
    # the public API, as the pytest fixture calls it
    result = api.restore(api.RestoreOptions(snapshot_id=snapshot_id, store=tmp / "store",
                                            run_dir=tmp / "api", bind=None, reload=True,
                                            report_path=tmp / "api.json"))
    assert result.exit_code == 0
    (reloaded,) = [e for e in result.events if e["kind"] == "reloaded"]
    assert reloaded["patched"] == [{"qualname": "train_step", "line": 14,
                                    "path": str((tmp / "desync.py").resolve())}]
    assert reloaded["running"] == ["train_step"] and reloaded["refused"] == []
    fresh = run(tmp, "fresh")  # the fixed script from the start (its graph profiled anew)
    assert fresh.returncode == 0, fresh.stderr
    expected = {k: v for k, v in digests(tmp / "fresh.json").items() if k in (5, 6)}
    assert digests(tmp / "reloaded.json") == digests(tmp / "api.json") == expected
    # and not the buggy iteration 5's (one all-reduce fewer), nor 1-4 changed
    original = digests(tmp / "original.json")
    assert original[5] != expected[5]
    assert {k: original[k] for k in range(1, 5)} == \
        {k: v for k, v in digests(tmp / "fresh.json").items() if k < 5}
