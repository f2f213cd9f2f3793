"""``prism-debug doctor``: is this machine ready for snapshots?  Each check
says what it found and, when it fails, what to do; the verdict rests on a
real CRIU dump and restore of a small process, so it says what a snapshot
would do here rather than what a kernel feature list suggests."""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from prism_debug.snapshot import criu as criu_api


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False  # not needed for CPU ranks


def run_checks() -> list[Check]:
    checks = [Check("kernel", True, f"Linux {platform.release()} ({platform.machine()})")]
    root = os.geteuid() == 0
    checks.append(Check(
        "privileges", root, "root" if root else f"uid {os.geteuid()}",
        "CRIU dumps and restores need root (or CAP_CHECKPOINT_RESTORE and CAP_SYS_ADMIN): "
        "run prism-debug as root"))
    try:
        criu = criu_api.locate()
    except criu_api.CriuError as exc:
        checks.append(Check("criu", False, str(exc).split(":")[0], criu_api.FIX))
    else:
        checks.append(Check("criu", True, f"{criu.version_text} at {criu.binary}"))
        ok, line = criu_api.check(criu)
        checks.append(Check("criu check", ok, line,
                            "see `criu check --all`; kernels >= 6.13 need criu >= 4.1"))
        tracked, _ = criu_api.tracks_memory(criu)
        # not a prerequisite: without soft-dirty bits --incremental compares
        # pages itself (snapshot/incremental.py), so CRIU's own "Memory
        # snapshot will not work" (its track_mem mode) is no verdict on ours
        checks.append(Check(
            "incremental snapshots", True,
            "CRIU tracks written pages (soft-dirty)" if tracked else
            "by page comparison: this kernel has no soft-dirty page tracking, so --incremental "
            "dumps every page and keeps those that differ from the parent snapshot's (same "
            "increments, slower dumps)"))
    try:
        module = criu_api.pycriu()
    except criu_api.CriuError:
        checks.append(Check("pycriu", False, "not importable", criu_api.FIX))
    else:
        checks.append(Check("pycriu", True, os.path.dirname(module.__file__)))
    if all(c.ok for c in checks if not c.optional):
        checks.append(_trial(criu))
    checks.append(_gpu_check())
    return checks


def verdict(checks: list[Check]) -> str:
    """One line: do snapshots work here, and if not, the first thing to fix."""
    failed = [c for c in checks if not c.ok and not c.optional]
    if not failed:
        return "snapshots work here: a test process was dumped and restored with CRIU"
    first = failed[0]
    return (f"snapshots will not work here: {first.name}: {first.detail}"
            + (f"; fix: {first.fix}" if first.fix else ""))


def _trial(criu: criu_api.Criu) -> Check:
    """Dump a small process with CRIU, restore it, and see it run: the one
    check that cannot disagree with what ``--snapshot-at`` will meet."""
    name = "dump and restore"
    sleeper = shutil.which("sleep")
    if sleeper is None:
        return Check(name, False, "no `sleep` on PATH to try a dump on", "install coreutils")
    started = time.perf_counter()
    restored = None
    # kept when the trial fails: the error names CRIU's log in it
    folder = tempfile.mkdtemp(prefix="prism-doctor-")
    images, work = Path(folder, "images"), Path(folder, "work")
    images.mkdir()
    work.mkdir()
    # started as ranks are: its own session, no terminal, nothing inherited
    proc = subprocess.Popen([sleeper, "120"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        criu_api.dump(criu, proc.pid, images, leave_running=False)
        proc.wait(timeout=30)  # CRIU ended it after the dump: its pid is free again
        restored = criu_api.restore(criu, images, work, {})
        alive = Path(f"/proc/{restored}/cmdline").read_bytes().split(b"\0")[0]
    except (criu_api.CriuError, OSError, subprocess.SubprocessError) as exc:
        return Check(name, False, str(exc),
                     "see CRIU's log named above; `criu check --all` lists what the kernel "
                     "lacks (a container may need --privileged, or CAP_CHECKPOINT_RESTORE "
                     "and CAP_SYS_ADMIN)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if restored is not None:
            try:
                os.kill(restored, signal.SIGKILL)
                os.waitpid(restored, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    shutil.rmtree(folder, ignore_errors=True)
    if alive != sleeper.encode() and not alive.endswith(b"sleep"):
        return Check(name, False, f"the restored process runs {alive!r}, not sleep",
                     "report this with CRIU's restore.log")
    return Check(name, True, f"a test process dumped and restored in "
                             f"{time.perf_counter() - started:.2f} s")


def _gpu_check() -> Check:
    """GPU ranks also need NVIDIA's checkpoint utility (driver >= 570)."""
    tool = shutil.which("cuda-checkpoint")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Check("gpu checkpoint", False, "no NVIDIA GPU here (CPU ranks only)",
                     "for CUDA ranks: NVIDIA driver >= 570 and cuda-checkpoint on PATH",
                     optional=True)
    try:
        driver = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20).stdout.split()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        driver = "unknown"
    major = int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0
    ok = tool is not None and major >= 570
    return Check("gpu checkpoint", ok,
                 f"driver {driver}, cuda-checkpoint {'at ' + tool if tool else 'not found'}",
                 "NVIDIA driver >= 570 and cuda-checkpoint on PATH "
                 "(https://github.com/NVIDIA/cuda-checkpoint)", optional=True)
