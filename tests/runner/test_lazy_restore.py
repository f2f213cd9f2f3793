"""Lazy restores with real CRIU: the rank runs before its memory is all back.

One run of a small bundled example (rank 5 of 64, tp=2 x pp=2) takes a full
snapshot after iteration 2 and an incremental one on top of it after
iteration 3; every restore must replay the original digests bit for bit,
whichever way its memory came back, and leave no ``criu lazy-pages`` behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest

from prism_debug.capture.snapshots import RestoreWay, restore_way
from prism_debug.snapshot import criu as criu_api
from prism_debug.snapshot.manifest import Manifest
from tests.runner.test_snapshots import EXAMPLE, cli, digests

SMALL = ["--layers", "2", "--hidden", "64", "--tp", "2", "--pp", "2"]


def manifest(**fields) -> Manifest:
    return Manifest(**{
        "id": "r5-it2-000000", "parent": None, "iteration": 2, "world_size": 64, "rank": 5,
        "graph_digest": None, "script_digest": None, "command": ["train.py"],
        "environment_digest": "", "hardware": "h100", "open_files": {}, "image_bytes": 2**20,
        "dump_s": 0.1, "created": "", **fields})


def test_an_increment_a_cuda_rank_and_eager_asked_restore_eagerly_saying_why():
    criu = criu_api.Criu(Path("/nonexistent/criu"), (4, 1))  # never run: decided before
    assert restore_way(manifest(), criu, False) == RestoreWay(False)
    assert restore_way(manifest(parent="r5-it1-000000"), criu, True) == RestoreWay(
        False, "it is an increment on r5-it1-000000, and CRIU's lazy pages hang on "
               "incremental chains")
    assert restore_way(manifest(cuda=True), criu, None) == RestoreWay(
        False, "cuda-checkpoint is not known to work with lazy pages")
    assert RestoreWay(True).describe() == "lazily"
    assert RestoreWay(False).describe() == "eagerly"
    assert RestoreWay(False, "why").describe() == "eagerly: why"


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lazy")
    store = tmp / "store"
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--snapshot-at", "2,3",
               "--incremental", "--store", str(store), "--report", str(tmp / "original.json"),
               "--run-dir", str(tmp / "run"), "--",
               sys.executable, str(EXAMPLE), *SMALL, "--iterations", "4")
    assert proc.returncode == 0, proc.stderr
    shown = [json.loads(cli("snapshot", "show", p.name, "--store", str(store)).stdout)
             for p in store.iterdir()]
    full, increment = sorted(shown, key=lambda m: m["iteration"])
    assert (full["parent"], increment["parent"]) == (None, full["id"])
    return tmp, store, full["id"], increment["id"], digests(tmp / "original.json")


def restore(tmp: Path, store: Path, snapshot_id: str, *options: str, env: dict | None = None):
    report = tmp / f"restored{len(list(tmp.glob('restored*')))}.json"
    proc = cli("snapshot", "restore", snapshot_id, "--store", str(store), "--iterations", "1",
               "--no-bus", "--report", str(report), "--run-dir", str(tmp / report.stem),
               *options, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("restored pid ")]
    return line, digests(report), tmp / report.stem


def images(path: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in path.iterdir()}


def lazy_daemons(store: Path) -> list[int]:
    """Processes still running ``criu lazy-pages`` on this store's images."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lazy-pages" in command and any(str(store).encode() in a for a in command):
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_a_full_snapshot_restores_lazily_with_the_eager_digests(chain):
    tmp, store, full, _, original = chain
    before = images(store / full)
    line, lazy, run_dir = restore(tmp, store, full)  # the default where the kernel can
    assert line.endswith(" MiB of images, lazily)"), line
    assert lazy == {3: original[3]}
    assert (run_dir / "lazy-pages.log").exists()
    assert lazy_daemons(store) == []  # reaped before the controller left
    assert images(store / full) == before  # the daemon only reads them
    line, eager, run_dir = restore(tmp, store, full, "--eager")
    assert line.endswith(" MiB of images, eagerly)"), line
    assert eager == lazy
    assert not (run_dir / "lazy-pages.log").exists()


