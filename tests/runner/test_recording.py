"""Snapshots recorded off the controller's loop, with real CRIU and a real rank.

One in-process run of a small bundled example takes a snapshot after every
iteration (``--snapshot-every 1 --incremental``).  The store's commit is the
real one, patched in this process only: the first snapshot's takes 3 s
longer (a slow disk), and the third's is refused as on a full disk (ENOSPC).
The rank must not wait for a record (the next snapshot's handshake stays
short while the first is still being committed), every other snapshot must
be recorded in order on the right parent, and the run's result lists them.
"""

from __future__ import annotations

import errno
import json
import sys
import time

import pytest

from prism_debug import api
from prism_debug.snapshot.store import Store
from tests.runner.test_lazy_restore import SMALL
from tests.runner.test_snapshots import EXAMPLE, cli, digests

pytestmark = pytest.mark.slow
SLOW_COMMIT_S = 3.0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recording")
    real_commit = Store.commit
    committing: list[int] = []

    def commit(store, staging, manifest):
        committing.append(manifest.iteration)
        if manifest.iteration == 1:
            time.sleep(SLOW_COMMIT_S)
        if manifest.iteration == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(staging))
        return real_commit(store, staging, manifest)

    lines: list[str] = []
    options = api.RunOptions(
        command=[sys.executable, str(EXAMPLE), *SMALL, "--iterations", "5"], rank=5,
        world_size=64, profile=api.load_profile("h100-ib400"), lockstep=True, snapshot_every=1,
        incremental=True,
        store=tmp / "store", run_dir=tmp / "run", report_path=tmp / "original.json")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Store, "commit", commit)
        result = api.run(options, lines.append)
    store = Store(tmp / "store")
    return tmp, result, lines, committing, {m.iteration: m for m in store.list()}


def test_back_to_back_snapshots_are_all_recorded_in_order_on_their_parents(recorded):
    tmp, result, lines, committing, manifests = recorded
    assert result.exit_code == 0
    assert committing == [1, 2, 3, 4, 5]  # one at a time, in the order dumped
    assert sorted(manifests) == [1, 2, 4, 5]
    # the run's result lists them in order, once recorded
    assert result.snapshots == [manifests[k].id for k in (1, 2, 4, 5)]
    # the chain goes on past the snapshot that was lost, from the last recorded
    assert [manifests[k].parent for k in (1, 2, 4, 5)] == [
        None, manifests[1].id, manifests[2].id, manifests[4].id]
    # nothing but the recorded snapshots is left in the store (no staging)
    assert sorted(p.name for p in (tmp / "store").iterdir()) == sorted(result.snapshots)
    said = [line for line in lines if line.startswith("snapshot ")]
    assert [line.split()[1].rstrip(":") for line in said] == result.snapshots


@pytest.mark.serial  # a handshake under a second, on the wall clock
def test_the_rank_does_not_wait_for_the_previous_snapshots_record(recorded):
    _, _, _, _, manifests = recorded
    second = manifests[2].phases
    # the second snapshot was dumped while the first was still being
    # committed (3 s more), and its own record waited for the first's
    assert second["handshake"] < 1.0, second
    assert second["queued"] > SLOW_COMMIT_S / 2, second
    assert second["pause"] < 1.0 + second["criu"], second


def test_a_record_the_disk_refuses_costs_that_snapshot_only(recorded):
    tmp, result, lines, _, _ = recorded
    (warning,) = [line for line in lines if "warning" in line]
    staging = f"{tmp / 'store'}/.tmp-r5-it3-"
    assert warning.startswith("prism-debug: warning: no snapshot at iteration 3: [Errno 28] No "
                              f"space left on device: '{staging}"), warning
    assert sorted(digests(tmp / "original.json")) == [1, 2, 3, 4, 5]  # the run went on


def test_the_deepest_increment_restores_the_original_digests(recorded):
    tmp, _, _, _, manifests = recorded
    original = digests(tmp / "original.json")
    report = tmp / "restored.json"
    proc = cli("snapshot", "restore", manifests[4].id, "--store", str(tmp / "store"),
               "--report", str(report), "--run-dir", str(tmp / "restored"), "--no-bus")
    assert proc.returncode == 0, proc.stderr
    assert digests(report) == {5: original[5]}
    assert json.loads(report.read_text())["restored_from"] == manifests[4].id
