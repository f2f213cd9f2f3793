"""A rank's process: the forms it takes (a plain child, the init of its own
pid namespace, a copy CRIU restored), its files, and relaying its output
and events (the loop that waits for the ranks is the controller's:
``controller/follow.py``).

The rank runs in its own session (CRIU needs that), with stdin from
/dev/null and its output in an append-only file the controller relays, so a
snapshot can be cut at any iteration boundary without changing how ranks
are launched.

The rank dies with its controller: it is started with the kernel's
parent-death signal set to SIGKILL (``PR_SET_PDEATHSIG``), so a controller
killed outright — even by SIGKILL, which no handler sees — takes its rank
along instead of leaving it running orphaned (or idling at a snapshot
nobody will finish).  The setting survives ``exec`` and CRIU keeps it in
its images, so restored copies (children of the controller that restored
them) die with that controller too.  Under ``--isolate`` the controller's
child is ``unshare``, whose ``--kill-child`` passes the death on to the rank.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from prism_debug.process import report as reporting

# how often the controller looks at the rank's output and events: a rank
# announcing a snapshot idles until then (50 ms was a seventh of a 1 GiB dump)
POLL_S = 0.01


class RankProcess(Protocol):
    """The rank's process, whichever way it was started."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the rank's process group."""

    def kill(self) -> None:
        """End the rank for good and reap it."""

    def hold(self, held: bool) -> None:
        """Freeze the rank's process group, or let it go on."""

    def process_ids(self) -> set[int]:
        """The pids and thread ids the rank's process tree holds now."""


def run_files(run_dir: Path) -> dict[str, Path]:
    """The files a run's rank writes and reads, fresh, by role (a snapshot's
    manifest records them by these roles, so a restore can swap them)."""
    files = {"log": run_dir / "rank.log", "events": run_dir / "events.jsonl",
             "control": run_dir / "control.json"}
    for path in files.values():
        path.unlink(missing_ok=True)
        # made here, 0600 whatever the umask: the rank's output is the user's alone
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    files["control"].write_text("{}")
    return files


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_controller() -> Callable[[], None]:
    """A ``preexec_fn`` for the rank's process: SIGKILL when the controller dies.

    Bound to the calling thread (the kernel signals a child when the thread
    that forked it exits): start ranks from the controller's main thread.
    Made before the fork, so the child only makes a system call."""
    controller = os.getpid()
    prctl = _libc.prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != controller:  # it died before the setting took hold
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


class _RankProcess:
    """What every form of the rank does alike: signals go to its process group,
    and a kill is SIGKILL then a reap."""

    @property
    def pid(self) -> int:
        raise NotImplementedError

    def wait(self) -> int:
        raise NotImplementedError

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signum)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.wait()

    def hold(self, held: bool) -> None:
        """Freeze the rank's process group (SIGSTOP) or let it go on (SIGCONT):
        while a copy is restored beside it, so that only one of them runs.
        Sent directly: an isolated rank's :meth:`signal` would turn them into
        SIGKILL.  A controller that dies meanwhile takes the frozen rank along
        (its parent-death signal is SIGKILL, which ends a stopped process)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGSTOP if held else signal.SIGCONT)

    def process_ids(self) -> set[int]:
        """The pids and thread ids the rank's process tree holds now."""
        found: set[int] = set()
        todo = [self.pid]
        while todo:
            pid = todo.pop()
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            found.add(pid)
            found.update(tids)
            for tid in tids:
                with contextlib.suppress(OSError):
                    todo += [int(c) for c in
                             Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
        return found


class Child(_RankProcess):
    """The rank as a plain child process."""

    def __init__(self, popen: subprocess.Popen) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self) -> int:
        return self._popen.wait()


class IsolatedChild(_RankProcess):
    """The rank behind ``unshare``: waited for through it, signalled and dumped
    as itself (the namespace's init, seen from here)."""

    def __init__(self, unshare: subprocess.Popen) -> None:
        self._unshare = unshare
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        if self._pid is None:
            deadline = time.monotonic() + 30
            while self._pid is None:
                try:
                    children = Path(f"/proc/{self._unshare.pid}/task/{self._unshare.pid}/"
                                    "children").read_text().split()
                except OSError:
                    children = []
                if children:
                    self._pid = int(children[0])
                elif self._unshare.poll() is not None or time.monotonic() > deadline:
                    return self._unshare.pid
                else:
                    time.sleep(0.001)
        return self._pid

    def poll(self) -> int | None:
        return self._unshare.poll()

    def wait(self) -> int:
        return self._unshare.wait()

    def signal(self, signum: int) -> None:
        # A namespace's init only receives the signals it handles (SIGINT, in
        # Python), and SIGKILL and SIGSTOP from outside: stop it by force.
        super().signal(signum if signum == signal.SIGINT else signal.SIGKILL)


class RestoredChild(_RankProcess):
    """A copy of the rank CRIU restored as this process's child (``rst_sibling``);
    ``isolated``: the init of a pid namespace of its own, signalled as
    :class:`IsolatedChild` is."""

    def __init__(self, pid: int, isolated: bool = False) -> None:
        self._pid = pid
        self.isolated = isolated
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self._pid

    def signal(self, signum: int) -> None:
        super().signal(signum if signum == signal.SIGINT or not self.isolated
                       else signal.SIGKILL)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while (code := self.poll()) is None:
            time.sleep(0.01)
        return code


def continue_rank(pid: int) -> None:
    """SIGCONT: a restored copy of a rank dumped while stopped goes on (the
    images of snapshots taken before CRIU froze ranks by itself hold a
    stopped process); harmless to a running one."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


# -- following the rank ---------------------------------------------------------------------


class Relay(Protocol):
    """Where a rank's follower sends what the rank says: its output (to the
    debugger bus, or nowhere) and its requests for snapshots."""

    def output(self, line: str) -> None:
        """A line of the rank's output."""

    def take_snapshot(self, event: dict) -> None:
        """The rank idles at a boundary for a snapshot: dump it and let it go."""


class Follower:
    """Relays the rank's output and prints a table row per finished iteration;
    the output goes to the session too (the bus), and snapshot requests."""

    def __init__(self, log_path: Path, events_path: Path, rank: int,
                 message: Callable[[str], None], session: Relay,
                 table_prefix: str = "") -> None:
        self._log = Tail(log_path)
        self._events = Tail(events_path)
        self._prefix = f"[rank {rank}] "
        self._table_prefix = table_prefix  # several ranks' tables interleave: say whose
        self._message = message
        self._header_shown = False
        self._session = session

    def poll(self, final: bool = False, snapshots: bool = True) -> None:
        """Relay what the rank wrote since (``final``: it has exited);
        ``snapshots``: pass its requests for snapshots on too."""
        for line in self._log.lines(final):
            self._message(self._prefix + line)
            self._session.output(line)
        for line in self._events.lines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("kind") == "iteration":
                if not self._header_shown:
                    self._message(self._table_prefix + reporting.table_header())
                    self._header_shown = True
                self._message(self._table_prefix + reporting.table_row(event))
            elif event.get("kind") == "snapshot" and snapshots and not final:
                self._session.take_snapshot(event)


class Tail:
    """Complete lines appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._offset = 0
        self._partial = b""

    def lines(self, final: bool = False) -> list[str]:
        """``final``: the writer has exited, so an unterminated last line is complete."""
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if final and self._partial:
            complete.append(self._partial)
            self._partial = b""
        return [line.decode("utf-8", "replace") for line in complete]
