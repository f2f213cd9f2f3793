"""Snapshots with real CRIU: dump a running rank, restore it again and again.

The bundled example as rank 5 of 64 (tp=2 x pp=2 x dp=16), five iterations,
a snapshot after the second: every restore must replay iterations 3-5 with
the original run's value digests, bit for bit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_gpt.py"
pytestmark = pytest.mark.slow


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env=None if env is None else os.environ | env)


def digests(report_path: Path) -> dict[int, str]:
    report = json.loads(report_path.read_text())
    return {it["iteration"]: it["digest"] for it in report["iterations"]}


def snapshot_run(tmp: Path, script: Path = EXAMPLE, store: Path | None = None):
    store = store or tmp / "store"
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--snapshot-at", "2",
               "--store", str(store), "--report", str(tmp / "original.json"),
               "--run-dir", str(tmp / "run"), "--",
               sys.executable, str(script), "--tp", "2", "--pp", "2", "--iterations", "5")
    assert proc.returncode == 0, proc.stderr
    (snapshot_id,) = [p.name for p in store.iterdir()]
    return store, snapshot_id, proc


@pytest.fixture(scope="module")
def snapshotted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("snapshots")
    store, snapshot_id, proc = snapshot_run(tmp)
    return tmp, store, snapshot_id, proc


def restore(store: Path, snapshot_id: str, tmp: Path, *options: str):
    report = tmp / f"restored{len(list(tmp.glob('restored*')))}.json"
    proc = cli("snapshot", "restore", snapshot_id, "--store", str(store), "--report",
               str(report), "--run-dir", str(tmp / report.stem), *options)
    return proc, report


def test_restores_replay_the_original_iterations_bit_for_bit(snapshotted):
    tmp, store, snapshot_id, proc = snapshotted
    original = digests(tmp / "original.json")
    assert sorted(original) == [1, 2, 3, 4, 5]
    assert f"snapshot {snapshot_id}: iteration 2, " in proc.stdout
    for _ in range(3):  # the same snapshot, again and again
        restored_proc, report = restore(store, snapshot_id, tmp)
        assert restored_proc.returncode == 0, restored_proc.stderr
        assert digests(report) == {k: original[k] for k in (3, 4, 5)}
        assert json.loads(report.read_text())["restored_from"] == snapshot_id


def test_a_restore_stops_after_the_iterations_asked(snapshotted):
    tmp, store, snapshot_id, _ = snapshotted
    proc, report = restore(store, snapshot_id, tmp, "--iterations", "1")
    assert proc.returncode == 0, proc.stderr
    assert list(digests(report)) == [3]


def test_the_manifest_records_the_run(snapshotted):
    tmp, store, snapshot_id, _ = snapshotted
    manifest = json.loads(cli("snapshot", "show", snapshot_id, "--store", str(store)).stdout)
    assert (manifest["iteration"], manifest["rank"], manifest["world_size"]) == (2, 5, 64)
    assert manifest["image_bytes"] > 50 * 2**20 and manifest["files"]
    listing = cli("snapshot", "ls", "--store", str(store)).stdout
    assert snapshot_id in listing.splitlines()[1]
    verified = cli("snapshot", "verify", snapshot_id, "--store", str(store))
    assert verified.returncode == 0 and "checksums match" in verified.stdout


def test_a_corrupted_image_is_refused(snapshotted, tmp_path):
    _, store, snapshot_id, _ = snapshotted
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    pages = sorted((copy / snapshot_id).glob("pages-*.img"))[0]
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))
    proc, _ = restore(copy, snapshot_id, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: snapshot {snapshot_id} is damaged: image "
                           f"{pages.name} does not match its checksum\n")


def test_a_snapshot_of_a_script_that_changed_since_is_refused(tmp_path):
    script = tmp_path / "train.py"
    shutil.copy(EXAMPLE, script)
    store, snapshot_id, _ = snapshot_run(tmp_path, script)
    script.write_text(script.read_text() + "\n# edited\n")
    proc, _ = restore(store, snapshot_id, tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: snapshot {snapshot_id}: its script {script} "
                           "changed since the snapshot; restoring would mix old code in memory "
                           f"with new code on disk: prism-debug snapshot restore {snapshot_id} "
                           "--reload patches the changed functions in; or take the snapshot "
                           "again\n")


def test_removing_a_snapshot(snapshotted, tmp_path):
    _, store, snapshot_id, _ = snapshotted
    copy = tmp_path / "store"
    shutil.copytree(store, copy)
    proc = cli("snapshot", "rm", snapshot_id, "--store", str(copy))
    assert proc.stdout == f"removed {snapshot_id}\n"
    assert not (copy / snapshot_id).exists()


def test_without_usable_criu_a_snapshot_run_stops_before_it_starts(tmp_path):
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--snapshot-at", "2",
               "--store", str(tmp_path / "store"), "--", sys.executable, str(EXAMPLE),
               env={"PRISM_DEBUG_CRIU": str(tmp_path / "no-criu")})
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: $PRISM_DEBUG_CRIU names {tmp_path / 'no-criu'}, "
                           "which is not an executable: point it at criu >= 4.1, or unset it to "
                           "use the checkout's\n")
    assert not (tmp_path / "store").exists()


def test_doctor_reports_criu_ready():
    proc = cli("doctor")
    assert proc.returncode == 0, proc.stdout
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
    assert lines["ok   criu check"] == "Looks good."
    assert lines["ok   criu"].startswith("4.")


def test_a_failed_dump_costs_the_snapshot_not_the_run(tmp_path):
    # a criu that reports a good version but dies at once when asked to dump
    fake = tmp_path / "criu"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Version: 4.1.1" && exit 0\n'
                    'exit 1\n')
    fake.chmod(0o755)
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--snapshot-at", "2",
               "--store", str(tmp_path / "store"), "--report", str(tmp_path / "r.json"),
               "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(EXAMPLE),
               "--tp", "2", "--pp", "2", "--iterations", "3",
               env={"PRISM_DEBUG_CRIU": str(fake)})
    assert proc.returncode == 0, proc.stderr
    warning = next(line for line in proc.stdout.splitlines() if "warning" in line)
    assert warning.startswith("prism-debug: warning: no snapshot at iteration 2: criu dump of "
                              "pid ")
    assert sorted(digests(tmp_path / "r.json")) == [1, 2, 3]  # the run went on
    assert list((tmp_path / "store").iterdir()) == []  # and left no partial snapshot


def test_an_incremental_chain_holds_only_changed_pages_and_restores_bit_for_bit(tmp_path):
    # With soft-dirty tracking CRIU tracks written pages itself; without it (this
    # machine's kernel) each full dump keeps only the pages that differ from
    # its parent's.  Either way: a chain of four, restored from its far end.
    store = tmp_path / "store"
    proc = cli("run", "--lockstep", "--world-size", "64", "--rank", "5", "--snapshot-every", "1",
               "--incremental", "--store", str(store), "--report", str(tmp_path / "r.json"),
               "--run-dir", str(tmp_path / "run"), "--",
               sys.executable, str(EXAMPLE), "--tp", "2", "--pp", "2", "--iterations", "4")
    assert proc.returncode == 0, proc.stderr
    manifests = sorted((json.loads(cli("snapshot", "show", p.name, "--store", str(store)).stdout)
                        for p in store.iterdir()), key=lambda m: m["iteration"])
    assert [m["iteration"] for m in manifests] == [1, 2, 3, 4]
    assert [m["parent"] for m in manifests] == [None] + [m["id"] for m in manifests[:-1]]
    full = manifests[0]["image_bytes"]
    assert all(m["image_bytes"] < full / 2 for m in manifests[1:])  # increments, not copies
    original = digests(tmp_path / "r.json")
    deepest = manifests[2]  # iteration 3: on 2, on 1
    restored, report = restore(store, deepest["id"], tmp_path)
    assert restored.returncode == 0, restored.stderr
    assert digests(report) == {4: original[4]}
    refused = cli("snapshot", "rm", manifests[1]["id"], "--store", str(store))
    assert refused.returncode == 2
    assert refused.stderr == (
        f"prism-debug: error: snapshot {manifests[1]['id']} is the parent of incremental "
        f"snapshot(s) {manifests[2]['id']}; remove those first or pass --force to remove them "
        "all\n")
    # a damaged page in the chain's first link spoils every snapshot above it
    pages = max((store / manifests[0]["id"]).glob("pages-*.img"), key=lambda p: p.stat().st_size)
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))
    proc, _ = restore(store, deepest["id"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (f"prism-debug: error: snapshot {manifests[0]['id']} is damaged: image "
                           f"{pages.name} does not match its checksum\n")


def test_cuda_state_is_locked_checkpointed_restored_and_unlocked_in_order(tmp_path):
    # Mocked (no GPU driver here): cuda-checkpoint records its calls, and the
    # script stubs torch.cuda's state queries; CRIU and the rank are real.
    calls = tmp_path / "calls.log"
    tool = tmp_path / "cuda-checkpoint"
    tool.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    tool.chmod(0o755)
    env = {"PRISM_DEBUG_CUDA_CHECKPOINT": str(tool)}
    store = tmp_path / "store"
    proc = cli("run", "--lockstep", "--world-size", "16", "--rank", "3", "--snapshot-at", "2",
               "--store", str(store), "--report", str(tmp_path / "original.json"),
               "--run-dir", str(tmp_path / "run"), "--", sys.executable,
               str(Path(__file__).resolve().parents[1] / "scripts" / "cuda_claims.py"), env=env)
    assert proc.returncode == 0, proc.stderr
    (snapshot_id,) = [p.name for p in store.iterdir()]
    manifest = json.loads(cli("snapshot", "show", snapshot_id, "--store", str(store)).stdout)
    assert manifest["cuda"] is True
    dumped = calls.read_text().splitlines()
    rank_pid = dumped[0].split()[-1]
    assert dumped == [f"--action {a} --pid {rank_pid}"
                      for a in ("lock", "checkpoint", "restore", "unlock")]
    restored = cli("snapshot", "restore", snapshot_id, "--store", str(store), "--report",
                   str(tmp_path / "restored.json"), "--run-dir", str(tmp_path / "again"),
                   env=env)
    assert restored.returncode == 0, restored.stderr
    # the restored copy (same pid: CRIU restores pids) gets its state back on the GPU
    assert calls.read_text().splitlines()[4:] == [f"--action {a} --pid {rank_pid}"
                                                  for a in ("restore", "unlock")]
    original = digests(tmp_path / "original.json")
    assert digests(tmp_path / "restored.json") == {k: original[k] for k in (3, 4)}


def test_an_isolated_rank_is_restored_beside_the_running_original(tmp_path):
    store, report = tmp_path / "store", tmp_path / "original.json"
    original = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "run", "--lockstep", "--world-size", "16",
         "--rank", "3", "--isolate", "--snapshot-at", "2", "--store", str(store), "--report",
         str(report), "--run-dir", str(tmp_path / "run"), "--", sys.executable,
         str(Path(__file__).resolve().parents[1] / "scripts" / "train_forever.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in store.glob("r3-*") if (p / "manifest.json").exists()]:
            assert original.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        (snapshot_id,) = [p.name for p in store.glob("r3-*")]
        proc, restored = restore(store, snapshot_id, tmp_path, "--iterations", "2")
        assert proc.returncode == 0, proc.stderr
        assert original.poll() is None  # the original ran on all along
        while len(_iterations(tmp_path / "run")) < 4:
            time.sleep(0.1)
    finally:
        original.send_signal(signal.SIGTERM)
        original.communicate(timeout=60)
    assert digests(restored) == {k: v for k, v in _iterations(tmp_path / "run").items()
                                 if k in (3, 4)}


def _iterations(run_dir: Path) -> dict[int, str]:
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
              if line.strip()]
    return {e["iteration"]: e["digest"] for e in events if e["kind"] == "iteration"}