@pytest.mark.slow
def test_an_increment_asked_lazily_restores_eagerly_and_says_why(chain):
    tmp, store, full, increment, original = chain
    line, restored, _ = restore(tmp, store, increment, "--lazy")
    assert line.endswith(f" MiB of images, eagerly: it is an increment on {full}, and CRIU's "
                         "lazy pages hang on incremental chains)"), line
    assert restored == {4: original[4]}


@pytest.mark.slow
def test_a_lazy_restore_that_fails_falls_back_to_eager(chain, tmp_path):
    # a real CRIU behind a wrapper that refuses to start the lazy-pages daemon
    tmp, store, full, _, original = chain
    wrapper = tmp_path / "criu"
    wrapper.write_text("#!/bin/sh\n[ \"$1\" = lazy-pages ] && exit 3\n"
                       f"exec {criu_api.locate().binary} \"$@\"\n")
    wrapper.chmod(0o755)
    line, restored, run_dir = restore(tmp, store, full, "--lazy",
                                      env={criu_api.ENV_VAR: str(wrapper)})
    assert line.endswith(
        " MiB of images, eagerly: the lazy restore failed (criu lazy-pages exited (code 3) "
        f"before listening: no log ({run_dir / 'lazy-pages.log'})))"), line
    assert restored == {3: original[3]}
    assert lazy_daemons(store) == []


@pytest.mark.slow
def test_removing_the_snapshot_while_its_daemon_serves_pages_spares_the_rank(chain, tmp_path):
    # The daemon holds the images open from the restore on: `snapshot rm`
    # unlinks them, and the pages it has not delivered yet stay readable.
    from prism_debug import api
    from prism_debug.process.paths import open_store

    tmp, store, full, _, original = chain
    copy = tmp_path / "store"
    shutil.copytree(store / full, copy / full)
    held: dict = {}

    def message(line: str) -> None:
        if not line.startswith("restored pid "):
            return
        (daemon,) = lazy_daemons(copy) or [None]
        if daemon is None:
            return
        os.kill(daemon, signal.SIGSTOP)  # no page goes out until the snapshot is gone
        try:
            held["removed"] = open_store(copy).remove(full, False)
            held["open"] = sorted(os.readlink(f"/proc/{daemon}/fd/{fd}")
                                  for fd in os.listdir(f"/proc/{daemon}/fd"))
        finally:
            os.kill(daemon, signal.SIGCONT)

    result = api.restore(api.RestoreOptions(
        snapshot_id=full, store=copy, iterations=1, run_dir=tmp_path / "run", bind=None,
        report_path=tmp_path / "r.json", lazy=True), message)
    if not held:
        pytest.skip("the lazy-pages daemon had delivered every page before the restore ended")
    assert held["removed"] == [full] and not (copy / full).exists()
    assert any(f.endswith(".img (deleted)") for f in held["open"]), held["open"]
    assert result.exit_code == 0
    assert digests(tmp_path / "r.json") == {3: original[3]}
    assert lazy_daemons(copy) == []


@pytest.mark.slow
def test_a_daemon_that_dies_before_every_page_arrived_ends_the_rank(chain, tmp_path):
    # Pages it never delivered would read as zeros: the rank must not go on.
    from prism_debug import api

    tmp, store, full, _, _ = chain
    lines: list[str] = []
    killed: list[int] = []

    def message(line: str) -> None:
        lines.append(line)
        if line.startswith("restored pid "):
            killed.extend(lazy_daemons(store))
            if killed:  # held still, so that the zeros cannot crash it first
                os.kill(int(line.split()[2]), signal.SIGSTOP)
            for daemon in killed:
                os.kill(daemon, signal.SIGKILL)

    result = api.restore(api.RestoreOptions(
        snapshot_id=full, store=store, run_dir=tmp_path / "run", bind=None, lazy=True), message)
    if not killed:
        pytest.skip("the lazy-pages daemon had delivered every page before the restore ended")
    assert result.exit_code == 128 + signal.SIGKILL  # as a shell reports it
    log = tmp_path / "run" / "lazy-pages.log"
    assert (f"prism-debug: error: the lazy-pages daemon failed (exit code -9, log: {log}) "
            "before every page of the restored rank's memory arrived: the rank cannot go on "
            "(the missing pages would read as zeros); restore it again with --eager\n"
            ) in result.log_path.read_text()
    assert lazy_daemons(store) == []
