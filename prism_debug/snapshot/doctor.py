"""``prism-debug doctor``: is this machine ready for snapshots?  Each check
says what it found and, when it fails, what to do."""

from __future__ import annotations

import dataclasses
import os
import platform
import shutil
import subprocess

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
        tracked, detail = criu_api.tracks_memory(criu)
        checks.append(Check("memory tracking", tracked, detail if not tracked else "soft-dirty",
                            "without CONFIG_MEM_SOFT_DIRTY, --incremental dumps every page and "
                            "then keeps only those that differ from the parent snapshot's "
                            "(slower dumps, the same increments)",
                            optional=True))
    try:
        module = criu_api.pycriu()
    except criu_api.CriuError:
        checks.append(Check("pycriu", False, "not importable", criu_api.FIX))
    else:
        checks.append(Check("pycriu", True, os.path.dirname(module.__file__)))
    checks.append(_gpu_check())
    return checks


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
