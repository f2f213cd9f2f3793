"""What a run and its snapshots leave is its user's alone, with real CRIU
dumps: another user (``nobody``, through setpriv) can reach the folders
that hold them and still read none of the store, its manifests, its images,
or a run folder's agent configuration; and the modes are exactly 0700 for
folders and 0600 for files, whatever CRIU writes its images with."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_steps.py"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                       reason="reading as another user needs root and setpriv"),
]


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=os.environ | env)


def as_nobody(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                           *command], capture_output=True, text=True, timeout=60)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def public():
    """A folder everyone can enter (pytest's own are 0700, which would hide
    everything below them from nobody whatever its modes)."""
    path = Path(tempfile.mkdtemp(prefix="prism-private-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_nobody_else_reads_the_store_its_images_or_a_run_folder(public):
    env = {"XDG_STATE_HOME": str(public / "state")}  # the default run folder goes below it
    store = public / "store"
    proc = cli("run", "--lockstep", "--world-size", "16", "--rank", "3", "--snapshot-at", "2",
               "--store", str(store), "--", sys.executable, str(SCRIPT), "--iterations", "3",
               env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (snapshot,) = store.iterdir()
    (run_dir,) = (public / "state" / "prism-debug" / "runs").iterdir()
    restored = cli("snapshot", "restore", snapshot.name, "--store", str(store), "--iterations",
                   "1", "--no-bus", env=env)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    (again,) = [p for p in run_dir.parent.iterdir() if p != run_dir]

    # exactly private: every folder 0700, every file 0600 (CRIU writes its images 0644)
    folders = [public / "state", public / "state" / "prism-debug", run_dir.parent, run_dir,
               again, store, snapshot]
    assert {str(p): mode(p) for p in folders} == {str(p): 0o700 for p in folders}
    files = [p for folder in (run_dir, again, snapshot) for p in folder.iterdir()]
    assert {str(p): mode(p) for p in files} == {str(p): 0o600 for p in files}
    assert {"agent.json", "control.json", "events.jsonl", "rank.log"} <= {
        p.name for p in run_dir.iterdir()}
    assert {"manifest.json", "pages-1.img", "dump.log"} <= {p.name for p in snapshot.iterdir()}
    assert {"restore.log", "rank.log", "events.jsonl"} <= {p.name for p in again.iterdir()}

    # another user reaches the public folder, and nothing of the run's
    (public / "notice.txt").write_text("everyone may read this\n")
    (public / "notice.txt").chmod(0o644)
    assert as_nobody("cat", str(public / "notice.txt")).stdout == "everyone may read this\n"
    pages = max(snapshot.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    attempts = [("ls", store), ("cat", snapshot / "manifest.json"), ("cat", pages),
                ("ls", run_dir), ("cat", run_dir / "agent.json"),
                ("cat", run_dir / "control.json"), ("cat", again / "rank.log")]
    for command, path in attempts:
        proc = as_nobody(command, str(path))
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, (command, path)
        assert proc.stdout == ""


def test_the_rank_writes_with_the_users_own_umask(tmp_path):
    """The controller narrows its umask to 077 for its own files; the script it
    runs gets the user's back (a checkpoint others should read stays readable)."""
    written = tmp_path / "checkpoint.txt"
    proc = subprocess.run(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--no-bus",
         "--world-size", "4", "--rank", "1", "--run-dir", str(tmp_path / "run"), "--",
         sys.executable, str(SCRIPT.parent / "writes_a_file.py"), str(written)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        preexec_fn=lambda: os.umask(0o022))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert mode(written) == 0o644
    assert mode(tmp_path / "run") == 0o700 and mode(tmp_path / "run" / "agent.json") == 0o600
