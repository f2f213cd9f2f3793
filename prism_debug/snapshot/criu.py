"""CRIU through its Python bindings (pycriu): find it, check it, dump, restore.

CRIU ≥ 4.1 is needed (older releases fail on kernels ≥ 6.13 with
"Unexpected rt vDSO area bounds").  The checkout's own set-up
(``tools/provision_criu.sh``, run by ``make``) provides one in ``.prism/criu``
when the system has none; ``PRISM_DEBUG_CRIU`` names another.  pycriu's
errors carry an errno only, so failures quote CRIU's own log.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from prism_debug.errors import CriuError

SOURCE_ROOT = Path(__file__).resolve().parents[2]
PRIVATE_CRIU = SOURCE_ROOT / ".prism" / "criu" / "bin" / "criu"
ENV_VAR = "PRISM_DEBUG_CRIU"
MIN_VERSION = (4, 1)
FIX = ("run `make test` or `bash tools/provision_criu.sh .venv/bin/python` in the prism-debug "
       "checkout (it unpacks Debian 13's criu into .prism/criu), or install criu >= 4.1 and "
       "python3-pycriu")


@dataclasses.dataclass(frozen=True)
class Criu:
    binary: Path
    version: tuple[int, ...]

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))


def locate() -> Criu:
    """The CRIU to use, or :class:`CriuError` naming the fix.

    ``$PRISM_DEBUG_CRIU`` when set (and then only it), else the checkout's
    own (``.prism/criu``), else ``criu`` on PATH."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        candidates = [Path(explicit)]
    else:
        candidates = [PRIVATE_CRIU] + [Path(p) for p in [shutil.which("criu")] if p]
    found = []
    for binary in candidates:
        if not os.access(binary, os.X_OK):
            if explicit:
                raise CriuError(f"${ENV_VAR} names {binary}, which is not an executable: "
                                f"point it at criu >= 4.1, or unset it to use the checkout's")
            continue
        version = _version(binary)
        if version is not None and version >= MIN_VERSION:
            return Criu(binary, version)
        found.append(f"{binary} ({'.'.join(map(str, version)) if version else 'does not run'})")
    if found:
        raise CriuError(f"CRIU is too old or broken: {', '.join(found)}; prism-debug needs "
                        f"criu >= {'.'.join(map(str, MIN_VERSION))}: {FIX}")
    raise CriuError(f"CRIU is not installed: {FIX}")


def _version(binary: Path) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(g) for g in match.groups() if g is not None) if match else None


def check(criu: Criu) -> tuple[bool, str]:
    """``criu check``: whether this kernel and these privileges let CRIU work."""
    proc = subprocess.run([str(criu.binary), "check"], capture_output=True, text=True,
                          timeout=60)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else f"exit code {proc.returncode}"


def tracks_memory(criu: Criu) -> tuple[bool, str]:
    """Whether the kernel tracks written pages (soft-dirty bits), which
    incremental dumps need."""
    proc = subprocess.run([str(criu.binary), "check", "--feature", "mem_dirty_track"],
                          capture_output=True, text=True, timeout=60)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    detail = lines[-1].split(":", 2)[-1].strip() if lines else f"exit code {proc.returncode}"
    return proc.returncode == 0, detail


