"""``prism-debug doctor`` agrees with what snapshots do here (issue 15, point 7).

Before issue 15 doctor quoted CRIU's "Dirty tracking is OFF. Memory snapshot
will not work." on this machine, where snapshots (and incremental ones) work,
and said nothing of a CRIU that passes ``criu check`` but cannot dump.  Its
verdict now rests on a real dump and restore: these tests hold it against a
real snapshot and restore of a rank, a missing CRIU, and a CRIU that cannot
dump.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "train_steps.py"
WORKS = "snapshots work here: a test process was dumped and restored with CRIU"


def cli(*args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run([sys.executable, "-m", "prism_debug.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                          env=None if env is None else os.environ | env)


def checks(stdout: str) -> dict[str, tuple[str, str]]:
    """check name -> (mark, detail), from doctor's lines."""
    found = {}
    for line in stdout.splitlines():
        mark, _, rest = line.partition(" ")
        name, sep, detail = rest.strip().partition(": ")
        if mark in ("ok", "FAIL", "--") and sep:
            found[name] = (mark, detail)
    return found


@pytest.mark.slow
def test_doctor_says_snapshots_work_where_a_real_snapshot_and_restore_do(tmp_path):
    doctor = cli("doctor")
    # reality: a rank snapshotted after iteration 1 and restored, with the
    # original's digests for the iterations after it
    store = tmp_path / "store"
    run = cli("run", "--lockstep", "--world-size", "2", "--rank", "1", "--snapshot-at", "1",
              "--incremental", "--snapshot-every", "1", "--store", str(store),
              "--report", str(tmp_path / "run.json"), "--run-dir", str(tmp_path / "run"), "--",
              sys.executable, str(SCRIPT), "--iterations", "3")
    assert run.returncode == 0, run.stdout + run.stderr
    snapshots = sorted(p.name for p in store.iterdir())
    assert len(snapshots) == 3  # a full one after iteration 1, increments after 2 and 3
    first = next(s for s in snapshots if "-it1-" in s)
    restore = cli("snapshot", "restore", first, "--store", str(store), "--report",
                  str(tmp_path / "restored.json"), "--run-dir", str(tmp_path / "restored"))
    assert restore.returncode == 0, restore.stdout + restore.stderr

    def digests(path):
        return {i["iteration"]: i["digest"] for i in json.loads(path.read_text())["iterations"]}
    original, restored = digests(tmp_path / "run.json"), digests(tmp_path / "restored.json")
    assert restored == {i: original[i] for i in (2, 3)}
    # … and doctor says so, with nothing that says otherwise
    assert doctor.returncode == 0, doctor.stdout
    assert doctor.stdout.splitlines()[-1] == WORKS
    assert "will not work" not in doctor.stdout
    found = checks(doctor.stdout)
    assert found["dump and restore"][0] == "ok"
    assert found["dump and restore"][1].startswith("a test process dumped and restored in ")
    assert found["incremental snapshots"][0] == "ok"
    assert not [name for name, (mark, _) in found.items() if mark == "FAIL"]


def test_without_criu_doctor_says_snapshots_will_not_work_and_what_to_do(tmp_path):
    missing = tmp_path / "no-criu"
    doctor = cli("doctor", env={"PRISM_DEBUG_CRIU": str(missing)})
    assert doctor.returncode == 1
    found = checks(doctor.stdout)
    assert found["criu"] == ("FAIL", f"$PRISM_DEBUG_CRIU names {missing}, which is not an "
                                     "executable")
    assert "dump and restore" not in found  # nothing to try it with
    assert doctor.stdout.splitlines()[-1] == (
        f"snapshots will not work here: criu: $PRISM_DEBUG_CRIU names {missing}, which is not "
        "an executable; fix: run `make test` or `bash tools/provision_criu.sh .venv/bin/python` "
        "in the prism-debug checkout (it unpacks Debian 13's criu into .prism/criu), or install "
        "criu >= 4.1 and python3-pycriu")


def test_a_criu_that_passes_its_check_but_cannot_dump_is_caught(tmp_path):
    # a criu that reports a good version and a good `criu check`, and fails
    # anything else: the checks alone would call this machine ready
    fake = tmp_path / "criu"
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Version: 4.1.1" && exit 0\n'
                    '[ "$1" = check ] && echo "Looks good." && exit 0\nexit 1\n')
    fake.chmod(0o755)
    doctor = cli("doctor", env={"PRISM_DEBUG_CRIU": str(fake)})
    assert doctor.returncode == 1, doctor.stdout
    found = checks(doctor.stdout)
    assert found["criu check"] == ("ok", "Looks good.")
    mark, detail = found["dump and restore"]
    assert mark == "FAIL" and detail.startswith("criu dump of pid "), detail
    verdict = doctor.stdout.splitlines()[-1]
    assert verdict.startswith("snapshots will not work here: dump and restore: criu dump of "
                              "pid ")
    assert verdict.endswith("; fix: see CRIU's log named above; `criu check --all` lists what "
                            "the kernel lacks (a container may need --privileged, or "
                            "CAP_CHECKPOINT_RESTORE and CAP_SYS_ADMIN)")
