"""CRIU's lazy pages: a restored rank runs before its memory is all back.

A lazy restore leaves the process's private memory empty and registers it
with userfaultfd; a ``criu lazy-pages`` daemon answers each page fault from
the images and, meanwhile, copies every other page in the background, then
exits by itself (exit code 0).  The rank so runs within tens of
milliseconds whatever its size; the pages it touches first cost a fault
each (≈ 0.3 s/GiB when it touches everything at once).

pycriu's RPC has no request for the daemon, so it is a subprocess of this
process, started before the restore in the restore's own work directory
(its socket, ``lazy-pages.socket``, is how the restore finds it; its log is
``lazy-pages.log`` beside the restore's).  This module owns it:

* **Start** waits for the socket with a deadline; a daemon that does not come
  up is killed and reaped, and the caller restores eagerly instead.
* **After the restore** a watcher thread reaps the daemon when it is done.
  The daemon holds the only copy of the pages the rank has not touched yet:
  if it dies early or overruns its deadline, the pages it never delivered
  would read as zeros (the kernel drops the registration with the daemon's
  descriptor), so the watcher ends the rank too and says why in the rank's
  log.  When the rank ends first, the daemon is given a moment, then killed.
* **The images must not change while the daemon lives.**  It opens them as
  the restore starts, so removing the snapshot (``snapshot rm``: unlink)
  leaves the open files readable to it; rewriting them in place would not.

Only snapshots without a parent are restored lazily: CRIU 4.1's daemon spins
for ever on prism-debug's incremental chains (the restored process stays at
2 MB; measured in the issue's research), so a chain is restored eagerly.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prism_debug.errors import CriuError
from prism_debug.snapshot import criu as criu_api

SOCKET = "lazy-pages.socket"
LOG = "lazy-pages.log"
START_DEADLINE_S = 10.0  # for the daemon's socket (it appears in ~10 ms)
# after the rank ends, for the daemon to notice and leave by itself
GRACE_S = 2.0


# the daemons this process watches (its children): a controller about to
# report a restored run's end reaps them first (:func:`reap`)
_watched: set[LazyPages] = set()
_watched_lock = threading.Lock()


def reap(timeout_s: float = GRACE_S + 1.0) -> None:
    """Wait until every daemon this process started is reaped (each watcher
    ends its daemon within :data:`GRACE_S` once the rank it served ended)."""
    with _watched_lock:
        daemons = list(_watched)
    ends = time.monotonic() + timeout_s
    for daemon in daemons:
        daemon.join(max(0.0, ends - time.monotonic()))


def transfer_deadline(image_bytes: int) -> float:
    """How long the daemon may take to deliver every page: fifty times what it
    took on a 2-core VM (0.4 s/GiB), and never under a minute."""
    return max(60.0, 20.0 * image_bytes / 2**30)


class LazyPages:
    """One ``criu lazy-pages`` daemon serving one restore's images."""

    def __init__(self, process: subprocess.Popen, work_dir: Path) -> None:
        self.process = process
        self.log = work_dir / LOG
        self._watcher: threading.Thread | None = None
        self.outcome: str | None = None  # how it ended, once it has

    @classmethod
    def start(cls, criu: criu_api.Criu, images_dir: Path, work_dir: Path, *,
              deadline_s: float = START_DEADLINE_S,
              preexec_fn: Callable[[], None] | None = None) -> LazyPages:
        """The daemon for ``images_dir``, listening in ``work_dir`` (the
        restore's), or :class:`CriuError` with its log's first error."""
        socket = work_dir / SOCKET
        socket.unlink(missing_ok=True)  # an earlier restore's, into the same run folder
        (work_dir / LOG).unlink(missing_ok=True)
        try:
            process = subprocess.Popen(
                [str(criu.binary), "lazy-pages", "-D", str(images_dir), "-W", str(work_dir),
                 "-o", LOG, "-v2"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, preexec_fn=preexec_fn)
        except OSError as exc:
            raise CriuError(f"cannot start criu lazy-pages: {exc}") from None
        daemon = cls(process, work_dir)
        ends = time.monotonic() + deadline_s
        while not socket.exists():
            if process.poll() is not None:
                daemon.outcome = f"exit code {process.returncode}"
                raise CriuError(f"criu lazy-pages exited (code {process.returncode}) before "
                                f"listening: {_first_error(daemon.log)}", log=daemon.log)
            if time.monotonic() > ends:
                daemon.stop()
                raise CriuError(f"criu lazy-pages did not listen within {deadline_s:g} s "
                                f"(log: {daemon.log})", log=daemon.log)
            time.sleep(0.002)
        return daemon

    def stop(self) -> None:
        """Kill and reap the daemon (no rank depends on it: a failed restore)."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.outcome = self.outcome or "killed"
        (self.log.parent / SOCKET).unlink(missing_ok=True)

    def watch(self, pid: int, notice: Path, deadline_s: float) -> None:
        """Reap the daemon in the background once the rank ``pid`` (restored
        from its pages) no longer needs it; end the rank if the daemon fails it
        (``notice``: the rank's log, where the user reads why)."""
        rank = os.pidfd_open(pid)  # race-free signals: the pid may be reaped and reused
        with _watched_lock:
            _watched.add(self)
        self._watcher = threading.Thread(target=self._watch, args=(rank, notice, deadline_s),
                                         name="prism-lazy-pages", daemon=False)
        self._watcher.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the watcher (the daemon reaped) — a controller about to leave."""
        if self._watcher is not None:
            self._watcher.join(timeout_s)

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def _watch(self, rank: int, notice: Path, deadline_s: float) -> None:
        ends = time.monotonic() + deadline_s
        try:
            while True:
                try:
                    code = self.process.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    code = None
                rank_gone = bool(select.select([rank], [], [], 0)[0])
                if code is not None:
                    self.outcome = f"exit code {code}"
                    if code != 0:  # (said even where the zeros crashed the rank first)
                        self._end_rank(rank, notice, f"the lazy-pages daemon failed (exit code "
                                       f"{code}, log: {self.log})")
                    return
                if rank_gone:
                    try:
                        self.outcome = f"exit code {self.process.wait(timeout=GRACE_S)}"
                    except subprocess.TimeoutExpired:
                        self.stop()
                        self.outcome = "killed after the rank ended"
                    return
                if time.monotonic() > ends:
                    self.stop()
                    self.outcome = f"killed at its {deadline_s:g} s deadline"
                    self._end_rank(rank, notice, f"the lazy-pages daemon overran its "
                                   f"{deadline_s:g} s deadline (log: {self.log})")
                    return
        finally:
            os.close(rank)
            (self.log.parent / SOCKET).unlink(missing_ok=True)  # it leaves it behind
            with _watched_lock:
                _watched.discard(self)

    def _end_rank(self, rank: int, notice: Path, why: str) -> None:
        # pages it never delivered would read as zeros: the rank must not go on
        try:  # said first, in the log its follower relays while the rank lives
            with open(notice, "a") as f:
                f.write(f"prism-debug: error: {why} before every page of the restored rank's "
                        "memory arrived: the rank cannot go on (the missing pages would read "
                        "as zeros); restore it again with --eager\n")
        except OSError:
            pass
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(rank, signal.SIGKILL)
        if self.process.poll() is None:
            self.stop()


def _first_error(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return f"no log ({log})"
    errors = [line for line in lines if "Error" in line]
    return f"{(errors or lines or ['an empty log'])[0].strip()} (log: {log})"