@functools.cache
def lazy_pages(criu: Criu) -> tuple[bool, str]:
    """Whether this kernel and these privileges let CRIU restore lazily:
    userfaultfd with the non-cooperative events (``uffd-noncoop``: a restored
    process that forks or unmaps tells the page daemon).  Asked once per
    process (a subprocess costs ~30 ms, a restore asks every time)."""
    try:
        proc = subprocess.run([str(criu.binary), "check", "--feature", "uffd-noncoop"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"criu check --feature uffd-noncoop failed: {exc}"
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode == 0, lines[-1] if lines else f"exit code {proc.returncode}"


CUDA_ENV_VAR = "PRISM_DEBUG_CUDA_CHECKPOINT"


def cuda_checkpoint() -> Path:
    """NVIDIA's cuda-checkpoint utility (``$PRISM_DEBUG_CUDA_CHECKPOINT``, else PATH)."""
    named = os.environ.get(CUDA_ENV_VAR) or shutil.which("cuda-checkpoint")
    if not named or not os.access(named, os.X_OK):
        raise CriuError("the rank uses CUDA, and snapshots of CUDA state need NVIDIA's "
                        "cuda-checkpoint (driver >= 570) on PATH or in "
                        f"${CUDA_ENV_VAR}: https://github.com/NVIDIA/cuda-checkpoint")
    return Path(named)


def cuda_action(tool: Path, action: str, pid: int) -> None:
    """One cuda-checkpoint step — lock, checkpoint, restore or unlock — on ``pid``."""
    proc = subprocess.run([str(tool), "--action", action, "--pid", str(pid)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise CriuError(f"cuda-checkpoint --action {action} --pid {pid} failed: "
                        f"{detail[-1] if detail else f'exit code {proc.returncode}'}")


def pycriu():
    """The pycriu module, or :class:`CriuError` naming the fix."""
    try:
        import pycriu as module
    except ImportError as exc:
        raise CriuError(f"pycriu (CRIU's Python bindings) is not importable ({exc}): {FIX}") \
            from None
    return module


def _client(criu: Criu, images_dir: Path, work_dir: Path, log_file: str):
    module = pycriu()
    client = module.criu()
    client.use_binary(str(criu.binary))  # pycriu 4.1 does not search PATH
    fds = [os.open(images_dir, os.O_DIRECTORY), os.open(work_dir, os.O_DIRECTORY)]
    client.opts.images_dir_fd, client.opts.work_dir_fd = fds
    client.opts.log_file = log_file  # in work_dir
    client.opts.log_level = 4
    client.opts.shell_job = False
    client.opts.file_locks = True
    return client, fds


def dump(criu: Criu, pid: int, images_dir: Path, *, leave_running: bool = True,
         parent: Path | None = None, track_mem: bool = False) -> None:
    """Dump the process tree rooted at ``pid`` into ``images_dir`` (its log
    beside the images, as ``dump.log``)."""
    client, fds = _client(criu, images_dir, images_dir, "dump.log")
    try:
        client.opts.pid = pid
        client.opts.leave_running = leave_running
        client.opts.track_mem = track_mem
        if parent is not None:
            # relative to the images directory, as criu's --prev-images-dir
            client.opts.parent_img = os.path.relpath(parent, images_dir)
        client.dump()
    except Exception as exc:  # pycriu raises its own exception classes, errno only
        raise CriuError(f"criu dump of pid {pid} failed: "
                        f"{_log_error(images_dir / 'dump.log', exc)}",
                        log=images_dir / "dump.log") from None
    finally:
        for fd in fds:
            os.close(fd)


def restore(criu: Criu, images_dir: Path, work_dir: Path, inherit: dict[str, int], *,
            lazy: bool = False) -> int:
    """Restore the process tree in ``images_dir`` as a child of this process
    (its log in ``work_dir``, as ``restore.log``; the images stay untouched).
    ``inherit`` maps a file the process had open — its path without the
    leading ``/`` — to an open descriptor here that replaces it.  ``lazy``:
    memory comes from the ``criu lazy-pages`` daemon listening in
    ``work_dir`` (``snapshot/lazy.py`` starts it) as the process touches it.
    Returns the pid."""
    client, fds = _client(criu, images_dir, work_dir, "restore.log")
    try:
        client.opts.rst_sibling = True
        client.opts.lazy_pages = lazy
        for key, descriptor in inherit.items():
            os.set_inheritable(descriptor, True)  # criu swrk is a child of this process
            entry = client.opts.inherit_fd.add()
            entry.key = key
            entry.fd = descriptor
        return client.restore().pid
    except Exception as exc:
        raise CriuError(f"criu restore failed: {_log_error(work_dir / 'restore.log', exc)}",
                        log=work_dir / "restore.log") from None
    finally:
        for fd in fds:
            os.close(fd)


def tree_pids(images_dir: Path) -> set[int]:
    """The pids and thread ids a restore of ``images_dir`` takes in this pid
    namespace: none when the tree's root was a pid namespace's init (the
    restore makes a namespace of its own)."""
    images = pycriu().images
    try:
        with open(images_dir / "pstree.img", "rb") as f:
            entries = images.load(f)["entries"]
    except Exception as exc:  # pycriu raises its own classes for a damaged image
        raise CriuError(f"cannot read {images_dir / 'pstree.img'}: {exc}") from None
    if entries and entries[0]["pid"] == 1:
        return set()
    return {pid for entry in entries for pid in [entry["pid"], *entry.get("threads", ())]}


_TASK_ERROR = re.compile(r"^\(\s*[\d.]+\)\s+\d+: Error \(")
_ERROR_AT = re.compile(r"^.*?Error \([^)]*\):")


def _log_error(log: Path, exc: Exception) -> str:
    """CRIU's first error line (its log says what pycriu's errno does not)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    errors = [line for line in lines if "Error (" in line]
    # a restored task's own error is the cause; CRIU's (a refused rlimit …)
    # may come first and be survived
    errors = [line for line in errors if _TASK_ERROR.match(line)] or errors
    detail = _ERROR_AT.sub("", errors[0]).strip() if errors else str(exc)
    return f"{detail} (log: {log})"
