"""Faults of the harness itself, with real parts: a real ``prism-debug run``
controller, a real rank, real CRIU, real consoles on the bus.  Each fault
must lose nothing: no rank left stopped or orphaned, no partial snapshot
shown, no console request held up by a restore's checks, no running rank
given up to a restore that fails."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prism_debug.bus import sessions
from prism_debug.bus.client import BusClient
from prism_debug.bus.protocol import BusError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_gpt.py"
SCRIPTS = ROOT / "tests" / "scripts"
pytestmark = pytest.mark.slow

# The controller with its control-file writes failing as on a full disk
# (ENOSPC): patched in the controller's process only, the rank is untouched.
FULL_DISK_CONTROLLER = """
import errno, runpy, sys
from prism_debug.capture import snapshots
def write_control(path, content):
    raise OSError(errno.ENOSPC, "No space left on device", str(path))
snapshots.write_control = write_control
sys.argv[0] = "prism-debug"
runpy.run_module("prism_debug.cli", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(autouse=True)
def session_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(sessions.ENV_VAR, str(tmp_path / "sessions"))


def start(tmp_path: Path, *options: str, script: Path, args: tuple[str, ...] = (),
          world_size: int = 16, rank: int = 3,
          controller: tuple[str, ...] = ("-m", "prism_debug.cli")) -> subprocess.Popen:
    """``prism-debug run`` in the background (lockstep peers), its output in files."""
    command = [sys.executable, *controller, "run", "--lockstep", "--world-size",
               str(world_size), "--rank", str(rank), "--run-dir", str(tmp_path / "run"),
               "--store", str(tmp_path / "store"), "--report", str(tmp_path / "report.json"),
               *options, "--", sys.executable, str(script), *args]
    return subprocess.Popen(command, stdin=subprocess.DEVNULL,
                            stdout=open(tmp_path / "out.txt", "w"),
                            stderr=open(tmp_path / "err.txt", "w"))


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("}")]


def wait_for(condition, timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:g} s"
        time.sleep(every_s)
    return value


def state(pid: int) -> str | None:
    """The process's state letter (R, S, T, t, Z …), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``, with its command line."""
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        try:
            tids = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                children = Path(f"/proc/{parent}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                try:
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(
                        b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                todo.append(child)
    return found


def gone(pids) -> bool:
    return all(state(pid) in (None, "Z") for pid in pids)


def kill_leftovers(pids) -> None:
    for pid in pids:
        if state(pid) not in (None, "Z"):
            os.kill(pid, signal.SIGKILL)


def snapshot_ids(store: Path) -> list[str]:
    return sorted(p.name for p in store.glob("r*") if (p / "manifest.json").exists())


def session_info(run: subprocess.Popen) -> sessions.SessionInfo:
    def connected():
        live = sessions.live_sessions()
        if live:
            with BusClient.for_session(live[0]) as client:
                if client.request("status")["state"] != "starting":
                    return live[0]
        assert run.poll() is None, "the run ended"
        return None
    return wait_for(connected, 120, "session on the bus")


# -- the controller dies -------------------------------------------------------------


def test_a_controller_killed_mid_dump_leaves_no_stopped_rank_and_no_snapshot(tmp_path):
    # SIGKILLed while CRIU is dumping the rank: before, the rank had been
    # SIGSTOPped for the dump and stayed stopped for ever
    run = start(tmp_path, "--snapshot-at", "2", script=EXAMPLE, world_size=64, rank=5,
                args=("--tp", "2", "--pp", "2", "--iterations", "5"))
    below: dict[int, str] = {}
    try:
        def dumping():
            nonlocal below
            below = descendants(run.pid)
            assert run.poll() is None, "the run ended before its snapshot"
            return any(" swrk " in line for line in below.values())  # pycriu's criu
        wait_for(dumping, 180, "CRIU dump", every_s=0.001)
        run.kill()
        run.wait()
        rank = next(e["pid"] for e in events(tmp_path / "run") if e["kind"] == "snapshot")
        assert rank in below
        wait_for(lambda: gone(below), 10, "end of the rank and CRIU")
        assert state(rank) != "T"
        listing = subprocess.run([sys.executable, "-m", "prism_debug.cli", "snapshot", "ls",
                                  "--store", str(tmp_path / "store")],
                                 capture_output=True, text=True, timeout=60)
        assert listing.stdout == f"no snapshots in {tmp_path / 'store'}\n"
    finally:
        run.kill()
        kill_leftovers(below)


@pytest.mark.parametrize("isolate", [False, True], ids=["plain", "isolated"])
def test_the_rank_dies_with_its_controller(tmp_path, isolate):
    run = start(tmp_path, *(["--isolate"] if isolate else []), script=SCRIPTS / "train_forever.py")
    below: dict[int, str] = {}
    try:
        wait_for(lambda: len([e for e in events(tmp_path / "run")
                              if e["kind"] == "iteration"]) >= 2, 120, "two iterations")
        below = descendants(run.pid)
        assert any("train_forever.py" in line for line in below.values())
        run.send_signal(signal.SIGKILL)  # no handler can pass anything on
        run.wait()
        wait_for(lambda: gone(below), 5, "end of the orphaned rank")
    finally:
        run.kill()
        kill_leftovers(below)


def test_a_restored_copy_dies_with_its_controller(tmp_path):
    run = start(tmp_path, "--snapshot-at", "1", script=SCRIPTS / "train_forever.py")
    try:
        (snapshot_id,) = wait_for(lambda: snapshot_ids(tmp_path / "store"), 120, "snapshot")
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=60)
    restore = subprocess.Popen(
        [sys.executable, "-m", "prism_debug.cli", "snapshot", "restore", snapshot_id, "--store",
         str(tmp_path / "store"), "--run-dir", str(tmp_path / "again")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    below: dict[int, str] = {}
    try:
        wait_for(lambda: len([e for e in events(tmp_path / "again")
                              if e["kind"] == "iteration"]) >= 1, 60, "restored iteration")
        below = descendants(restore.pid)
        assert below
        restore.send_signal(signal.SIGKILL)
        restore.wait()
        wait_for(lambda: gone(below), 5, "end of the orphaned copy")
    finally:
        restore.kill()
        kill_leftovers(below)


# -- the control file cannot be written -----------------------------------------------


@pytest.mark.parametrize("fault", ["immutable", "full_disk"])
def test_a_control_file_that_cannot_be_written_still_lets_the_rank_go(tmp_path, fault):
    # immutable: a real failing write (EPERM, even for root); full_disk: the
    # controller's writes raise ENOSPC (patched in the controller only)
    control = tmp_path / "run" / "control.json"
    if fault == "immutable":
        if os.geteuid() != 0 or shutil.which("chattr") is None:
            pytest.skip("making a file immutable needs root and chattr")
        controller = ("-m", "prism_debug.cli")
    else:
        controller = ("-c", FULL_DISK_CONTROLLER)
    run = start(tmp_path, "--snapshot-at", "2", script=SCRIPTS / "train_steps.py",
                args=("--iterations", "4"), controller=controller)
    try:
        if fault == "immutable":
            wait_for(control.exists, 60, "control file", every_s=0.001)
            made = subprocess.run(["chattr", "+i", str(control)], capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(f"chattr +i fails here: {made.stderr.strip()}")
        try:
            code = run.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("the run never finished: its rank was left waiting at the snapshot")
    finally:
        if fault == "immutable":
            subprocess.run(["chattr", "-i", str(control)], capture_output=True)
        if run.poll() is None:
            left = descendants(run.pid)
            run.kill()
            kill_leftovers(left)
    out = (tmp_path / "out.txt").read_text()
    assert code == 0, out + (tmp_path / "err.txt").read_text()
    why = "Operation not permitted" if fault == "immutable" else "No space left on device"
    warning = next(line for line in out.splitlines() if "control file" in line)
    assert warning == (f"prism-debug: warning: cannot write the rank's control file {control} "
                       f"([Errno {1 if fault == 'immutable' else 28}] {why}: '{control}'); "
                       "letting it go by its release signal")
    report = json.loads((tmp_path / "report.json").read_text())
    assert [it["iteration"] for it in report["iterations"]] == [1, 2, 3, 4]
    # the snapshot was still recorded, after the rank went on
    (snapshot_id,) = snapshot_ids(tmp_path / "store")
    assert snapshot_id.startswith("r3-it2-")


# -- restores -------------------------------------------------------------------------


def test_a_slow_restore_check_holds_up_no_console_request(tmp_path):
    run = start(tmp_path, "--snapshot-at", "1", script=SCRIPTS / "train_forever.py")
    try:
        info = session_info(run)
        (snapshot_id,) = wait_for(lambda: snapshot_ids(tmp_path / "store"), 120, "snapshot")
        # half a GiB more to checksum (a sparse file: no disk), whose checksum
        # is wrong: the restore's checks read it all, then refuse the snapshot
        folder = tmp_path / "store" / snapshot_id
        with open(folder / "zz-pad.img", "wb") as f:
            f.truncate(512 << 20)
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["files"]["zz-pad.img"] = "0" * 64
        (folder / "manifest.json").write_text(json.dumps(manifest))
        answer: list = []

        def restore():
            with BusClient.for_session(info) as client:
                try:
                    answer.append(client.request("restore", timeout_s=120, id=snapshot_id))
                except BusError as exc:
                    answer.append(exc)
        restoring = threading.Thread(target=restore)
        with BusClient.for_session(info) as console:
            pid = console.request("status")["pid"]
            restoring.start()
            time.sleep(0.3)  # the checks are under way
            started = time.monotonic()
            breakpoint = console.request("break", timeout_s=1.0, kind="iter",
                                         iteration=10**6)
            status = console.request("status", timeout_s=1.0)
            served_s = time.monotonic() - started
            assert not answer  # still checking
            restoring.join(timeout=120)
            assert breakpoint == {"id": 1, "description": "iteration 1000000"}
            assert status["state"] == "running" and status["pid"] == pid
            assert served_s < 1.0
            (refused,) = answer
            assert isinstance(refused, BusError)
            assert str(refused) == (f"snapshot {snapshot_id} is damaged: image zz-pad.img does "
                                    "not match its checksum")
            # the rank runs on, with its breakpoint
            after = console.request("status")
            assert (after["state"], after["pid"], after["breakpoints"]) == ("running", pid, 1)
            assert after["iteration"] > status["iteration"] or wait_for(
                lambda: console.request("status")["iteration"] > status["iteration"], 10,
                "iteration after the refused restore")
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)


def test_a_failed_restore_leaves_the_rank_running_and_a_good_one_replaces_it(tmp_path):
    held = tmp_path / "held.txt"
    held.write_text("size at the dump\n")
    run = start(tmp_path, "--isolate", "--snapshot-at", "1",
                script=SCRIPTS / "train_holding_a_file.py", args=(str(held),))
    try:
        info = session_info(run)
        (snapshot_id,) = wait_for(lambda: snapshot_ids(tmp_path / "store"), 120, "snapshot")
        with BusClient.for_session(info) as console:
            pid = console.request("status")["pid"]
            with open(held, "a") as f:  # CRIU refuses to restore a file of another size
                f.write("grown since\n")
            with pytest.raises(BusError) as failed:
                console.request("restore", timeout_s=60, id=snapshot_id)
            # the rank was not given up to it
            before = console.request("status")
            assert (before["state"], before["pid"]) == ("running", pid)
            wait_for(lambda: console.request("status")["iteration"] > before["iteration"], 10,
                     "iteration after the failed restore")
            assert "held.txt has bad size 29 (expect 17)" in str(failed.value)
            assert str(failed.value).endswith("; the rank runs on as it was")
            held.write_text("size at the dump\n")
            restored = console.request("restore", timeout_s=60, id=snapshot_id)
            assert restored["id"] == snapshot_id and restored["iteration"] == 1
            after = console.request("status")
            assert (after["state"], after["iteration"]) == ("paused", 2)
        assert run.poll() is None
    finally:
        run.send_signal(signal.SIGTERM)
        run.communicate(timeout=60)
    out = (tmp_path / "out.txt").read_text()
    assert f"prism-debug: restored snapshot {snapshot_id} (after iteration 1)" in out
